"""Sizes read by the program: ints that record a guard when the program compares them.

A :class:`TracedInt` (what a symbolic dim reads as with ``dynamic=True``) holds its value in the
capture sample and

- ``ir``: what the IR uses for it: a sympy expression over the input symbols (or an int);
- ``expr``: the same quantity as an expression over the *input-dim symbols*, used to write and
  re-evaluate guards (``None`` when the size is not tied to an input dim).

Comparing it records a guard (``x.shape[0] > 2``, expected ``True``) with the active capture and
returns a plain ``bool``. Arithmetic with ints keeps tracking. Everything that turns it into a
plain Python value (``__index__``: ``range``, ``operator.index``, ``[0] * n``, indexing a list;
``int()``, ``float()``: ``0.5 * n``, ``math.log``; ``str()``, ``hash()``, bitwise operators,
``divmod``, ``abs``) specializes it: an equality guard. It is a ``torch.SymInt``, not an ``int``
subclass, so that CPython reaches those methods; ``isinstance(n, int)`` still holds
(docs/capture.md, "Dynamic shapes").

Example:
    >>> import sympy
    >>> s = sympy.Symbol("s0", integer=True, positive=True)
    >>> n = TracedInt(4, s, s)
    >>> (n * 2 + 1) == 9, isinstance(n * 2, TracedInt), isinstance(n, int)
    (True, True, True)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any, Protocol, SupportsIndex

import sympy
import torch

from plait.errors import InternalCompilerError


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
        return v._value, v.ir, v.expr
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


def _leaves_ints(other: Any) -> bool:
    """Whether arithmetic with ``other`` leaves the int world on a Python number (a float,
    a complex): the size is then specialized. Anything else (a tensor, a list) is left to
    its own reflected method, which reads the size through ``__index__`` if it needs one."""
    return isinstance(other, (float, complex)) and not isinstance(other, bool)


def _arith(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self: TracedInt, other: Any) -> Any:
        rhs = _parts(other)
        if rhs is None:
            if not _leaves_ints(other):
                return NotImplemented
            plain = self.__int__()
            return fn(other, plain) if reflected else fn(plain, other)
        lhs = (self._value, self.ir, self.expr)
        x, y = (rhs, lhs) if reflected else (lhs, rhs)
        value = fn(x[0], y[0])
        return TracedInt(value, _combine(x[1], y[1], fn), _combine(x[2], y[2], fn))

    return method


def _plain_op(fn: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    """An operator that leaves the tracked world: computed on the specialized value."""

    def method(self: TracedInt, other: Any, *mod: Any) -> Any:
        if isinstance(other, TracedInt):
            other = other.__int__()
        elif not isinstance(other, (int, float, complex)):
            return NotImplemented
        plain = self.__int__()
        return fn(other, plain, *mod) if reflected else fn(plain, other, *mod)

    return method


def _unary(fn: Callable[[int], Any]) -> Callable[[TracedInt], Any]:
    """A conversion or unary operator computed on the specialized value."""

    def method(self: TracedInt) -> Any:
        return fn(self.__int__())

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
            if isinstance(other, float):  # NOTE: a float compares with the specialized value
                return op(self.__int__(), other)
            return NotImplemented
        outcome = bool(op(self._value, rhs[0]))
        sink = active_sink()
        if sink is not None and self.expr is not None and rhs[2] is not None:
            sink.record_predicate(rel(self.expr, rhs[2]), outcome)
        return outcome

    return method


class TracedInt(torch.SymInt):
    """A size read from a tensor's shape during capture; see the module docstring.

    NOTE: a ``torch.SymInt``, not an ``int``: CPython reads an int subclass's value without
    calling any of its methods (``range``, ``operator.index``, ``0.5 * n``, ``math.log``,
    ``[0] * n``), which would bake the sample's size in unguarded; a SymInt reaches
    ``__index__``/``__float__`` there. PyTorch's argument parser accepts a SymInt for an int
    parameter without converting it, so a traced call still sees the size itself."""

    ir: Dimish
    expr: Any
    _value: int

    def __init__(self, value: int, ir: Dimish, expr: Any) -> None:
        # NOTE: SymInt.__init__ is not called: there is no SymNode; ``node`` raises
        self._value = int(value)
        self.ir = ir
        self.expr = expr

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # NOTE: isinstance() reads __class__ after the real type: ``isinstance(n, int)`` (and
        # numbers.Integral) holds, as for the int it stands for; CPython's own int checks
        # read the real type, so conversions still reach __index__
        return int

    def __copy__(self) -> int:
        return self.__int__()

    def __deepcopy__(self, memo: Any) -> int:
        return self.__int__()

    def __reduce__(self) -> Any:
        return (int, (self.__int__(),))

    @property
    def node(self) -> Any:
        # NOTE: PyTorch's C++ asked for a SymInt's node: a call no rule converts the size for
        # (functorch's vmap takes the batch size so): the capture refuses it, which its sink
        # keeps even where the program's own cleanup raises another error after it
        sink = active_sink()
        refuse = getattr(sink, "limitation", None)
        if refuse is not None:
            refuse(f"a size ({self._value}) reached PyTorch's C++ where no capture rule runs")
        raise InternalCompilerError(
            "a traced size reached PyTorch unconverted (plait capture should have passed its "
            f"value {self._value})"
        )

    def __repr__(self) -> str:
        return repr(self._value)

    __str__ = _unary(str)
    __hash__ = _unary(hash)

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
            -self._value,
            _combine(self.ir, -1, operator.mul),
            _combine(self.expr, -1, operator.mul),
        )

    def __pos__(self) -> TracedInt:
        return self

    # NOTE: each of these leaves the int world (or computes what no expression here
    # tracks): the size is specialized first (floor, ceil, trunc and round of an int are the
    # int itself, so those keep tracking)
    __truediv__ = _plain_op(operator.truediv)
    __rtruediv__ = _plain_op(operator.truediv, reflected=True)
    __pow__ = _plain_op(pow)
    __rpow__ = _plain_op(pow, reflected=True)
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
    __invert__ = _unary(operator.invert)
    __abs__ = _unary(abs)
    __float__ = _unary(float)
    __complex__ = _unary(complex)
    __sym_float__ = _unary(float)
    bit_length = _unary(int.bit_length)
    bit_count = _unary(int.bit_count)
    conjugate = _unary(int.conjugate)
    as_integer_ratio = _unary(int.as_integer_ratio)

    def __sym_max__(self, other: Any) -> Any:
        return self if self >= other else other

    def __sym_min__(self, other: Any) -> Any:
        return self if self <= other else other

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

    def __getattr__(self, name: str) -> Any:
        # NOTE: the rest of int's interface (to_bytes, real, numerator, ...): specialized
        if name.startswith("__") or not hasattr(int, name):
            raise AttributeError(name)
        return getattr(self.__int__(), name)

    def __int__(self) -> int:
        value = self._value
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
    return v._value if isinstance(v, TracedInt) else v


def is_intlike(v: Any) -> bool:
    """Whether ``v`` is an int argument: a Python int (not a bool) or a traced size."""
    return isinstance(v, TracedInt) or (isinstance(v, int) and not isinstance(v, bool))


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

    def __mul__(self, n: SupportsIndex) -> TracedSize:
        return TracedSize(tuple(self) * n)

    __rmul__ = __mul__

    def numel(self) -> Any:
        out: Any = 1
        for d in self:
            out = out * d
        return out

    # NOTE: torch.Size cannot be subclassed; isinstance(x.shape, torch.Size) reads __class__
    # when the type itself is no subclass, as it does for proxies, so the program's test of a
    # shape takes eager's branch
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch.Size

    def __repr__(self) -> str:
        # NOTE: the program's text of a shape depends on its dims: each is read (str of a
        # traced size specializes it), as eager's text would differ with them
        return f"torch.Size([{', '.join(str(d) for d in self)}])"

    __str__ = __repr__
