"""Functionalization of aliasing: view steps, replay after a mutation, scatter of a write.

In eager PyTorch a view shares memory with its base: writing through the view changes the base,
and writing the base changes what the view reads. The IR has value semantics, so capture keeps,
for each tracer that is a view, the chain of :class:`ViewStep` from its root tensor:

- after the root is updated (an in-place op, or a write through another view), a view's value is
  *replayed*: its steps applied to the root's new value;
- a write through a view is *scattered* into the root: each step knows how to put a new value of
  its output back into its input (reshape back, transpose back, or concatenate the untouched
  slices around the written one, or select the new diagonal). Steps that cannot do that
  (``expand``, ``unfold``: their elements may repeat) refuse.

``detach`` (and ``.data``) is a view step too: same value, no gradient; a write through it goes
to the root unchanged. Slices of symbolic dims are in slices.py.

Everything here moves values and never does arithmetic, so it is bitwise exact.

Example:
    >>> ViewStep("transpose", (("dim0", 0), ("dim1", 1))).inverse_name()
    'transpose'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy
import torch

from plait.frontend.slices import emit_slice, splice, write_range
from plait.ir import TensorType, Value
from plait.symbolic import normalize

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

# NOTE: these keep the element order, so a new value goes back by reshaping to the input shape.
_RESHAPES = ("view", "reshape", "flatten", "unsqueeze", "squeeze")
_IDENTITY = ("identity",)
_SAME_VALUE = ("identity", "detach")  # NOTE: output value == input value


@dataclass(frozen=True)
class ViewStep:
    """One IR view op (``op`` with ``attrs``) from a tensor to a view of it; ``"identity"`` is a
    view with the same value (``contiguous()`` of a contiguous tensor, eval-mode dropout...)."""

    op: str
    attrs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(op: str, **attrs: Any) -> ViewStep:
        return ViewStep(op, tuple(attrs.items()))

    def apply(self, cx: CaptureContext, v: Value, replay: bool = False) -> Value:
        """Emit the step. NOTE: a replay reshapes where the program viewed: after
        functionalization the replayed input may not be viewable in the eager runtime."""
        if self.op in _IDENTITY:
            return v
        if self.op == "slice":
            return emit_slice(cx, v, **dict(self.attrs))
        if self.op == "select":
            _guard_index(cx, v, **dict(self.attrs))
        op = "reshape" if replay and self.op == "view" else self.op
        out: Value = cx.call(op, v, **dict(self.attrs))
        return out

    def inverse_name(self) -> str | None:
        if self.op in _RESHAPES:
            return "reshape"
        if self.op in ("transpose", "permute", "slice", "select", "diagonal"):
            return self.op
        if self.op in _SAME_VALUE:
            return self.op
        return None

    def unapply(self, cx: CaptureContext, base: Value, new: Value) -> Value:
        """The value of this step's input after its output was overwritten with ``new``."""
        attrs = dict(self.attrs)
        kind = self.inverse_name()
        assert isinstance(base.type, TensorType)
        if kind is None:
            cx.limitation(
                f"a write through a view made by {self.op!r} cannot be put back into "
                "the tensor it views"
            )
        if kind in _SAME_VALUE:
            return new
        if kind == "reshape":
            out: Value = cx.call("reshape", new, shape=base.type.shape)
            return out
        if kind == "transpose":
            out = cx.call("transpose", new, dim0=attrs["dim0"], dim1=attrs["dim1"])
            return out
        if kind == "permute":
            dims = [d % base.type.rank for d in attrs["dims"]]
            inverse = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
            out = cx.call("permute", new, dims=inverse)
            return out
        if kind == "diagonal":
            return put_diagonal(cx, base, new, **attrs)
        if kind == "select":
            dim = attrs["dim"] % base.type.rank
            n = base.type.shape[dim]
            index = attrs["index"]
            lo = normalize(n + index) if index < 0 else index
            lo, hi = write_range(cx, n, lo, normalize(lo + 1))
            piece = cx.call("unsqueeze", new, dim=dim)
            return splice(cx, base, piece, dim, lo, hi)
        # slice
        dim = attrs["dim"] % base.type.rank
        if attrs["step"] != 1:
            return _put_strided(cx, base, new, dim, attrs["start"], attrs["end"], attrs["step"])
        lo, hi = write_range(cx, base.type.shape[dim], attrs["start"], attrs["end"])
        return splice(cx, base, new, dim, lo, hi)


def _put_strided(
    cx: CaptureContext, base: Value, new: Value, dim: int, start: Any, end: Any, step: int
) -> Value:
    """``base`` with ``base[start:end:step]`` (along ``dim``) replaced by ``new``: ``new`` spread
    to every ``step``-th position (each element followed by ``step - 1`` pads) and selected by a
    mask built the same way from ones."""
    ty, nt = base.type, new.type
    assert isinstance(ty, TensorType) and isinstance(nt, TensorType)
    n, length = ty.shape[dim], nt.shape[dim]
    if not (isinstance(n, int) and isinstance(length, int)):
        cx.limitation("a write through a strided slice of a symbolic dim; specialize it")
    lo = range(n)[slice(start, end, step)].start if length else 0

    def spread(v: Value, fill: Any) -> Value:
        rank = v.type.rank  # type: ignore[union-attr]
        wide = cx.call("unsqueeze", v, dim=dim + 1)
        after = [0, 0] * (rank - dim - 1) + [0, step - 1]  # NOTE: pads list the last dim first
        wide = cx.call("constant_pad", wide, pad=tuple(after), value=fill)
        shape = list(v.type.shape)  # type: ignore[union-attr]
        shape[dim] = length * step
        flat = cx.call("reshape", wide, shape=tuple(shape))
        around = [0, 0] * (rank - dim - 1) + [lo, n - lo - length * step]
        out: Value = cx.call("constant_pad", flat, pad=tuple(around), value=fill)
        return out

    # NOTE: the mask along dim: True at lo, lo + step, ... (the same spreading, of ones)
    ones = cx.call("ones", shape=(length, 1), dtype=torch.bool, device=ty.device)
    line = cx.call("constant_pad", ones, pad=(0, step - 1), value=False)
    line = cx.call("reshape", line, shape=(length * step,))
    line = cx.call("constant_pad", line, pad=(lo, n - lo - length * step), value=False)
    mask = cx.call("reshape", line, shape=tuple(n if d == dim else 1 for d in range(ty.rank)))
    out: Value = cx.call("where", mask, spread(new, 0), base)
    return out


def _guard_index(cx: CaptureContext, v: Value, dim: int, index: int) -> None:
    """``select`` of a symbolic dim: a guard that ``index`` is in range (``n > index``, or
    ``n >= -index`` from the end), else a later call at a smaller size reads out of bounds."""
    assert isinstance(v.type, TensorType)
    n = v.type.shape[dim % v.type.rank]
    if not isinstance(n, int):
        cx.record_predicate(sympy.Gt(n, index) if index >= 0 else sympy.Ge(n, -index), True)


def put_diagonal(
    cx: CaptureContext, base: Value, new: Value, offset: int, dim1: int, dim2: int
) -> Value:
    """``base`` with its diagonal (``offset``, ``dim1``, ``dim2``) replaced by ``new``: ``new``
    padded along the diagonal to dim1's length, spread along dim2, and selected where
    ``i2 - i1 == offset``."""
    ty = base.type
    assert isinstance(ty, TensorType)
    rank = ty.rank
    a, b = dim1 % rank, dim2 % rank
    n_a, n_b = ty.shape[a], ty.shape[b]
    if not (isinstance(n_a, int) and isinstance(n_b, int)):
        cx.limitation("a write through a diagonal of symbolic dims; specialize them")
    first = max(-offset, 0)
    length = new.type.shape[-1]  # type: ignore[union-attr]
    along = cx.call("constant_pad", new, pad=(first, n_a - first - length), value=0)
    along = cx.call("unsqueeze", along, dim=-1)
    rest = [d for d in range(rank) if d not in (a, b)]
    along = cx.call("expand", along, shape=(*(ty.shape[d] for d in rest), n_a, n_b))
    order = [*rest, a, b]
    spread = cx.call("permute", along, dims=tuple(order.index(d) for d in range(rank)))

    def position(dim: int, n: int) -> Value:
        iota = cx.call("arange", start=0, end=n, step=1, dtype=torch.int64, device=ty.device)
        out: Value = cx.call(
            "reshape", iota, shape=tuple(n if d == dim else 1 for d in range(rank))
        )
        return out

    on_diagonal = cx.call("eq", cx.call("sub", position(b, n_b), position(a, n_a)), offset)
    out: Value = cx.call("where", on_diagonal, spread, base)
    return out


def replay(cx: CaptureContext, root_value: Value, steps: Sequence[ViewStep]) -> Value:
    v = root_value
    for step in steps:
        v = step.apply(cx, v, replay=True)
    return v


def scatter(cx: CaptureContext, root_value: Value, steps: Sequence[ViewStep], new: Value) -> Value:
    """The root's value after the view reached by ``steps`` was overwritten with ``new``."""
    if not steps:
        return new
    inner = steps[0].apply(cx, root_value, replay=True)
    inner_new = scatter(cx, inner, steps[1:], new)
    return steps[0].unapply(cx, root_value, inner_new)


def tensors_in(x: Any) -> list[torch.Tensor]:
    """The tensors in a call's arguments or results (tuples, lists and dicts looked into), in
    order.

    Example:
        >>> a, b = torch.zeros(1), torch.ones(1)
        >>> [t is a for t in tensors_in((a, [2, {"k": b}]))]
        [True, False]
    """
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in tensors_in(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors_in(v)]
    return []


def storage_id(t: torch.Tensor) -> int:
    """Identity of the memory a tensor views (works for meta tensors too)."""
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return 0


def keep_history(cx: CaptureContext, new: Value, old: Value) -> Value:
    """``new``, the value that replaces ``old`` in a write to a tensor that requires grad,
    still carrying ``old``'s history. Eager's written tensor keeps its autograd history even
    where the write covers every element (``fill_``, ``zero_``, ``copy_``, ``x[:] = c``): it
    still requires grad and a zero gradient reaches what ``old`` was computed from (a parameter
    then gets zeros, not None, and an optimizer steps it). A ``new`` that does not read ``old``
    is joined to it by a ``where`` over an all-true mask: the same values, and that edge."""
    if _reads(new, old):
        return new
    ty = old.type
    assert isinstance(ty, TensorType)
    keep = cx.call("full", shape=ty.shape, dtype=torch.bool, device=ty.device, value=True)
    out: Value = cx.call("where", keep, new, old)
    return out


def _reads(new: Value, old: Value, limit: int = 256) -> bool:
    """Does ``new`` depend on ``old``? False when the search gives up after ``limit`` values
    (then a ``where`` joins them: one more node, never a lost gradient)."""
    seen: set[int] = set()
    todo = [new]
    while todo and len(seen) < limit:
        v = todo.pop()
        if v is old:
            return True
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.producer is not None:
            todo.extend(v.producer.input_values())
    return False
