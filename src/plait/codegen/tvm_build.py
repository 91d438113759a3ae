"""Building TVM kernels: TVMScript to an LLVM shared library for the host CPU, in the kernel
cache, loaded with the C++ kernels' calling convention.

Each kernel (:mod:`plait.codegen.tvm_script`) is parsed, scheduled
(:mod:`plait.codegen.tvm_schedule`, or tuned by MetaSchedule, :mod:`plait.codegen.tvm_tune`),
compiled by TVM's LLVM backend for this CPU and linked with a small C function of the C++
kernels' signature, ``int symbol(void* const* args)`` (one data pointer per buffer): it
describes each buffer as a ``DLTensor`` (static shapes, the kernel's own) and calls the TVM
function through its C ABI, so the Stax runner calls TVM and C++ kernels alike, with no Python in
between. TVM's argument checks are compiled out: the descriptors are built from the kernel's
buffers. Its parallel loops run on TVM's thread pool (``TVM_NUM_THREADS``, else
``OMP_NUM_THREADS``, else the cores).

A kernel's cache key is the SHA-256 of its TVMScript text, the printer's and the schedule's
versions, TVM's version, the target (LLVM triple and CPU) and this CPU's feature flags, the C
compiler that links it, and the tuning trials asked for; the library is published in the kernel
cache (:func:`plait.codegen.build.cache_dir`, under ``tvm/``) with its SHA-256 sidecar, and a
tuned kernel's MetaSchedule log beside it (``<key>.tuning.json``: a later compile with the log
but not the library applies the log's best schedule without tuning again).

Example:
    >>> tvm_available() in (True, False)
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.codegen.build import (
    STATS,
    UNUSABLE,
    cache_dir,
    cpu_info,
    publish_library,
    report,
    toolchain,
    usable_entry,
)
from plait.codegen.errors import BuildError, CodegenError
from plait.codegen.tvm_schedule import SCHEDULE_VERSION, default_schedule
from plait.codegen.tvm_script import PRINTER_VERSION, TvmSource
from plait.errors import InternalCompilerError
from plait.ir.private_files import private_subdir, publish_bytes
from plait.progress import shown

# NOTE: bump when the C function around a TVM kernel changes (its calling convention, the
# parallel launch): part of every kernel's key
CALL_VERSION = "plait-tvm-call-2"
INSTALL_HINT = "pip install plait[tvm] (Apache TVM: pip install apache-tvm)"
_LOCK = threading.Lock()
# NOTE: key -> (TVM's module, the ctypes library): both stay loaded for the process
_LOADED: dict[str, tuple[Any, ctypes.CDLL]] = {}
_TUNING: dict[str, dict[str, Any]] = {}  # NOTE: key -> the tuning record of a loaded kernel


class TvmMissingError(CodegenError):
    """TVM kernels were asked for where Apache TVM is not installed."""


def tvm_available() -> bool:
    """Whether Apache TVM can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("tvm") is not None
    except (ImportError, ValueError):  # NOTE: a module set to None, a broken parent
        return False


def require_tvm() -> Any:
    """The ``tvm`` module; raises :class:`TvmMissingError` saying how to install it."""
    if not tvm_available():
        raise TvmMissingError(
            f"TVM kernels need Apache TVM, which is not installed: {INSTALL_HINT}"
        )
    _size_thread_pool()
    import tvm

    return tvm


def _size_thread_pool() -> None:
    """TVM's thread pool (what tuning measures candidates with, in this process) runs as many
    threads as the C++ kernels' OpenMP (PyTorch's thread count, a guard of every compiled
    program), not TVM's guess (half the logical CPUs: one on a 2-CPU machine). TVM reads
    ``TVM_NUM_THREADS`` once, when its pool starts; a value the user set is kept. Threads decide
    speed only: each parallel iteration computes the same."""
    import torch

    os.environ.setdefault("TVM_NUM_THREADS", str(max(1, torch.get_num_threads())))


@functools.cache
def tvm_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        return str(require_tvm().__version__)


@functools.cache
def host_target() -> dict[str, Any]:
    """TVM's LLVM target for this CPU: the host triple (its vendor as ``unknown``: TVM's LLVM
    refuses a CPU name under other vendors) and the CPU LLVM detects."""
    require_tvm()
    from tvm.target import codegen

    arch, _, rest = str(codegen.llvm_get_system_triple()).partition("-")
    system = rest.partition("-")[2] or "linux-gnu"
    return {
        "kind": "llvm",
        "mtriple": f"{arch}-unknown-{system}",
        "mcpu": codegen.llvm_get_system_cpu(),
    }


def toolchain_record() -> dict[str, Any]:
    """What the manifest records about TVM kernels' toolchain (and their keys name)."""
    return {
        "tvm": tvm_version(),
        "target": host_target(),
        "printer": PRINTER_VERSION,
        "schedule": SCHEDULE_VERSION,
        "call": CALL_VERSION,
    }


@dataclass
class TvmKernel:
    """One TVM kernel to build: its printed source and how to schedule it (``tune``: MetaSchedule
    trials, 0 for the default schedule); after :func:`build_tvm_kernels`, its C symbol's
    library, build time, cache hit and tuning record."""

    source: TvmSource
    parallel_threshold: int
    tune: int = 0
    key: str = ""
    seconds: float = 0.0
    cache_hit: bool = False
    tuning: dict[str, Any] = field(default_factory=dict)
    lib: ctypes.CDLL | None = field(default=None, repr=False)

    @property
    def symbol(self) -> str:
        """The C function the runner calls."""
        return f"{self.source.symbol}_call"


def kernel_key(k: TvmKernel) -> str:
    tc = toolchain()
    parts = {
        "source": k.source.source,
        "parallel_threshold": k.parallel_threshold,
        "tune": k.tune,
        **toolchain_record(),
        "cpu_flags": cpu_info()[1],
        "cc": [tc.version],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _paths(key: str) -> tuple[Path, Path]:
    root = private_subdir(cache_dir(), "tvm", key[:2])
    return root / f"{key}.so", root / f"{key}.tuning.json"


def build_tvm_kernels(kernels: Sequence[TvmKernel], jobs: int | None = None) -> None:
    """Build (or load from the kernel cache) every kernel; identical ones once."""
    require_tvm()
    for k in kernels:
        k.key = kernel_key(k)
    todo: dict[str, TvmKernel] = {}
    for k in kernels:
        with _LOCK:
            hit = _LOADED.get(k.key)
        if hit is not None:
            k.lib, k.cache_hit, k.tuning = hit[1], True, dict(_TUNING.get(k.key, {}))
            STATS["memory_hits"] += 1
            continue
        todo.setdefault(k.key, k)
    tuned = sum(1 for k in todo.values() if k.tune)
    for k in shown(list(todo.values()), f"TVM kernels ({tuned} tuned)" if tuned else None):
        _build_one(k)
    for k in kernels:
        if k.lib is None:  # NOTE: a duplicate of a kernel built above
            k.lib, k.cache_hit, k.tuning = _LOADED[k.key][1], True, dict(_TUNING.get(k.key, {}))


def _build_one(k: TvmKernel) -> None:
    try:
        lib_path, log_path = _paths(k.key)
    except OSError as exc:
        report(f"could not use the TVM kernel cache ({exc})", once=UNUSABLE)
        lib_path = log_path = None  # type: ignore[assignment]
    if lib_path is not None and usable_entry(lib_path, k.key):
        _load(k, lib_path)
        k.cache_hit = True
        STATS["hits"] += 1
        if k.tune and log_path is not None and usable_entry(log_path, f"{k.key}.tuning"):
            k.tuning = cached_tuning(log_path.read_bytes(), k.tune)
        elif k.tune:  # NOTE: built with its default schedule (not tuned: no log was kept)
            k.tuning = {"trials": k.tune, "cache_hit": True, "chosen": "default"}
        return
    if os.environ.get("PLAIT_STAX_NO_COMPILE") == "1":
        raise BuildError("TVM build refused: PLAIT_STAX_NO_COMPILE=1 (cache miss)")
    start = time.perf_counter()
    log = None
    if k.tune and log_path is not None and usable_entry(log_path, f"{k.key}.tuning"):
        log = log_path.read_bytes()
    with tempfile.TemporaryDirectory(prefix="plait-tvm-") as tmp:
        out = Path(tmp) / "kernel.so"
        made_log = _compile(k, out, Path(tmp), log)
        STATS["compiles"] += 1
        if made_log is not None and log_path is not None:
            try:
                publish_bytes(log_path, made_log)
                publish_bytes(
                    log_path.with_suffix(".sha256"), _sidecar(made_log, f"{k.key}.tuning")
                )
            except OSError as exc:
                report(f"could not keep a TVM tuning log ({exc})", once=UNUSABLE)
        k.seconds = time.perf_counter() - start
        try:
            assert lib_path is not None
            publish_library(out.read_bytes(), lib_path, k.key)
        except (OSError, AssertionError) as exc:
            report(f"could not keep a TVM kernel ({exc})", once=UNUSABLE)
            _load(k, out)  # NOTE: loaded before tmp goes; the mapping outlives the file
            return
    _load(k, lib_path)


def cached_tuning(log: bytes, trials: int) -> dict[str, Any]:
    """The tuning record of a kernel found in the cache (its search ran in an earlier build)."""
    try:
        doc = json.loads(log)
    except ValueError:
        return {"trials": trials, "cache_hit": True}
    keep = ("chosen", "tuned_us", "default_us")
    return {"trials": trials, "cache_hit": True, **{k: doc.get(k) for k in keep}}


def _sidecar(data: bytes, key: str) -> bytes:
    return f"sha256 {hashlib.sha256(data).hexdigest()} key {key}\n".encode()


def _compile(k: TvmKernel, out: Path, tmp: Path, log: bytes | None) -> bytes | None:
    """Parse, schedule (or tune), compile and link ``k`` into ``out``; the tuning log made, if
    it tuned."""
    tvm = require_tvm()
    from tvm.script import tirx as T

    mod = tvm.script.from_source(k.source.source, extra_vars={"T": T})
    target = tvm.target.Target(host_target())
    made = None
    if k.tune and any("_vector" in name for name in k.source.blocks):
        # NOTE: MetaSchedule cannot serialize a vector block's broadcasts (its database)
        reason = "not tuned: a vector block (MetaSchedule cannot record its broadcasts)"
        k.tuning = {"trials": k.tune, "chosen": "default", "reason": reason}
        mod = default_schedule(mod, k.source, k.parallel_threshold)
    elif k.tune:
        from plait.codegen.tvm_tune import tuned_module

        try:
            mod, made, k.tuning = tuned_module(
                mod, target, k.source, k.parallel_threshold, k.tune, log, tmp / "tuning"
            )
        except Exception as exc:  # NOTE: recorded: the kernel runs its default schedule
            lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
            reason = f"MetaSchedule could not tune it: {type(exc).__name__}: "
            reason += next((x for x in lines if "rror" in x), lines[0] if lines else "")[:200]
            k.tuning = {"trials": k.tune, "chosen": "default", "reason": reason}
            mod = default_schedule(mod, k.source, k.parallel_threshold)
    else:
        mod = default_schedule(mod, k.source, k.parallel_threshold)
    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
        ex = tvm.compile(mod, target=target)
    if len(ex.mod.imports):
        raise BuildError(f"TVM kernel {k.source.symbol}: unexpected imported modules")
    obj = tmp / "kernel.o"
    ex.mod.write_to_file(str(obj))
    shim = tmp / "call.c"
    shim.write_text(shim_source(k.source, k.symbol))
    _link(out, [shim, obj])
    return made


def _link(out: Path, files: Sequence[Path]) -> None:
    import tvm_ffi.libinfo

    tc = toolchain()
    include = tvm_ffi.libinfo.find_include_path()
    dlpack = tvm_ffi.libinfo.find_dlpack_include_path()
    cmd = [tc.cxx, "-x", "c", "-O2", "-fPIC", "-shared", "-fopenmp", f"-I{include}", f"-I{dlpack}"]
    cmd += [str(files[0]), "-x", "none", *map(str, files[1:]), "-o", str(out), *tc.libs]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"linking a TVM kernel failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")


_DL = {"float": "kDLFloat", "int": "kDLInt", "uint": "kDLUInt"}
# NOTE: TVM's parallel loops run on OpenMP, the C++ kernels' (and PyTorch's) thread pool: the
# library's parallel-launch hook is pointed at this function once TVM has loaded it (_load).
# TVM's own pool would spin beside OpenMP's on the same cores (measured: kernels up to 10x
# slower when the two alternate) and guesses its size (half the logical CPUs).
PARALLEL_LAUNCH = "plait_parallel_launch"
_PARALLEL_LAUNCH = (
    "typedef struct { void* sync_handle; int32_t num_task; } PlaitParallelEnv;",
    "typedef int (*PlaitParallelTask)(int, PlaitParallelEnv*, void*);",
    f"int {PARALLEL_LAUNCH}(PlaitParallelTask task, void* data, int num_task) {{",
    "  int err = 0;",
    "  int want = num_task > 0 ? num_task : omp_get_max_threads();",
    "  #pragma omp parallel num_threads(want) reduction(|: err)",
    "  {",
    "    PlaitParallelEnv env;",
    "    env.sync_handle = 0;",
    "    env.num_task = omp_get_num_threads();",
    "    err |= task(omp_get_thread_num(), &env, data);",
    "  }",
    "  return err;",
    "}",
)


def _dl_dtype(storage: str) -> tuple[str, int]:
    for prefix in ("float", "uint", "int"):
        if storage.startswith(prefix):
            return _DL[prefix], int(storage[len(prefix) :])
    raise InternalCompilerError(storage)


def shim_source(src: TvmSource, symbol: str) -> str:
    """The C function ``int symbol(void* const* args)`` calling TVM's ``src.symbol``."""
    buffers = list(src.buffers)
    lines = [
        "#include <stdint.h>",
        "#include <omp.h>",
        "#include <tvm/ffi/c_api.h>",
        f"int __tvm_ffi_{src.symbol}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);",
        *_PARALLEL_LAUNCH,
    ]
    count = len(buffers) + (1 if src.checks_division else 0)
    for j, (_, numel) in enumerate(buffers):
        lines.append(f"static int64_t shape{j}[1] = {{{numel}}};")
    lines.append("static int64_t shape_err[1] = {1};")
    lines += [
        "static void describe(DLTensor* t, TVMFFIAny* a, void* data, uint8_t code, uint8_t bits,",
        "                     int64_t* shape) {",
        "  t->data = data; t->device.device_type = kDLCPU; t->device.device_id = 0;",
        "  t->ndim = 1; t->dtype.code = code; t->dtype.bits = bits; t->dtype.lanes = 1;",
        "  t->shape = shape; t->strides = 0; t->byte_offset = 0;",
        "  a->type_index = kTVMFFIDLTensorPtr; a->zero_padding = 0; a->v_ptr = t;",
        "}",
        f"int {symbol}(void* const* args) {{",
        f"  DLTensor t[{count}];",
        f"  TVMFFIAny a[{count}];",
        "  int32_t err = 0;",
    ]
    for j, (storage, _) in enumerate(buffers):
        code, bits = _dl_dtype(storage)
        lines.append(f"  describe(&t[{j}], &a[{j}], args[{j}], {code}, {bits}, shape{j});")
    if src.checks_division:
        n = len(buffers)
        lines.append(f"  describe(&t[{n}], &a[{n}], &err, kDLInt, 32, shape_err);")
    lines += [
        "  TVMFFIAny result;",
        "  result.type_index = kTVMFFINone; result.zero_padding = 0; result.v_int64 = 0;",
        f"  if (__tvm_ffi_{src.symbol}(0, a, {count}, &result) != 0) return -1;",
        "  return err;",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _load(k: TvmKernel, path: Path) -> None:
    """Load through TVM (which binds the library's parallel-launch and error hooks to its
    runtime), then the same library with ctypes for the C function."""
    tvm = require_tvm()
    module = tvm.runtime.load_module(str(path))
    lib = ctypes.CDLL(str(path))
    fn = getattr(lib, k.symbol)  # NOTE: fail now, not at the first call
    launch = ctypes.cast(getattr(lib, PARALLEL_LAUNCH), ctypes.c_void_p).value
    with contextlib.suppress(ValueError):  # NOTE: a kernel with no parallel loop has no hook
        ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelLaunch").value = launch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p]
    with _LOCK:
        _LOADED.setdefault(k.key, (module, lib))
        if k.tuning:
            _TUNING.setdefault(k.key, {**k.tuning, "cache_hit": True})
    k.lib = lib
