"""Loading printed Triton kernels: the module file in the kernel cache, imported once per process.

A :class:`~plait.codegen.triton.TritonSource` is written to ``cache_dir()/triton/<sha256>.py``
(the SHA-256 of the source: a file whose bytes do not hash to its name is rewritten; writes are
atomic, a temporary file then ``os.replace``), imported under a name derived from the hash, with
its global ``M`` bound before the module runs: libdevice (``triton.language.extra.cuda``) for
compiled kernels, the numpy shim :mod:`plait.codegen.triton_interp` when Triton interprets
(``TRITON_INTERPRET=1``). Triton is imported only here, on the first load, so ``import plait``
needs no Triton.

``load_triton`` returns ``launch(*tensors)``: one tensor per kernel buffer, in buffer order, each
one's ``data_ptr`` element 0 of its buffer. A launch binds nothing but the tensors: the grid,
``num_warps`` and compile options are fixed when the kernel is loaded. Kernels run without
floating-point contraction (``enable_fp_fusion=False``): each statement rounds as its IR op does.

Example:
    >>> interpreting() in (True, False)
    True
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from plait.codegen.build import cache_dir
from plait.codegen.triton import TritonSource

_MODULES: dict[tuple[str, bool], ModuleType] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``), on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _publish(source: str, digest: str) -> Path:
    """The module file for ``source`` in the cache, written (atomically) where missing or
    corrupt."""
    folder = cache_dir() / "triton"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{digest}.py"
    data = source.encode()
    try:
        if hashlib.sha256(path.read_bytes()).hexdigest() == digest:
            return path
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{digest[:16]}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _math_module(interpret: bool) -> Any:
    if interpret:
        from plait.codegen import triton_interp

        return triton_interp
    from triton.language.extra.cuda import libdevice

    return libdevice


def _module(source: str) -> ModuleType:
    interpret = interpreting()
    digest = _digest(source)
    key = (digest, interpret)
    hit = _MODULES.get(key)
    if hit is not None:
        return hit
    path = _publish(source, digest)
    name = f"plait_triton_{digest[:32]}" + ("_interpreted" if interpret else "")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.M = _math_module(interpret)  # type: ignore[attr-defined]
    # NOTE: registered before it runs: Triton's jit reads the function's module for its source.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _MODULES[key] = module
    return module


def _nothing(*tensors: Any) -> None:
    """The launch of a kernel over an empty domain."""


def load_triton(ts: TritonSource) -> Callable[..., None]:
    """``launch(*tensors)`` for the printed kernel ``ts`` (see the module docstring)."""
    if 0 in ts.grid:
        return _nothing
    kernel = getattr(_module(ts.source), ts.symbol)
    run = kernel.run
    grid = ts.grid
    if interpreting():
        import numpy as np

        def interpret(*tensors: Any) -> None:
            # NOTE: the interpreter computes with numpy: infinities and NaNs are results, not
            # errors (a GPU raises nothing either).
            with np.errstate(all="ignore"):
                run(*tensors, grid=grid, warmup=False)

        return interpret
    num_warps = ts.num_warps

    def launch(*tensors: Any) -> None:
        run(*tensors, grid=grid, warmup=False, num_warps=num_warps, enable_fp_fusion=False)

    return launch
