"""Ambient settings: what a compile read of the process's state besides its inputs.

Two kinds. *Call* settings can change between calls (``torch.set_num_threads``, the TF32 and
matmul precision flags, deterministic algorithms, oneDNN on/off, denormals flushed to zero): each
is a guard of kind ``"ambient"`` on every compiled specialization and a part of its cache key.
*Process* settings are fixed for the life of a process (CPU features, GPU compute capability, how
PyTorch was built): they can never fail a guard, so they enter the cache key only.

Why the compile depends on them: passes fold constants and fold batch norms with PyTorch's own
kernels, Stax probes extern layouts and prepacks oneDNN weights at compile time, and native code
is built for this CPU. Each of those results can change with these settings.

Example:
    >>> names = [g.source for g in ambient_guards()]
    >>> "torch.get_num_threads()" in names and "torch.get_float32_matmul_precision()" in names
    True
    >>> sorted(process_settings())[:2]
    ['cpu', 'gpu_capability']
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plait.codegen import build
from plait.guards.guard import Guard, GuardEnv, ReadCalls, ReadPyValues
from plait.manifest import cpu_features


@dataclass(frozen=True)
class Setting:
    """One call setting: its name as a user writes it, and a cheap reader (a C accessor where
    PyTorch has one: guards read it on every call). ``raw``: C accessors whose values decide
    ``read()`` (the same values, the same setting); the native evaluator reads those, and only
    where one changed, ``read`` (None: ``read`` is such an accessor itself)."""

    name: str
    read: Callable[[], Any]
    raw: tuple[Callable[[], Any], ...] | None = None

    def accessors(self) -> tuple[Callable[[], Any], ...]:
        return (self.read,) if self.raw is None else self.raw


_FP32_GETTER = getattr(torch._C, "_get_fp32_precision_getter", None)


@functools.cache
def _fp32_raw(backend: str, op: str) -> Callable[[], Any]:
    """One raw fp32 precision setting (the same object for the same pair: read once a call)."""
    assert _FP32_GETTER is not None
    return functools.partial(_FP32_GETTER, backend, op)


def _precision(backend: str, op: str) -> Setting:
    """The effective fp32 precision of one backend's op: ``"none"`` inherits from the backend's
    ``all``, then from ``generic``, and at the root means ``"ieee"`` (so a setting restored
    through another API compares equal)."""
    name = f"torch.backends.{backend}.{op}.fp32_precision"
    getter = _FP32_GETTER
    if getter is None:  # NOTE: PyTorch before the per-backend fp32_precision API
        return Setting(name, lambda: None)
    pairs = ((backend, op), (backend, "all"), ("generic", "all"))

    def read() -> str:
        for b, o in pairs:
            value = getter(b, o)
            if value != "none":
                return str(value)
        return "ieee"

    return Setting(name, read, tuple(_fp32_raw(b, o) for b, o in pairs))


MIXED = "mixed (see the fp32_precision settings)"


def _legacy(getter: Callable[[], Any]) -> Callable[[], Any]:
    """A legacy precision setting (the matmul precision, a TF32 flag): PyTorch raises on its read
    once the per-backend ``fp32_precision`` settings disagree with it (``torch.backends.mkldnn.
    fp32_precision = "bf16"`` makes the cuDNN flag raise), where eager runs on: then the
    per-backend settings say it all."""

    def read() -> Any:
        try:
            return getter()
        except RuntimeError:
            return MIXED

    return read


# NOTE: a float32 denormal packed by the C conversion of this thread: all zero bytes where
# denormals flush to zero (torch.set_flush_denormal(True) sets the CPU's FTZ and DAZ flags);
# a C call, no Python frame (the native evaluator calls it on every guard check)
_DENORMAL = functools.partial(struct.pack, "<f", 1e-40)
_FLUSHED = b"\x00\x00\x00\x00"


def _flushes_denormals() -> bool:
    """Whether float denormals flush to zero now (``torch.set_flush_denormal``): compile-time
    folding ran PyTorch's kernels under it, so a folded constant can be 0 where eager's, computed
    without it, is not (``x / (s * s)`` with ``s * s`` a denormal: inf against a finite value)."""
    return _DENORMAL() == _FLUSHED


CALL_SETTINGS: tuple[Setting, ...] = (
    Setting("torch.get_num_threads()", torch.get_num_threads),
    Setting(
        "torch.get_float32_matmul_precision()",
        _legacy(lambda: str(torch._C._get_float32_matmul_precision())),
        (torch._C._get_float32_matmul_precision,),
    ),
    Setting(
        "torch.backends.cuda.matmul.allow_tf32",
        _legacy(lambda: bool(torch._C._get_cublas_allow_tf32())),
        (torch._C._get_cublas_allow_tf32,),
    ),
    Setting(
        "torch.backends.cudnn.allow_tf32",
        _legacy(lambda: bool(torch._C._get_cudnn_allow_tf32())),
        (torch._C._get_cudnn_allow_tf32,),
    ),
    _precision("mkldnn", "matmul"),
    _precision("mkldnn", "conv"),
    Setting(
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        torch._C._get_cublas_allow_fp16_reduced_precision_reduction,
    ),
    Setting(
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        torch._C._get_cublas_allow_bf16_reduced_precision_reduction,
    ),
    Setting("torch.are_deterministic_algorithms_enabled()", torch._C._get_deterministic_algorithms),
    Setting(
        "torch.is_deterministic_algorithms_warn_only_enabled()",
        torch._C._get_deterministic_algorithms_warn_only,
    ),
    Setting("torch.backends.mkldnn.enabled", torch._C._get_mkldnn_enabled),
    Setting("torch.backends.cudnn.enabled", torch._C._get_cudnn_enabled),
    Setting("torch.set_flush_denormal", _flushes_denormals, (_DENORMAL,)),
    # NOTE: which fused attention kernels eager may pick: a compiled attention gradient runs
    # the one eager picks when it is compiled
    Setting("torch.backends.cuda.flash_sdp_enabled()", torch._C._get_flash_sdp_enabled),
    Setting(
        "torch.backends.cuda.mem_efficient_sdp_enabled()", torch._C._get_mem_efficient_sdp_enabled
    ),
    Setting("torch.backends.cuda.math_sdp_enabled()", torch._C._get_math_sdp_enabled),
    Setting("torch.backends.cuda.cudnn_sdp_enabled()", torch._C._get_cudnn_sdp_enabled),
)


def call_settings() -> dict[str, Any]:
    """The call settings now, by name."""
    return {s.name: s.read() for s in CALL_SETTINGS}


def _fmt(value: Any) -> str:
    return repr(value)


def _raw_state() -> tuple[tuple[Callable[[], Any], ...], tuple[Any, ...]] | None:
    """The distinct raw accessors of every call setting and their values now (None when one
    cannot be read: then the settings' own readers are the only check)."""
    accessors = tuple(dict.fromkeys(a for s in CALL_SETTINGS for a in s.accessors()))
    try:
        return accessors, tuple(a() for a in accessors)
    except Exception:
        return None


def ambient_guards() -> list[Guard]:
    """One guard per call setting (what explanations name), and before them one batch guard
    that reads them all as a tuple (what the fast path runs: one comparison; natively, the raw
    accessors, and the readers only when one of those changed)."""
    readers = tuple(s.read for s in CALL_SETTINGS)
    expected = tuple(r() for r in readers)
    raw = _raw_state()
    fast = ReadCalls(readers) if raw is None else ReadCalls(raw[0], raw[1], exact=False)

    def read_all(env: GuardEnv) -> tuple[Any, ...]:
        return tuple([r() for r in readers])

    out = [
        Guard(
            "ambient",
            "settings",
            "ambient settings",
            expected,
            read_all,
            batch=True,
            native=fast,
        )
    ]
    for s, value in zip(CALL_SETTINGS, expected):
        out.append(
            Guard(
                "ambient",
                s.name,
                f"{s.name} == {value!r}",
                value,
                _reader(s.read),
                redundant=True,
                fmt=_fmt,
            )
        )
    return out


def _reader(read: Callable[[], Any]) -> Callable[[GuardEnv], Any]:
    return lambda env: read()


# NOTE: the hooks nn.Module.__call__ runs for every module (register_module_forward_hook, ...):
# module-level tables of torch.nn.modules.module, read by name on each call (PyTorch rebinds
# none of them, but a name read keeps the guard on the table PyTorch uses)
_GLOBAL_HOOK_TABLES = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


def _global_hook_tables() -> tuple[dict[Any, Any], ...]:
    module = torch.nn.modules.module
    return tuple(getattr(module, name) for name in _GLOBAL_HOOK_TABLES)


def global_hooks(env: GuardEnv | None = None) -> tuple[tuple[tuple[Any, Any], ...], ...]:
    """The global module hooks now: each table's (handle id, hook) items."""
    return tuple(tuple(table.items()) for table in _global_hook_tables())


def global_hook_guard() -> Guard:
    """The global module hooks (``torch.nn.modules.module.register_module_forward_hook``,
    ``..._forward_pre_hook``, ``..._full_backward_hook``, ``..._backward_pre_hook``) are those
    the program was captured with, each the same object: ``nn.Module.__call__`` runs them for
    every module, so a capture ran them into its graph (a hook that changes an output changes
    the program). One registered or removed after the capture is a new specialization.

    Example:
        >>> g = global_hook_guard()
        >>> g.holds(None), g.expected
        (True, ((), (), (), ()))
    """
    tables = _global_hook_tables()
    expected = global_hooks()
    checks = tuple((4, t, tuple(t), tuple(t.values())) for t in tables)  # NOTE: dict items
    return Guard(
        "ambient",
        "global module hooks",
        "the global module hooks are the captured ones" + ("" if any(expected) else " (none)"),
        expected,
        global_hooks,
        fmt=lambda v: f"{sum(map(len, v))} hook(s)",
        portable=not any(expected),
        native=ReadPyValues(checks, absent=object()),
    )


@functools.lru_cache(maxsize=1)
def _torch_build() -> str:
    """A hash of how PyTorch was built (compiler, BLAS, oneDNN, CUDA versions and flags).

    NOTE: ``torch.__config__.show()`` takes about 0.2 s with a CUDA build, on every warm
    start; its hash is remembered on disk (:func:`~plait.codegen.build.remembered`) for the
    installed library file as it is (path, size, mtime, inode: a reinstall changes them). The
    memo only saves the call: the key part is the hash of the text either way."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    digest = build.remembered("torch_build", [build.file_identity(lib), torch.__version__],
                              lambda: {"sha256": _torch_build_now()})  # fmt: skip
    return str(digest["sha256"])


def _torch_build_now() -> str:
    return hashlib.sha256(torch.__config__.show().encode()).hexdigest()


def _gpu_capability() -> list[list[int]] | None:
    if not torch.cuda.is_available():
        return None
    return [list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]


@functools.lru_cache(maxsize=2)
def process_settings(cuda: bool = False) -> dict[str, Any]:
    """Settings fixed for the life of this process: cache key parts, never guards. ``cuda``: the
    program runs on CUDA tensors; only then does the GPU's compute capability matter.

    NOTE: asking CUDA anything (even whether a GPU is there) starts its driver, about 0.2 s on
    a GPU machine: a CPU program's warm start must not pay for it."""
    return {
        "cpu": dict(cpu_features()),
        "gpu_capability": _gpu_capability() if cuda else None,
        "mkldnn_available": torch.backends.mkldnn.is_available(),
        "torch_build_sha256": _torch_build(),
        "onednn_env": onednn_environment(),
    }


# NOTE: oneDNN reads these when a process first uses it (ONEDNN_MAX_CPU_ISA narrows the kernels
# it may pick, and so which fused calls it accepts): fixed for the process, a key part.
_ONEDNN_ENV = ("ONEDNN_", "DNNL_", "MKLDNN_")


def onednn_environment() -> list[list[str]]:
    """The oneDNN environment variables set in this process, sorted by name."""
    return sorted([k, v] for k, v in os.environ.items() if k.startswith(_ONEDNN_ENV))
