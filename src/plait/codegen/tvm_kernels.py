"""Which kernels of a Stax plan TVM prints and builds (``StaxOptions(kernels="tvm")``), and why
the others are not: each kernel is printed by the TVM printer (:mod:`plait.codegen.tvm_script`)
and built (:mod:`plait.codegen.tvm_build`) where it can be; a kernel the TVM printer refuses, or
TVM fails to build, is printed by the C++ printer instead, with the reason, which the program's
kernel records and the manifest's fallbacks carry (``plait.explain`` shows them). Nothing falls
back silently.

A kernel's TVM symbol is the hash of its printed text: identical kernels (a transformer's
layers) are one TVM function, built once.

Example:
    >>> choose_tvm([], parallel_threshold=1 << 17, tune=0) if tvm_available() else []
    []
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from plait.codegen.build import cpu_info, toolchain
from plait.codegen.kir import Kernel
from plait.codegen.tvm_build import TvmKernel, build_tvm_kernels, require_tvm, tvm_available
from plait.codegen.tvm_script import Unsupported, print_tvm
from plait.codegen.tvm_vector import vector_isa

__all__ = ["TvmChoice", "build_choices", "choose_tvm", "tvm_available"]


@dataclass
class TvmChoice:
    """One kernel's printer: ``kernel`` (a built TVM kernel) or, where it is None,
    ``fallback``: why the C++ printer prints it."""

    kernel: TvmKernel | None
    fallback: str = ""


def choose_tvm(kernels: Sequence[Kernel], parallel_threshold: int, tune: int) -> list[TvmChoice]:
    """Each kernel printed by the TVM printer where it prints it (not built yet: see
    :func:`build_choices`); raises :class:`~plait.codegen.tvm_build.TvmMissingError` where
    TVM is not installed."""
    require_tvm()
    out = []
    vector_math = vector_isa(cpu_info()[1]) if toolchain().libmvec else None
    for k in kernels:
        try:
            src = print_tvm(k, "TVM_SYMBOL", vector_math)
        except Unsupported as exc:
            out.append(TvmChoice(None, f"the TVM printer refused it: {exc.reason}"))
            continue
        digest = hashlib.sha256(src.source.encode()).hexdigest()
        symbol = f"tvmk_{digest[:24]}"
        src = replace(src, symbol=symbol, source=src.source.replace("TVM_SYMBOL", symbol, 1))
        out.append(TvmChoice(TvmKernel(src, parallel_threshold, tune)))
    return out


def build_choices(choices: Sequence[TvmChoice], jobs: int | None = None) -> None:
    """Build every chosen TVM kernel; one TVM cannot build becomes a C++ fallback, with TVM's
    error as the reason."""
    todo = [c for c in choices if c.kernel is not None]
    try:
        build_tvm_kernels([c.kernel for c in todo if c.kernel is not None], jobs)
        return
    except Exception:  # NOTE: retried one by one below, to find which failed
        pass
    for c in todo:
        assert c.kernel is not None
        try:
            build_tvm_kernels([c.kernel], jobs)
        except Exception as exc:  # NOTE: recorded as this kernel's fallback
            lines = [x.strip() for x in str(exc).splitlines() if x.strip(" |")]
            first = next((x for x in lines if "rror" in x), lines[0] if lines else "")[:300]
            c.fallback = f"TVM could not build it: {type(exc).__name__}: {first}"
            c.kernel = None
