"""What a generated runner calls at run time besides its kernels: the errors of a call whose
inputs do not match the graph, the copy of an extern's result into the layout the plan expects,
the check of a fallback's result and the profiling clock.

NOTE: these run inside the runner's hot path only when something is wrong (a bad input, a
result in another layout); a correct call never reaches them but for :func:`device_clock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from plait.errors import CompiledInputError, InternalCompilerError, ProgramError


class StaxInputError(CompiledInputError):
    """A call's input does not match the graph's input type."""

    error_code = "PLAIT-C104"


def bad_input(position: int, name: str, expected: str, got: Any) -> None:
    if isinstance(got, torch.Tensor):
        desc = f"{got.dtype} {tuple(got.shape)} on {got.device}"
    else:
        desc = type(got).__name__
    raise StaxInputError(f"input {position} (%{name}): expected {expected}, got {desc}")


def not_tensor(args: tuple[Any, ...], specs: list[tuple[int, str, str]]) -> None:
    for a, (i, name, expected) in zip(args, specs):
        if not isinstance(a, torch.Tensor):
            bad_input(i, name, expected, a)
    raise StaxInputError("an input is not a tensor")


def zero_division() -> None:
    raise ProgramError("ZeroDivisionError")


def unbound(args: tuple[Any, ...], specs: list[tuple[int, str, str, int]]) -> None:
    """A call whose sizes could not be read: an input that is no tensor or has another rank."""
    for a, (i, name, expected, rank) in zip(args, specs):
        if not isinstance(a, torch.Tensor) or a.dim() != rank:
            bad_input(i, name, expected, a)
    raise StaxInputError("an input's sizes could not be read")


def bad_sizes(names: list[str], values: tuple[int, ...], least: list[int]) -> None:
    bad = ", ".join(f"{n} = {v} (at least {m})" for n, v, m in zip(names, values, least) if v < m)
    raise StaxInputError(
        f"symbolic sizes below what the program was compiled for: {bad}; plait.compile "
        "specializes sizes 0 and 1"
    )


def conform(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``t`` copied into the layout the plan expects (PyTorch chose another one)."""
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def owned(t: torch.Tensor, strides: tuple[int, ...], operands: tuple[Any, ...]) -> torch.Tensor:
    """An extern's result as the plan owns it: copied into ``strides`` where it shares storage
    with an operand (a view ATen's schema does not declare: ``unsafe_split``'s chunks, a
    gradient that views its cotangent), which the arena may reuse or an epilogue write, or where
    PyTorch laid it out otherwise than the plan."""
    if _shares_storage(t, operands):
        return conform(t, strides)
    return t if t.stride() == strides else conform(t, strides)


def returned(
    t: torch.Tensor, strides: tuple[int, ...], operands: tuple[Any, ...], raw: list[bool]
) -> torch.Tensor:
    """An extern's result that only the program's return reads (``runner_emit.returned_only``):
    while ``raw[0]`` (a CUDA graph captures the runner, and its call copies each such output
    out into ``strides``: ``cuda_graph_inputs``), as PyTorch laid it out, unless it shares
    storage with an operand; otherwise as :func:`owned` has it."""
    if raw[0] and not _shares_storage(t, operands):
        return t
    return owned(t, strides, operands)


def _shares_storage(t: torch.Tensor, operands: tuple[Any, ...]) -> bool:
    storage = t.untyped_storage().data_ptr()
    return any(
        isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() == storage for o in operands
    )


def check_result(
    t: Any, shape: tuple[int, ...], dtype: torch.dtype, what: str, operands: list[Any]
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
        raise InternalCompilerError(f"{what}: expected {dtype} {shape}, got {t!r:.80}")
    # NOTE: the plan owns a fallback's result: one that is a view of an operand (``detach``)
    # is copied, or a buffer reused later (the arena, an input written in place) would change it
    storage = t.untyped_storage().data_ptr()
    for o in operands:
        if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() == storage:
            return t.clone(memory_format=torch.contiguous_format)
    return t if t.is_contiguous() else t.contiguous()


def device_clock(device: torch.device) -> Callable[[], float]:
    """A wall clock that first waits for the device's queued work (CUDA runs asynchronously)."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock
