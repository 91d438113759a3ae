"""Shared pieces of type rules: broadcasting, dtype promotion, dim normalization.

NOTE: dtype promotion asks PyTorch itself (``torch.result_type`` on meta tensors), so the IR's
rules agree with eager PyTorch by construction, including the scalar and 0-dim cases.

NOTE: the IR's rules never read ``torch.get_default_dtype()``: where eager takes a dtype from
the default (an integer tensor times a float, ``sqrt`` of integers, integer true division) the
rules give :data:`IR_DEFAULT_FLOAT` (float32, PyTorch's own default), whatever the default in
force, so a graph types the same wherever it is built, verified or loaded. Capture, under
another default, casts such operands to it first (``frontend.default_dtype``); it learns which
calls need that from :func:`default_reads`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import torch

from plait.ir.ops.registry import TypeRuleError
from plait.ir.types import FLOAT_DTYPES, NoneType, ScalarType, TensorType, Type
from plait.symbolic import Dim, known_equal, known_not_equal, normalize

_SCALAR_EXAMPLE = {"int": 1, "float": 1.0, "bool": True}

IR_DEFAULT_FLOAT = torch.float32
"""The float dtype the IR's rules give where eager would take ``torch.get_default_dtype()``."""

_READS: ContextVar[list[str] | None] = ContextVar("plait_default_float_reads", default=None)


def default_float(why: str) -> torch.dtype:
    """:data:`IR_DEFAULT_FLOAT`, noted (``why``) in :func:`default_reads`' list if one is open."""
    reads = _READS.get()
    if reads is not None:
        reads.append(why)
    return IR_DEFAULT_FLOAT


@contextlib.contextmanager
def default_reads() -> Iterator[list[str]]:
    """A list of the reasons type rules run inside the block took the default float dtype.

    Example:
        >>> with default_reads() as reads:
        ...     float_dtype(torch.int64)
        torch.float32
        >>> reads
        ['torch.int64 computes in the default float dtype']
    """
    reads: list[str] = []
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def tensors(*types: Any) -> list[TensorType]:
    return [t for t in types if isinstance(t, TensorType)]


def device_of(*types: Any) -> str:
    """The common device of tensor operands; 0-dim CPU tensors may join any device."""
    devices = {t.device for t in tensors(*types) if not (t.rank == 0 and t.device == "cpu")}
    if len(devices) > 1:
        raise TypeRuleError(f"operands on different devices: {sorted(devices)}")
    if devices:
        return devices.pop()
    found = tensors(*types)
    return found[0].device if found else "cpu"


def _meta(t: Type) -> Any:
    if isinstance(t, TensorType):
        return torch.empty([] if t.rank == 0 else [1], dtype=t.dtype, device="meta")
    if isinstance(t, ScalarType):
        return _SCALAR_EXAMPLE[t.kind]
    raise TypeRuleError(f"cannot promote {t}")


def promote(a: Type, b: Type | None = None) -> torch.dtype:
    """The dtype PyTorch gives a pointwise op on these one or two operands."""
    if b is None or isinstance(b, NoneType):
        if not isinstance(a, TensorType):
            raise TypeRuleError(f"a pointwise op needs a tensor operand, got {a}")
        return a.dtype
    if not (isinstance(a, TensorType) or isinstance(b, TensorType)):
        raise TypeRuleError("a pointwise op needs at least one tensor operand")
    return promoted_float(torch.result_type(_meta(a), _meta(b)), a, b)


def promoted_float(dtype: torch.dtype, *operands: Any) -> torch.dtype:
    """``dtype``, PyTorch's promotion of ``operands``; a float promoted from no float tensor
    (an integer or bool tensor with a float scalar) is the default float dtype's."""
    if dtype not in FLOAT_DTYPES:
        return dtype
    if any(isinstance(t, TensorType) and t.dtype in FLOAT_DTYPES for t in operands):
        return dtype
    return default_float("a float scalar promotes a tensor of no float dtype")


def float_dtype(dtype: torch.dtype) -> torch.dtype:
    """Ops such as ``exp`` compute integers in the default float dtype (see the module's note)."""
    if dtype in FLOAT_DTYPES:
        return dtype
    return default_float(f"{dtype} computes in the default float dtype")


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy broadcasting on possibly symbolic dims; an undecidable pair is an error."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        result: Dim = 1
        for d in dims:
            if _is_one(d):
                continue
            if _is_one(result):
                result = d
            elif known_equal(result, d):
                continue
            elif known_not_equal(result, d) or (isinstance(result, int) and isinstance(d, int)):
                raise TypeRuleError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
            else:
                raise TypeRuleError(
                    f"cannot decide whether {result} and {d} broadcast; specialize one of them"
                )
        out.append(result)
    return tuple(out)


def _is_one(d: Dim) -> bool:
    return isinstance(normalize(d), int) and normalize(d) == 1


def wrap_dim(dim: int, rank: int, op: str) -> int:
    """Normalize a possibly negative dim index; rank-0 tensors accept dims -1 and 0."""
    bound = max(rank, 1)
    if not -bound <= dim < bound:
        raise TypeRuleError(f"{op}: dim {dim} out of range for rank {rank}")
    return dim % bound


def wrap_dims(dims: Sequence[int] | None, rank: int, op: str) -> tuple[int, ...]:
    """The dims normalized and checked. A rank-0 tensor accepts 0 and -1 (as PyTorch does) and
    has no axis to name: its dims are always ``()`` (a reduction of it is the value itself)."""
    if dims is None or len(dims) == 0:
        return tuple(range(rank))
    out = tuple(wrap_dim(d, rank, op) for d in dims)
    if len(set(out)) != len(out):
        raise TypeRuleError(f"{op}: repeated dim in {tuple(dims)}")
    return out if rank else ()


def reduce_shape(shape: Sequence[Dim], dims: Sequence[int], keepdim: bool) -> tuple[Dim, ...]:
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def require_float(t: TensorType, op: str) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeRuleError(f"{op}: expects a floating-point tensor, got {t.dtype}")


def same(t: TensorType, **_: Any) -> list[Type]:
    return [t]
