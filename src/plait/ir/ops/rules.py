"""Shared pieces of type rules: broadcasting, dtype promotion, dim normalization.

NOTE: dtype promotion asks PyTorch itself (``torch.result_type`` on meta tensors), so the IR's
rules agree with eager PyTorch by construction, including the scalar and 0-dim cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from plait.ir.ops.registry import TypeRuleError
from plait.ir.types import FLOAT_DTYPES, NoneType, ScalarType, TensorType, Type
from plait.symbolic import Dim, known_equal, known_not_equal, normalize

_SCALAR_EXAMPLE = {"int": 1, "float": 1.0, "bool": True}


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
    return torch.result_type(_meta(a), _meta(b))


def float_dtype(dtype: torch.dtype) -> torch.dtype:
    """Ops such as ``exp`` compute integers in the default float dtype (float32)."""
    return dtype if dtype in FLOAT_DTYPES else torch.float32


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
