"""What a native kernel call tells the runner so that a straight run of such calls can go
through one C call (``csrc/launch.h``) instead of one Python call each.

Inside a model's call, each native step's Python (the weight's staleness check,
``contiguous``, ``data_ptr``, the ctypes stores and the ctypes call) cost about 12 us, against
about 2 us hot: after the kernels, the interpreter's and PyTorch's code are out of the caches.
Most of a step's pointers do not change between calls (the arena's buffers, the prepared
weight, the bias), so the runner (:mod:`plait.runtime.native_run`) copies the arrays a call
filled, once it has checked that every pointer in them is one that stays, and runs them again
while the weights and biases are the same tensors, unwritten.

A :class:`NativeLaunch` describes one call's arrays: where each operand's pointer goes, where
the result's goes, the weight's prepared copy and the tensors the call owns.

Example:
    >>> import ctypes
    >>> params = (ctypes.c_int64 * 3)(0, 0, 7)
    >>> launch = NativeLaunch(None, params, None, slots=(0,), out=1)
    >>> launch.operand_slots(1), launch.weighted
    ((0,), False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from plait.codegen.native_entries import build_entries, shipped

SYMBOL = "plait_native_launch"


@dataclass(frozen=True)
class NativeLaunch:
    """A native call's C entry and the arrays it passes (``params``, ``floats``: its own, which
    each call fills). ``slots``: the ``params`` index of each operand's pointer, in operand
    order; with a ``weight`` (the operand at 1's prepared copy) operand 1's slot holds the
    prepared copy's pointer and operand 2 is the bias (None or a tensor read where it is).
    ``out``: the result's index. ``owned``: indexes holding the pointer of a tensor the call
    owns (scratch, a kept result).

    A call with no ``fn`` runs nothing in C: it returns ``result``, a tensor of its own, at
    every call (a pool step handing over the means its depthwise call wrote), which the
    runner's later steps then read where it is."""

    fn: Any
    params: Any
    floats: Any
    slots: tuple[int, ...]
    out: int
    weight: Any = None
    owned: tuple[tuple[int, torch.Tensor], ...] = ()
    result: torch.Tensor | None = None

    @property
    def weighted(self) -> bool:
        return self.weight is not None

    def operand_slots(self, count: int) -> tuple[int, ...]:
        """The slots of a call's first ``count`` operands (a 1x1 call adds a residual only
        where it has one)."""
        return self.slots[:count]


def source() -> str:
    """The launcher's C++ as shipped (``csrc/launch.h``)."""
    return shipped("launch.h")


def launcher() -> Any:
    """The launcher's C entry, built once per machine through the kernel cache (raises
    :class:`~plait.codegen.errors.BuildError` where it cannot be built)."""
    return build_entries(source(), {SYMBOL: "nl::entry(p, f)"})[SYMBOL]
