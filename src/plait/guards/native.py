"""The native guard evaluator: :meth:`GuardSet.holds` compiled to C++ ops.

A guard that describes its read as data (``Guard.native``: module structure, training flags,
tensor signatures, frozen tensors' identity, version and storage, ambient settings, input types,
scalar arguments) becomes one op of a small C++ interpreter that reads tensors through their
``TensorImpl`` and dicts through CPython's API; any other guard becomes an op that calls its
Python read. The ops run in the guards' order and stop at the first that fails, as the Python
path does; what an op cannot decide natively (a tensor subclass, an error inside PyTorch) its
guard's Python read decides. Explanations are unchanged: they always use the Python reads.

The extension is built once per machine and toolchain (its sources' text, ``csrc/evaluator.cpp`` and
``csrc/torch_layout.h``; the C++ compiler and its version, the flags, PyTorch's and Python's
versions; content-addressed) with the system C++ compiler against PyTorch's headers, in about 1.5 s,
and loaded in later processes from ``$PLAIT_GUARDS_CACHE_DIR`` (default ``~/.cache/plait/guards``):
it depends on the installation, never on a program, so a fresh ``PLAIT_CACHE_DIR`` does not rebuild
it. Nothing is silent: where it cannot be built or loaded (no compiler, ``PLAIT_STAX_NO_COMPILE=1``
before it was built, ``PLAIT_NATIVE_GUARDS=0``), guards run in Python and :attr:`GuardSet.evaluator`
says why.

Example:
    >>> import torch
    >>> from plait.frontend import ModuleState
    >>> from plait.guards import GuardEnv, GuardSet
    >>> from plait.guards.state import StateFetcher, frozen_guards
    >>> lin = torch.nn.Linear(2, 2)
    >>> fetch = StateFetcher(ModuleState(lin))
    >>> guards = GuardSet(frozen_guards({"weight": 0}, fetch()), EVALUATORS)
    >>> guards.holds(GuardEnv((), [], lin, fetch()))
    True
    >>> guards.evaluator in ("native", status().reason)
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from plait.codegen import build
from plait.codegen.errors import BuildError
from plait.errors import NativeUnavailableError
from plait.guards.guard import (
    Guard,
    GuardEnv,
    ReadAttrs,
    ReadCall,
    ReadCalls,
    ReadEdges,
    ReadIdentity,
    ReadLeaf,
    ReadPyValues,
    ReadStructure,
    ReadTensors,
    TensorCheck,
    float_bits,
)
from plait.ir.private_files import publish_bytes

# NOTE: op codes and tensor-check flags, as the C++ source numbers them
(
    CALL, CALL0, CALLS0, STRUCTURE, TENSORS, EDGES, ATTRS, LEAF_VALUE, LEAF_IS, LEAF_BITS,
    PYVALUES, IDENTITY,
) = range(12)  # fmt: skip
F_ID, F_VERSION, F_PTR, F_META, F_SIZES, F_GRAD, F_SAMPLE = 1, 2, 4, 8, 16, 32, 64
FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-w")
SOURCES = ("evaluator.cpp", "torch_layout.h")  # NOTE: csrc/; the first is the translation unit
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # NOTE: read natively; any other: Python


@dataclass
class Status:
    """Whether the native evaluator is loaded, and how it got there."""

    available: bool = False
    reason: str = "not loaded yet"
    key: str = ""
    path: str = ""
    built: bool = False  # this process ran the compiler
    seconds: float = 0.0  # build or load time
    log: list[str] = field(default_factory=list)


_STATUS = Status()
_MODULE: list[ModuleType] = []
_LOCK = threading.Lock()


def status() -> Status:
    """The native evaluator's status in this process (loads it if no one tried yet)."""
    _load()
    return _STATUS


def cache_dir() -> Path:
    """Where the evaluator is built: :func:`plait.codegen.build.installation_dir`."""
    return build.installation_dir()


def sources() -> dict[str, str]:
    """The evaluator's C++ sources as shipped (``csrc/``, package data), by file name: the
    extension's ``evaluator.cpp`` and the header it includes, ``torch_layout.h`` (PyTorch's
    object layout). The build key hashes these texts, so an edit rebuilds the extension."""
    csrc = resources.files("plait.guards").joinpath("csrc")
    return {name: csrc.joinpath(name).read_text() for name in SOURCES}


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def include_flags() -> list[str]:
    """The preprocessor flags the extension is built with: PyTorch's ABI, Python's and
    PyTorch's include directories (as system directories: their warnings are not ours)."""
    include, _ = _torch_dirs()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-isystem",
        sysconfig.get_paths()["include"],
        "-isystem",
        str(include),
        "-isystem",
        str(include / "torch" / "csrc" / "api" / "include"),
    ]


def _command(source: Path, out: Path, cxx: str) -> list[str]:
    _, lib = _torch_dirs()
    return [
        cxx,
        *FLAGS,
        *include_flags(),
        str(source),
        "-o",
        str(out),
        f"-L{lib}",
        "-lc10",
        f"-Wl,-rpath,{lib}",
    ]


def build_key(cxx: str, version: str) -> str:
    """The extension's cache key: everything that decides its machine code."""
    parts = {
        "sources": sources(),
        "cxx": cxx,
        "cxx_version": version,
        "flags": list(FLAGS),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", ""),
        "cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)),
        "python": sys.version,
        # NOTE: the interpreter's ABI tag, as its extension suffix names it (sysconfig's SOABI
        # says the same, but loading sysconfig's data costs a warm start about 1 ms)
        "soabi": importlib.machinery.EXTENSION_SUFFIXES[0],
        "entry": 2,  # NOTE: the sidecar names the key: an earlier plait's file is not shared
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _compile(path: Path, cxx: str, key: str) -> Path:
    """Build the extension and publish it at ``path`` (:func:`plait.codegen.build.publish_library`:
    staged ``O_EXCL``, mode ``0700``, its sidecar naming its SHA-256 and ``key``); returns where
    it can be imported from: ``path``, or where it was built when the directory cannot keep it
    (warned once; the caller imports it before that temporary directory goes)."""
    if os.environ.get("PLAIT_STAX_NO_COMPILE") == "1":
        raise BuildError("not built: PLAIT_STAX_NO_COMPILE=1 forbids compiler invocations")
    tmp = Path(tempfile.mkdtemp(prefix="plait-guards-"))
    keep = False
    try:
        for name, text in sources().items():
            (tmp / name).write_text(text)
        src, out = tmp / SOURCES[0], tmp / "plait_guards.so"
        try:
            proc = subprocess.run(
                _command(src, out, cxx), capture_output=True, text=True, check=False, timeout=600
            )
        except subprocess.TimeoutExpired:
            raise BuildError("the C++ compiler ran for more than 600 s") from None
        if proc.returncode != 0:
            message = f"the C++ compiler failed:\n{proc.stderr[-2000:]}"
            # NOTE: recorded, so that later processes do not pay for the same failure
            with contextlib.suppress(OSError):
                publish_bytes(path.with_suffix(".failed"), message.encode())
            raise BuildError(message)
        try:
            build.publish_library(out.read_bytes(), path, key)
        except OSError as exc:
            where = path.parent
            build.report(
                f"could not keep the guard evaluator in {where} ({exc})", once=build.UNUSABLE
            )
            keep = True
            return out
        return path
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader("_plait_guards", str(path))
    spec = importlib.util.spec_from_file_location("_plait_guards", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sample = torch.empty(1)
    module.configure(_PLAIN_TYPES, torch.Tensor, sample, sample._cdata, torch.nn.Module)
    return module


def _load() -> ModuleType | None:
    """The extension, built if needed; None (and ``_STATUS.reason``) where it cannot be."""
    if _MODULE:
        return _MODULE[0]
    with _LOCK:
        if _MODULE or _STATUS.reason != "not loaded yet":
            return _MODULE[0] if _MODULE else None
        start = time.perf_counter()
        try:
            _MODULE.append(_build_and_import())
            _STATUS.available, _STATUS.reason = True, "native"
        except Exception as exc:  # NOTE: recorded: every GuardSet.evaluator says it
            _STATUS.reason = f"python: native evaluator unavailable ({type(exc).__name__}: {exc})"
        _STATUS.seconds = time.perf_counter() - start
    return _MODULE[0] if _MODULE else None


def _build_and_import() -> ModuleType:
    if os.environ.get("PLAIT_NATIVE_GUARDS", "1") == "0":
        raise NativeUnavailableError("disabled by PLAIT_NATIVE_GUARDS=0")
    tc = build.toolchain()
    key = build_key(tc.cxx, tc.version)
    path = cache_dir() / f"{key}.so"
    _STATUS.key, _STATUS.path = key, str(path)
    failed = path.with_suffix(".failed")
    if failed.exists():
        first = failed.read_bytes().decode("utf-8", "replace").splitlines()[:3]
        raise BuildError(f"an earlier build failed ({failed}; delete it to retry): {first}")
    existed = path.exists()
    if build.usable_entry(path, key):  # NOTE: its bytes, and the key it was built for, checked
        _STATUS.log.append("cache hit")
        return _import(path)
    if existed:  # NOTE: removed and warned by usable_entry (damaged, or another key's)
        _STATUS.log.append("discarded an entry that does not match its hash")
    built = _compile(path, tc.cxx, key)
    _STATUS.built = True
    _STATUS.log.append("built")
    try:
        return _import(built)
    finally:
        if built != path:
            shutil.rmtree(built.parent, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Guards to ops


class _Unsupported(Exception):
    """A read the ops cannot express: the guard's Python read runs instead."""


def _prototype(protos: dict[Any, torch.Tensor], dtype: Any, device: Any) -> torch.Tensor:
    """An empty tensor of ``dtype`` on ``device``: the C++ side takes both from it."""
    key = (dtype, device)
    if key not in protos:
        if not isinstance(dtype, torch.dtype) or not isinstance(device, torch.device):
            raise _Unsupported(f"dtype {dtype!r} on {device!r}")
        try:
            protos[key] = torch.empty(0, dtype=dtype, device=device)
        except Exception as exc:
            raise _Unsupported(f"{dtype} on {device}: {exc}") from None
        if type(protos[key]) is not torch.Tensor:
            raise _Unsupported(f"{dtype} on {device}: not a plain tensor")
    return protos[key]


def _check(c: TensorCheck, protos: dict[Any, torch.Tensor]) -> tuple[Any, ...]:
    flags = 0
    flags |= F_ID if c.identity is not None else 0
    flags |= F_VERSION if c.version is not None else 0
    flags |= F_PTR if c.data_ptr is not None else 0
    flags |= F_SIZES if c.shape is not None else 0
    flags |= F_GRAD if c.requires_grad is not None else 0
    s = c.sample
    if s is not None:
        if c.data_ptr != s.ptr or c.shape != s.shape or c.dtype != s.dtype:
            raise _Unsupported("a sample taken of another tensor than the check's")
        flags |= F_SAMPLE
    proto = None
    if c.dtype is not None or c.device is not None:
        flags |= F_META
        proto = _prototype(protos, c.dtype, c.device)
    if c.where not in ("leaf", "state"):
        raise _Unsupported(f"tensor at {c.where!r}")
    return (
        0 if c.where == "leaf" else 1,
        c.index,
        flags,
        c.identity or 0,
        c.version or 0,
        c.data_ptr or 0,
        proto,
        tuple(c.shape) if c.shape is not None else None,
        bool(c.requires_grad),
        None if s is None else (s.strides, s.offsets, s.size, s.digest),
    )


def _op(g: Guard, protos: dict[Any, torch.Tensor]) -> tuple[Any, ...]:
    n, head = g.native, (g.read, g.expected)
    if isinstance(n, ReadStructure):
        names = tuple("" if k == "tensor" else k for k in n.kinds)
        return (STRUCTURE, *head, n.spec, names, tuple(k == "tensor" for k in n.kinds))
    if isinstance(n, ReadTensors):
        return (TENSORS, *head, tuple(_check(c, protos) for c in n.checks))
    if isinstance(n, ReadEdges):
        if not all(type(t) is dict for t in n.tables):
            raise _Unsupported("a table that is not a dict")
        return (EDGES, *head, n.tables, n.keys, n.children)
    if isinstance(n, ReadAttrs):
        if not isinstance(g.expected, tuple) or len(g.expected) != len(n.objects):
            raise _Unsupported("attributes without a tuple of expected values")
        return (ATTRS, *head, n.objects, n.name)
    if isinstance(n, ReadCall):
        return (CALL0, *head, n.fn, n.exact)
    if isinstance(n, ReadCalls):
        want = g.expected if n.expected is None else n.expected
        if not isinstance(want, tuple) or len(want) != len(n.fns):
            raise _Unsupported("calls without a tuple of expected values")
        if n.expected is not None and n.exact:
            raise _Unsupported("exact calls with values of their own")
        return (CALLS0, *head, n.fns, want, n.exact)
    if isinstance(n, ReadIdentity):
        return (IDENTITY, *head, n.leaves, n.codes, n.state, n.held)
    if isinstance(n, ReadPyValues):
        return (PYVALUES, *head, n.checks, n.absent, n.rearm)
    if isinstance(n, ReadLeaf):
        if n.identity:
            return (LEAF_IS, *head, n.index, n.value)
        if n.bits:
            if not isinstance(n.value, float):
                raise _Unsupported("bits of a value that is not a float")
            return (LEAF_BITS, *head, n.index, type(n.value), float_bits(n.value))
        return (LEAF_VALUE, *head, n.index, type(n.value), n.value)
    return (CALL, *head)


def ops(guards: Sequence[Guard]) -> tuple[tuple[tuple[Any, ...], ...], int]:
    """The ops for ``guards`` (in order) and how many of them call the guard's Python read."""
    protos: dict[Any, torch.Tensor] = {}
    out, python = [], 0
    for g in guards:
        try:
            op = _op(g, protos)
        except _Unsupported:
            op = (CALL, g.read, g.expected)
        python += op[0] == CALL
        out.append(op)
    return tuple(out), python


class NativeEvaluators:
    """The native evaluator, as a :class:`~plait.guards.guard.GuardSet` is given it (see the
    module doc): ``compile`` builds or loads the extension at its first call, never at import."""

    def compile(self, guards: Sequence[Guard]) -> tuple[Callable[[GuardEnv], bool] | None, str]:
        module = _load()
        if module is None:
            return None, _STATUS.reason
        table, _ = ops(guards)
        return module.Evaluator(table), "native"


def fetcher(tables: Sequence[dict[str, Any]], keys: Sequence[str]) -> Callable[[], list] | None:
    """``fetch()``: ``[tables[i][keys[i]] ...]`` in one native pass; None without the
    extension."""
    module = _load()
    if module is None:
        return None
    return module.Fetcher(tuple(tables), tuple(keys))


def tensor_state(t: torch.Tensor) -> tuple[int, int]:
    """``(t._version, t.data_ptr())`` as the native evaluator reads them (for tests)."""
    module = _load()
    if module is None:
        raise NativeUnavailableError(_STATUS.reason)
    return module.tensor_state(t)


# NOTE: stateless; plait.api passes it to the guard sets of its specializations (nothing here
# registers it: a GuardSet made without it runs its guards' Python reads)
EVALUATORS = NativeEvaluators()
