"""Slices of symbolic dims (``dynamic=True``): exact bounds under guards.

The IR's ``slice`` follows Python: bounds are clamped to the size (length ``Min(end, n)``), and
on a symbolic dim an integer bound must be nonnegative. A clamped length such as ``Min(s1, 16)``
cannot be related to ``s1`` by later type rules (a broadcast against it would force
specialization), so when the capture sample has ``0 <= start <= end <= n`` those facts become
guards and the slice gets the exact length ``end - start``: a plain ``slice`` when its type rule
already says so, else the middle piece of a ``split`` (whose sizes add up to ``n`` by
construction). A negative integer bound on a symbolic dim counts from the end (``n + b``).

NOTE: everything here moves values, so it is bitwise exact; a symbolic bound reaches the IR only
with a guard that it is nonnegative.

Example (``bias[:, :T]`` with ``bias: f32[4, 16]`` and ``T = s1``, sample ``T = 10``)::

    %1, %2 = split(%bias) {sizes=[s1, 16 - s1], dim=1}   # guarded: s1 <= 16
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import sympy

from plait.ir import TensorType, Value
from plait.ir.ops import TypeRuleError, get_op
from plait.symbolic import known_equal, normalize

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

Bound = Any  # int | sympy.Expr | None


def _symbolic(d: Bound) -> bool:
    return d is not None and not isinstance(d, int)


def _sample(cx: CaptureContext, d: Any) -> int:
    """The value of a dim in the capture sample."""
    return d if isinstance(d, int) else int(normalize(d.xreplace(cx.bindings)))


def _specialize(cx: CaptureContext, dims: list[Bound], why: str) -> NoReturn:
    syms = {s for d in dims if _symbolic(d) for s in d.free_symbols if s in cx.bindings}
    assert syms, "only symbolic dims are specialized"
    cx.restart(syms, why)


def exact_range(cx: CaptureContext, n: Any, lo: Any, hi: Any) -> bool:
    """Whether ``0 <= lo <= hi <= n`` in the capture sample; if so, guards keep it true."""
    if not 0 <= _sample(cx, lo) <= _sample(cx, hi) <= _sample(cx, n):
        return False
    for rel in (sympy.Ge(lo, 0), sympy.Le(lo, hi), sympy.Le(hi, n)):
        cx.record_predicate(rel, True)
    return True


def slice_range(cx: CaptureContext, n: Any, start: Bound, end: Bound) -> tuple[Any, Any] | None:
    """Exact, guarded ``(lo, hi)`` of ``[start:end]`` on a dim of size ``n`` (one of them
    symbolic); None when the capture sample clamps a bound (Python semantics then differ)."""
    lo = 0 if start is None else start
    hi = n if end is None else end
    lo, hi = (normalize(n + b) if isinstance(b, int) and b < 0 else b for b in (lo, hi))
    return (lo, hi) if exact_range(cx, n, lo, hi) else None


def _guard_nonnegative(cx: CaptureContext, bounds: tuple[Bound, ...]) -> None:
    for b in bounds:
        if not _symbolic(b):
            continue
        if _sample(cx, b) < 0:
            _specialize(cx, [b], "a negative slice bound")
        cx.record_predicate(sympy.Ge(b, 0), True)


def emit_slice(
    cx: CaptureContext, v: Value, dim: int, start: Bound, end: Bound, step: int
) -> Value:
    """``v[start:end:step]`` along ``dim`` (the ``slice`` view step); see the module docstring."""
    assert isinstance(v.type, TensorType)
    d = dim % v.type.rank
    n = v.type.shape[d]
    if not any(_symbolic(x) for x in (n, start, end)):
        out: Value = cx.call("slice", v, dim=dim, start=start, end=end, step=step)
        return out
    _guard_nonnegative(cx, (start, end))
    rng = slice_range(cx, n, start, end)
    if rng is None:
        if any(isinstance(b, int) and b < 0 for b in (start, end)):
            _specialize(cx, [n], "a negative slice bound that the capture sample clamps")
        out = cx.call("slice", v, dim=dim, start=start, end=end, step=step)
        return out
    lo, hi = rng
    attrs = {"dim": dim, "start": None if start is None else lo, "end": None if end is None else hi}
    if step != 1 or _plain_is_exact(v, attrs, d, normalize(hi - lo)):
        out = cx.call("slice", v, step=step, **attrs)
        return out
    return _split_piece(cx, v, d, n, lo, hi, None)


def _plain_is_exact(v: Value, attrs: dict[str, Any], d: int, length: Any) -> bool:
    try:
        _, _, types = get_op("slice").infer([v], {**attrs, "step": 1})
    except TypeRuleError:
        return False
    ty = types[0]
    assert isinstance(ty, TensorType)
    return known_equal(ty.shape[d], length)


def _split_piece(
    cx: CaptureContext, v: Value, d: int, n: Any, lo: Any, hi: Any, new: Value | None
) -> Value:
    """The middle piece ``[lo, hi)`` of ``v`` along ``d`` (``new`` None), or ``v`` with that
    piece replaced by ``new``; pieces of size 0 are left out."""
    sizes = [normalize(lo), normalize(hi - lo), normalize(n - hi)]
    keep = [i for i, s in enumerate(sizes) if i == 1 or s != 0]
    parts = list(cx.call("split", v, sizes=tuple(sizes[i] for i in keep), dim=d))
    middle = keep.index(1)
    if new is None:
        piece: Value = parts[middle]
        return piece
    parts[middle] = new
    if len(parts) == 1:
        return new
    out: Value = cx.call("cat", parts, dim=d)
    return out


def splice(cx: CaptureContext, base: Value, new: Value, dim: int, lo: Any, hi: Any) -> Value:
    """``base`` with positions ``[lo, hi)`` along ``dim`` replaced by ``new`` (a write through a
    view); ``lo``/``hi`` come from :func:`write_range`."""
    assert isinstance(base.type, TensorType)
    n = base.type.shape[dim]
    if _symbolic(n) or _symbolic(lo) or _symbolic(hi):
        return _split_piece(cx, base, dim, n, lo, hi, new)
    parts: list[Value] = []
    if lo != 0:
        parts.append(cx.call("slice", base, dim=dim, start=0, end=lo))
    parts.append(new)
    if n - hi != 0:
        parts.append(cx.call("slice", base, dim=dim, start=hi, end=None))
    if len(parts) == 1:
        return new
    out: Value = cx.call("cat", parts, dim=dim)
    return out


def write_range(cx: CaptureContext, n: Any, start: Bound, end: Bound) -> tuple[Any, Any]:
    """``(lo, hi)`` of a write through ``[start:end]``: Python semantics on a static dim; on a
    symbolic one exact and guarded, or the sizes are specialized."""
    if not any(_symbolic(x) for x in (n, start, end)):
        lo, hi, _ = slice(start, end).indices(n)
        return lo, max(lo, hi)
    rng = slice_range(cx, n, start, end)
    if rng is None:
        _specialize(cx, [n, start, end], "a write through a slice the capture sample clamps")
    return rng
