"""Sizes read by the program: ints that record a guard when the program compares them.

A :class:`TracedInt` is an ``int`` (its value in the capture sample) that also carries

- ``ir``: what the IR uses for it: the same int when dims are static, a sympy expression over the
  input symbols with ``dynamic=True``;
- ``expr``: the same quantity as an expression over the *input-dim symbols*, used to write and
  re-evaluate guards (``None`` when the size is not tied to an input dim).

Comparing it records a guard (``x.shape[0] > 2``, expected ``True``) with the active capture and
returns a plain ``bool``. Arithmetic with ints keeps tracking. Converting it to a plain int
(``__index__``, ``int()``, ``str()``, bitwise operators, ``divmod``, ``abs``) specializes it: with
symbolic dims that records an equality guard. CPython copies an int subclass's value without
calling any of its methods in ``range()``, ``operator.index()``, arithmetic with a float on the
left and ``math.log``: those are not seen (docs/capture.md, "Dynamic shapes").

Example:
    >>> import sympy
    >>> s = sympy.Symbol("s0", integer=True, positive=True)
    >>> n = TracedInt(4, 4, s)
    >>> (n * 2 + 1) == 9, isinstance(n * 2, TracedInt)
    (True, True)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any, Protocol, SupportsIndex

import sympy


class GuardSink(Protocol):
    def record_predicate(self, rel: Any, outcome: bool) -> None: ...

    def specialize(self, expr: Any, value: int) -> None: ...


_SINKS: list[GuardSink] = []


def push_sink(sink: GuardSink) -> None:
    _SINKS.append(sink)


def pop_sink(sink: GuardSink) -> None:
    assert _SINKS and _SINKS[-1] is sink, "capture contexts must nest"
    _SINKS.pop()


def active_sink() -> GuardSink | None:
    return _SINKS[-1] if _SINKS else None


Dimish = Any  # int | sympy.Expr


def _parts(v: Any) -> tuple[int, Dimish, Any] | None:
    """(value, ir, expr) of an int-like operand, or None for anything else."""
    if isinstance(v, TracedInt):
        return int.__int__(v), v.ir, v.expr
    if isinstance(v, int) and not isinstance(v, bool):
        return v, v, v
    return None


def _combine(a: Any, b: Any, fn: Callable[[Any, Any], Any]) -> Any:
    if a is None or b is None:
        return None
    out = fn(a, b)
    if isinstance(out, sympy.Basic):
        out = sympy.expand(out) if isinstance(out, (sympy.Add, sympy.Mul)) else out
        if out.is_Integer:
            return int(out)
    return out


def _arith(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self: TracedInt, other: Any) -> Any:
        rhs = _parts(other)
        lhs = _parts(self)
        assert lhs is not None
        if rhs is None:
            # NOTE: arithmetic with a float (or anything else) leaves the int world; the value
            # is specialized, which records an equality guard when the dim is symbolic.
            plain = self.__int__()
            return fn(other, plain) if reflected else fn(plain, other)
        x, y = (rhs, lhs) if reflected else (lhs, rhs)
        value = fn(x[0], y[0])
        return TracedInt(value, _combine(x[1], y[1], fn), _combine(x[2], y[2], fn))

    return method


def _plain_op(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[..., Any]:
    """An int operator that leaves the tracked world: computed on the specialized value."""

    def method(self: TracedInt, other: Any) -> Any:
        if not isinstance(other, int):
            return NotImplemented
        plain = self.__int__()
        return fn(other, plain) if reflected else fn(plain, other)

    return method


_SYMPY_REL: dict[Any, Any] = {
    operator.eq: sympy.Eq,
    operator.ne: sympy.Ne,
    operator.lt: sympy.Lt,
    operator.le: sympy.Le,
    operator.gt: sympy.Gt,
    operator.ge: sympy.Ge,
}


def _compare(op: Callable[[Any, Any], Any]) -> Callable[[TracedInt, Any], Any]:
    rel = _SYMPY_REL[op]

    def method(self: TracedInt, other: Any) -> Any:
        rhs = _parts(other)
        if rhs is None:
            if isinstance(other, float):
                return op(int.__int__(self), other)
            return NotImplemented
        outcome = bool(op(int.__int__(self), rhs[0]))
        sink = active_sink()
        if sink is not None and self.expr is not None and rhs[2] is not None:
            sink.record_predicate(rel(self.expr, rhs[2]), outcome)
        return outcome

    return method


class TracedInt(int):
    """An int read from a tensor's shape during capture; see the module docstring."""

    ir: Dimish
    expr: Any

    def __new__(cls, value: int, ir: Dimish, expr: Any) -> TracedInt:
        obj = super().__new__(cls, value)
        obj.ir = ir
        obj.expr = expr
        return obj

    def __repr__(self) -> str:
        return repr(int.__int__(self))

    def __str__(self) -> str:
        return str(self.__int__())

    def __hash__(self) -> int:
        return int.__hash__(self)

    __eq__ = _compare(operator.eq)
    __ne__ = _compare(operator.ne)
    __lt__ = _compare(operator.lt)
    __le__ = _compare(operator.le)
    __gt__ = _compare(operator.gt)
    __ge__ = _compare(operator.ge)

    __add__ = _arith(operator.add)
    __radd__ = _arith(operator.add, reflected=True)
    __sub__ = _arith(operator.sub)
    __rsub__ = _arith(operator.sub, reflected=True)
    __mul__ = _arith(operator.mul)
    __rmul__ = _arith(operator.mul, reflected=True)
    __floordiv__ = _arith(operator.floordiv)
    __rfloordiv__ = _arith(operator.floordiv, reflected=True)
    __mod__ = _arith(operator.mod)
    __rmod__ = _arith(operator.mod, reflected=True)

    def __neg__(self) -> TracedInt:
        return TracedInt(
            -int.__int__(self),
            _combine(self.ir, -1, operator.mul),
            _combine(self.expr, -1, operator.mul),
        )

    def __pos__(self) -> TracedInt:
        return self

    def __truediv__(self, other: Any) -> Any:
        return self.__int__() / other

    def __rtruediv__(self, other: Any) -> Any:
        return other / self.__int__()

    def __pow__(self, other: Any, mod: Any = None) -> Any:
        return pow(self.__int__(), other, mod)

    def __rpow__(self, other: Any, mod: Any = None) -> Any:
        return pow(other, self.__int__(), mod)

    # NOTE: int's own methods would compute from the sample's value and return a plain int
    # with no guard; each of these specializes first (floor, ceil, trunc and round of an int
    # are the int itself, so those keep tracking)
    __and__ = _plain_op(operator.and_)
    __rand__ = _plain_op(operator.and_, reflected=True)
    __or__ = _plain_op(operator.or_)
    __ror__ = _plain_op(operator.or_, reflected=True)
    __xor__ = _plain_op(operator.xor)
    __rxor__ = _plain_op(operator.xor, reflected=True)
    __lshift__ = _plain_op(operator.lshift)
    __rlshift__ = _plain_op(operator.lshift, reflected=True)
    __rshift__ = _plain_op(operator.rshift)
    __rrshift__ = _plain_op(operator.rshift, reflected=True)
    __divmod__ = _plain_op(divmod)
    __rdivmod__ = _plain_op(divmod, reflected=True)

    def __invert__(self) -> int:
        return ~self.__int__()

    def __abs__(self) -> int:
        return abs(self.__int__())

    def __floor__(self) -> TracedInt:
        return self

    def __ceil__(self) -> TracedInt:
        return self

    def __trunc__(self) -> TracedInt:
        return self

    def __round__(self, ndigits: Any = None) -> Any:
        if ndigits is None or ndigits >= 0:
            return self
        return round(self.__int__(), ndigits)

    def __format__(self, spec: str) -> str:
        return format(self.__int__(), spec)

    def bit_length(self) -> int:
        return self.__int__().bit_length()

    def bit_count(self) -> int:
        return self.__int__().bit_count()

    def to_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        return self.__int__().to_bytes(*args, **kwargs)

    def __float__(self) -> float:
        return float(self.__int__())

    def __int__(self) -> int:
        value = int.__int__(self)
        sink = active_sink()
        if sink is not None and self.expr is not None and not isinstance(self.ir, int):
            sink.specialize(self.expr, value)
        return value

    def __index__(self) -> int:
        return self.__int__()

    def __bool__(self) -> bool:
        return self != 0


def plain_int(v: Any) -> Any:
    """The plain value of a TracedInt without recording anything (for sample computations)."""
    return int.__int__(v) if isinstance(v, TracedInt) else v


class TracedSize(tuple):
    """What ``tensor.shape`` / ``tensor.size()`` return during capture: a tuple of dims
    (:class:`TracedInt` where tracked), with ``torch.Size``'s ``numel()``."""

    def __new__(cls, dims: Iterable[Any]) -> TracedSize:
        return super().__new__(cls, tuple(dims))

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        out = tuple.__getitem__(self, index)
        return TracedSize(out) if isinstance(index, slice) else out

    def __add__(self, other: Any) -> TracedSize:
        return TracedSize(tuple(self) + tuple(other))

    def __radd__(self, other: Any) -> TracedSize:
        return TracedSize(tuple(other) + tuple(self))

    def numel(self) -> Any:
        out: Any = 1
        for d in self:
            out = out * d
        return out

    def __repr__(self) -> str:
        return f"TracedSize({[plain_int(d) for d in self]})"
