"""Loading printed Triton kernels: the module file in the kernel cache, imported once per process.

A :class:`~plait.codegen.triton_text.TritonSource` is written to ``cache_dir()/triton/<sha256>.py``
(the SHA-256 of the source: a file whose bytes do not hash to its name is rewritten; writes are
atomic, a temporary file then ``os.replace``), imported under a name derived from the hash, with
its global ``M`` bound before the module runs: libdevice (``triton.language.extra.cuda``) for
compiled kernels, the numpy shim :mod:`plait.codegen.triton_interp` when Triton interprets
(``TRITON_INTERPRET=1``). Triton is imported only here, on the first load, so ``import plait``
needs no Triton.

``load_triton`` returns ``launch(*tensors)``: one tensor per kernel buffer, in buffer order, each
one's ``data_ptr`` element 0 of its buffer. A launch binds nothing but the tensors: the grid,
``num_warps`` and compile options are fixed when the kernel is loaded. A symbolic kernel's
launch is ``launch(*tensors, *sizes)``, the values of its size atoms (``TritonSource.sizes``)
after the tensors: its grid is computed from them at each launch (none for an empty domain).
Kernels run without floating-point contraction (``enable_fp_fusion=False``): each statement
rounds as its IR op does.

``precompile`` compiles a program's kernels before their first launch, several at once: Triton's
own ``warmup`` with the launch's pointer dtypes and options, under Triton's ``AsyncCompileMode``
(Triton >= 3.5) on a thread pool (the compiler's passes and ``ptxas`` release the GIL). The
binaries land in Triton's on-disk cache (``TRITON_CACHE_DIR``), keyed by the source, the
signature and the options: the first launch then finds them in memory, and a later process on
the same cache loads them from disk and compiles nothing.

Example:
    >>> interpreting() in (True, False)
    True
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from plait.codegen import triton_pool
from plait.codegen.build import cache_dir
from plait.codegen.triton_text import TritonSource
from plait.triton_worker import load_module

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
    if hit is None:
        name = f"plait_triton_{digest[:32]}" + ("_interpreted" if interpret else "")
        hit = _MODULES[key] = _import(source, digest, name)
    return hit


def _fresh_module(source: str) -> ModuleType:
    """A new instance of ``source``'s module, not kept: its kernels have no compiled state in
    memory, so each compile goes to Triton's cache (what gathering carried kernels needs)."""
    digest = _digest(source)
    return _import(source, digest, f"plait_triton_{digest[:32]}_fresh{next(_FRESH)}")


_FRESH = itertools.count(1)


def torch_ptxas(torch_dir: Path | None = None) -> None:
    """Point Triton at the ``ptxas`` PyTorch ships (``TRITON_PTXAS_PATH``, where unset and
    where PyTorch has one), before plait's first Triton compile: inductor does the same at its
    first compile, and Triton keys every kernel by the ``ptxas`` version it read at its own
    first compile. Without this, a process where inductor compiled before plait and one where
    it compiled after key plait's kernels differently, and a warm start compiles them again."""
    if interpreting() or os.environ.get("TRITON_PTXAS_PATH"):
        return
    if torch_dir is None:
        import torch

        torch_dir = Path(torch.__file__).parent
    ptxas = torch_dir / "bin" / "ptxas"
    if ptxas.is_file() and os.access(ptxas, os.X_OK):
        os.environ["TRITON_PTXAS_PATH"] = str(ptxas)


@functools.cache
def torch_ptxas_once() -> None:
    """:func:`torch_ptxas`, once per process."""
    torch_ptxas()


def _import(source: str, digest: str, name: str) -> ModuleType:
    torch_ptxas_once()  # NOTE: before the first module: its kernels compile with that ptxas
    return load_module(str(_publish(source, digest)), name, _math_module(interpreting()))


def _options(ts: TritonSource) -> dict[str, Any]:
    """The compile options of every launch of ``ts`` (part of Triton's cache key)."""
    return {"num_warps": ts.num_warps, "enable_fp_fusion": False}


def precompile(
    kernels: Sequence[tuple[TritonSource, Sequence[Any]]],
    device: Any,
    jobs: int,
    *,
    fresh: bool = False,
) -> dict[str, Any]:
    """Compile ``kernels`` (each printed kernel with its launch's tensor dtypes, in buffer
    order; a symbolic kernel's size arguments at their hints, which its binary does not
    specialize on) for CUDA ``device``, up to ``jobs`` at once; returns what happened, for the
    manifest: ``{"kernels": n, "jobs": j, "parallel": bool, "seconds": s}``. Kernels over
    empty domains and interpreted kernels compile nothing. A launch whose tensors are not
    16-byte aligned (a view at an odd offset) specializes differently and compiles at that
    launch. ``fresh``: each kernel compiled from a new instance of its module, through Triton's
    cache even when this process compiled it before (:mod:`plait.codegen.triton_carry`)."""
    todo = [(ts, [*dtypes, *ts.hints]) for ts, dtypes in kernels if 0 not in ts.grid]
    record: dict[str, Any] = {"kernels": len(todo), "jobs": 1, "parallel": False, "seconds": 0.0}
    if not todo or interpreting():
        return record
    import torch

    t0 = time.perf_counter()
    unique = {ts.source: (ts, dtypes) for ts, dtypes in todo}.values()
    with torch.cuda.device(device):
        load = _fresh_module if fresh else _module
        warm = [(getattr(load(ts.source), ts.symbol), ts, dtypes) for ts, dtypes in unique]

        def compile_one(item: tuple[Any, TritonSource, Sequence[Any]]) -> Any:
            fn, ts, dtypes = item
            return fn.warmup(*dtypes, grid=ts.grid, **_options(ts))

        mode = _async_mode()
        workers = max(1, min(jobs, len(warm)))
        try:
            if mode is None or workers == 1:
                compiled = [compile_one(item) for item in warm]
            else:
                with ThreadPoolExecutor(workers) as local:
                    pooled = None if fresh else triton_pool.pooled_mode(local, workers, device)
                    # NOTE: each submits its compile; the mode's exit waits for all
                    with pooled or mode(local):
                        compiled = [compile_one(item) for item in warm]
                        if pooled is not None:
                            pooled.dispatch()
                record.update(jobs=workers, parallel=True)
                if pooled is not None:
                    _pool_record(record, pooled)
            record["launchers_seconds"] = _load_ahead(compiled, device, workers)
        except Exception as exc:  # NOTE: a Triton without this warmup API, say
            # NOTE: never silent: the kernels then compile one by one at their first launch
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
            warnings.warn(
                f"plait: Triton kernels could not be compiled ahead of their first launch "
                f"({record['error']}); each compiles at its first launch instead",
                RuntimeWarning,
                stacklevel=2,
            )
    record["seconds"] = time.perf_counter() - t0
    return record


def _pool_record(record: dict[str, Any], pooled: Any) -> None:
    """What the worker processes did, into ``record``; their failures warned about (each of
    those kernels was compiled by this process instead)."""
    record.update(pooled.record)
    errors = pooled.errors()
    if errors:
        record["worker_errors"] = errors[:8]
        warnings.warn(
            f"plait: {len(errors)} Triton kernel(s) compiled in this process after a compile "
            f"worker did not provide them: {errors[0][:300]}",
            RuntimeWarning,
            stacklevel=3,
        )


def _load_ahead(compiled: Sequence[Any], device: Any, workers: int) -> float:
    """Each compiled kernel's binary loaded and its launcher built, ``workers`` at once: Triton
    does both at a kernel's first launch, one by one, and on a cold cache each launcher
    signature is a C module its compiler builds (about a second for a model's kernels, the
    largest part of a CUDA graph's first capture). Returns the seconds it took."""
    import torch

    kernels = [k.result() if hasattr(k, "result") else k for k in compiled]
    kernels = [k for k in kernels if hasattr(k, "_init_handles")]
    start = time.perf_counter()

    def load(kernel: Any) -> None:
        with torch.cuda.device(device):
            kernel._init_handles()

    with ThreadPoolExecutor(max(1, min(workers, len(kernels)))) as pool:
        list(pool.map(load, kernels))  # NOTE: raises the first failure
    return time.perf_counter() - start


def _async_mode() -> Any:
    """Triton's ``AsyncCompileMode`` (compiles submitted to an executor), where it exists."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return None
    return AsyncCompileMode


def _nothing(*tensors: Any) -> None:
    """The launch of a kernel over an empty domain."""


def load_triton(ts: TritonSource) -> Callable[..., None]:
    """``launch(*tensors)`` for the printed kernel ``ts`` (see the module docstring)."""
    if ts.sizes:
        return _symbolic_launch(ts)
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
    options = _options(ts)

    def launch(*tensors: Any) -> None:
        run(*tensors, grid=grid, warmup=False, **options)

    return launch


def _symbolic_launch(ts: TritonSource) -> Callable[..., None]:
    """``launch(*tensors, *sizes)`` of a symbolic kernel: its grid from the sizes."""
    run = getattr(_module(ts.source), ts.symbol).run
    count = len(ts.sizes)
    programs = ts.programs
    options: dict[str, Any] = {} if interpreting() else _options(ts)
    if interpreting():
        import numpy as np

        def interpret(*args: Any) -> None:
            n = programs(args[-count:])
            if n:
                with np.errstate(all="ignore"):
                    run(*args, grid=(n,), warmup=False)

        return interpret

    def launch(*args: Any) -> None:
        n = programs(args[-count:])
        if n:
            run(*args, grid=(n,), warmup=False, **options)

    return launch
