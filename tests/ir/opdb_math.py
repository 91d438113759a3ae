"""Op-database samples for the pointwise math ops: float math in and out of its domain,
rounding at exact halves, IEEE predicates, and the binary math and bitwise ops (both signs of
divisors, Python scalars on either side where PyTorch has that overload).

Registered into :data:`tests.ir.opdb.GENERATORS` by that module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from plait.ir.ops.pointwise import FLOAT_MATH
from plait.ir.types import FLOAT_DTYPES

# NOTE: imported by tests/ir/opdb.py at its end, after these names exist there.
from tests.ir.opdb import BINARY_SHAPES, REDUCE_CASES, UNARY_SHAPES, Maker, Sample

# The domain each float-math op is drawn from (the gate redraws within the sample's range).
DOMAIN: dict[str, tuple[float, float]] = {
    "asin": (-0.99, 0.99),
    "acos": (-0.99, 0.99),
    "atanh": (-0.99, 0.99),
    "acosh": (1.01, 5.0),
    "log1p": (-0.9, 3.0),
    "log2": (0.1, 5.0),
    "log10": (0.1, 5.0),
}


def gen_float_math(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = getattr(torch, op)
    low, high = DOMAIN.get(op, (-3.0, 3.0))
    for shape, nc in UNARY_SHAPES:
        x = make(shape, dtype, noncontig=nc, low=low, high=high)
        yield Sample(op, [x], {}, lambda x=x: fn(x), f"{shape} nc={nc}")
    if dtype in FLOAT_DTYPES:
        # NOTE: out of the domain (NaN there) and large arguments (range reduction, overflow)
        x = make((9,), dtype, low=-4.0, high=4.0)
        yield Sample(op, [x], {}, lambda x=x: getattr(x, op)(), "wide")
        big = make((9,), dtype, low=-100.0, high=100.0)
        yield Sample(op, [big], {}, lambda x=big: fn(x), "large")


def _halves(shape: tuple[int, ...], dtype: torch.dtype, make: Maker) -> torch.Tensor:
    """Multiples of 0.5 (ties of round) and a few other values."""
    ints = torch.randint(-9, 10, shape, generator=make.g).to(torch.float64)
    return (ints / 2).to(dtype)


def gen_rounding(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn: Callable[..., Any] = getattr(torch, op)
    for shape, nc in UNARY_SHAPES:
        x = make(shape, dtype, noncontig=nc)
        yield Sample(
            op, [x], {} if op != "round" else {"decimals": 0}, lambda x=x: fn(x), f"{shape}"
        )
    if dtype in FLOAT_DTYPES:
        h = _halves((4, 6), dtype, make)
        attrs = {"decimals": 0} if op == "round" else {}
        yield Sample(op, [h], attrs, lambda: fn(h), "halves")
    if op == "round" and dtype in FLOAT_DTYPES:
        x = make((5, 7), dtype, low=-300.0, high=300.0)
        for d in (2, -1, 3):
            yield Sample(
                op,
                [x],
                {"decimals": d},
                lambda x=x, d=d: torch.round(x, decimals=d),
                f"decimals={d}",
            )


def gen_unary_misc(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = getattr(torch, op)
    for shape, nc in UNARY_SHAPES:
        x = make(shape, dtype, noncontig=nc)
        yield Sample(op, [x], {}, lambda x=x: fn(x), f"{shape} nc={nc}")
    if dtype in FLOAT_DTYPES:
        specials = torch.tensor([0.0, -0.0, 1.5, -2.5, float("inf"), float("-inf"), float("nan")])
        s = specials.to(dtype)
        yield Sample(op, [s], {}, lambda: fn(s), "special values")


def _nonzero(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t == 0, torch.ones_like(t), t)


# op -> (torch function, Python scalars it takes second, Python scalars it takes first)
BINARY_MATH: dict[str, tuple[Callable[..., Any], tuple[Any, ...], tuple[Any, ...]]] = {
    "atan2": (torch.atan2, (), ()),
    "hypot": (torch.hypot, (), ()),
    "copysign": (torch.copysign, (-1.0, 2), ()),
    "fmod": (torch.fmod, (2.5, -3), ()),
    "remainder": (torch.remainder, (2.5, -3), (5,)),
    "fmax": (torch.fmax, (), ()),
    "fmin": (torch.fmin, (), ()),
    "xlogy": (torch.xlogy, (2.0, 3), (2.0,)),
    "logical_xor": (torch.logical_xor, (), ()),
    "bitwise_and": (torch.bitwise_and, (3,), ()),
    "bitwise_or": (torch.bitwise_or, (3,), ()),
    "bitwise_xor": (torch.bitwise_xor, (3,), ()),
}
_DIVIDES = ("fmod", "remainder")


def _scalar_ok(op: str, dtype: torch.dtype, s: Any) -> bool:
    if op.startswith("bitwise"):
        return dtype != torch.bool
    if op in _DIVIDES and dtype not in FLOAT_DTYPES:
        return isinstance(s, int)  # an int tensor % 2.5 is float: kept, but only int scalars
    return True


def gen_binary_math(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn, seconds, firsts = BINARY_MATH[op]
    integral = dtype not in FLOAT_DTYPES
    for sa, sb, nc in BINARY_SHAPES:
        a = make(sa, dtype, noncontig=nc and len(sa) > 0, low=-5.0, high=5.0)
        if op in _DIVIDES and integral:
            # NOTE: a divisor range without zero (the gate redraws within it)
            b = make(sb, dtype, noncontig=nc and len(sb) > 0, positive=True, high=5.0)
        else:
            b = make(sb, dtype, noncontig=nc and len(sb) > 0, low=-3.0, high=3.0)
        if op == "xlogy" and dtype in FLOAT_DTYPES:
            b = b.abs() + 0.1
        yield Sample(op, [a, b], {}, lambda a=a, b=b: fn(a, b), f"{sa} {sb} nc={nc}")
    if op in _DIVIDES and integral and dtype != torch.uint8:
        a = make((4, 5), dtype, low=-20.0, high=20.0)
        neg = -make((4, 5), dtype, positive=True, high=5.0)
        yield Sample(op, [a, neg], {}, lambda a=a, neg=neg: fn(a, neg), "negative divisors")
    if op in _DIVIDES and not integral:
        a = make((4, 5), dtype, low=-20.0, high=20.0)
        neg = make((4, 5), dtype, low=-5.0, high=-0.5)
        yield Sample(op, [a, neg], {}, lambda a=a, neg=neg: fn(a, neg), "negative divisors")
    a = make((3, 4), dtype, positive=op in _DIVIDES and integral)
    for s in seconds:
        if _scalar_ok(op, dtype, s):
            x = a if op not in _DIVIDES else make((3, 4), dtype, low=-7.0, high=7.0)
            yield Sample(op, [x, s], {}, lambda x=x, s=s: fn(x, s), f"tensor op {s!r}")
    for s in firsts:
        if _scalar_ok(op, dtype, s) and not (op in _DIVIDES and integral):
            pos = a if op not in _DIVIDES else _nonzero(a)
            if op == "xlogy" and dtype != torch.bool:
                pos = a.abs() + 0.5 if not integral else _nonzero(a.abs())
            yield Sample(op, [s, pos], {}, lambda x=pos, s=s: fn(s, x), f"{s!r} op tensor")


def gen_nan_to_num(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    yield from gen_unary_misc("nan_to_num", dtype, make)
    if dtype in FLOAT_DTYPES:
        s = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 2.5]).to(dtype)
        attrs = {"nan": 1.5, "posinf": 100.3, "neginf": -7.1}
        yield Sample(
            "nan_to_num", [s], attrs, lambda: torch.nan_to_num(s, 1.5, 100.3, -7.1), "values"
        )


GENERATORS: dict[str, Callable[[torch.dtype, Maker], Iterator[Sample]]] = {}
GENERATORS["nan_to_num"] = gen_nan_to_num
for _op in FLOAT_MATH:
    GENERATORS[_op] = lambda d, m, op=_op: gen_float_math(op, d, m)
for _op in ("floor", "ceil", "trunc", "round", "frac"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_rounding(op, d, m)
for _op in ("sign", "bitwise_not", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
            "signbit"):  # fmt: skip
    GENERATORS[_op] = lambda d, m, op=_op: gen_unary_misc(op, d, m)
for _op in BINARY_MATH:
    GENERATORS[_op] = lambda d, m, op=_op: gen_binary_math(op, d, m)


# --- reductions ------------------------------------------------------------------------------
def _sparse(shape: tuple[int, ...], dtype: torch.dtype, make: Maker, nc: bool) -> torch.Tensor:
    """Random values with about a third of them zero."""
    x = make(shape, dtype, noncontig=nc)
    keep = torch.rand(x.shape, generator=make.g) > 0.33
    return torch.where(keep, x, torch.zeros((), dtype=dtype))


def _reduce_call(fn: Callable[..., Any], dims: tuple[int, ...] | None, keep: bool) -> Any:
    def call(x: torch.Tensor) -> Any:
        if dims is None and not keep:
            return fn(x)
        return fn(x, dims if dims is not None else tuple(range(x.dim())), keepdim=keep)

    return call


def gen_logical_reduce(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = getattr(torch, op)
    for shape, dims, keep, nc in REDUCE_CASES:
        if op == "count_nonzero" and keep:
            continue
        x = _sparse(shape, dtype, make, nc)
        attrs: dict[str, Any] = {"dims": dims}
        if op == "count_nonzero":
            call = (lambda x, d=dims: fn(x, dim=d)) if dims else fn
        else:
            attrs["keepdim"] = keep
            call = _reduce_call(fn, dims, keep)
        yield Sample(op, [x], attrs, lambda x=x, c=call: c(x), f"{shape} dims={dims} keep={keep}")
    ones = torch.ones((4, 5), dtype=dtype)
    attrs = {"dims": (1,)} if op == "count_nonzero" else {"dims": (1,), "keepdim": False}
    yield Sample(op, [ones], attrs, lambda: fn(ones, 1), "all nonzero")


def gen_nansum_prod(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = getattr(torch, op)
    for shape, dims, keep, nc in REDUCE_CASES:
        if op == "prod" and dims is not None and len(dims) > 1:
            continue
        if op == "prod":
            x = make(shape, dtype, noncontig=nc, low=0.5 if dtype in FLOAT_DTYPES else -2, high=1.6)
        else:
            x = make(shape, dtype, noncontig=nc)
        if op == "nansum" and dtype in FLOAT_DTYPES and x.dim() > 0:
            x[..., ::3] = float("nan")
        attrs = {"dims": dims, "keepdim": keep}
        if op == "prod" and dims is not None:
            call: Callable[..., Any] = lambda x, d=dims[0], k=keep: fn(x, d, keepdim=k)
        elif op == "prod":
            call = lambda x, k=keep: fn(x).reshape([1] * x.dim()) if k else fn(x)
        else:
            call = _reduce_call(fn, dims, keep)
        yield Sample(op, [x], attrs, lambda x=x, c=call: c(x), f"{shape} dims={dims} keep={keep}")
    if dtype in FLOAT_DTYPES and dtype != torch.float64:
        x = make((4, 6), dtype, low=0.5, high=1.5)
        yield Sample(
            op,
            [x],
            {"dims": (1,), "keepdim": False, "dtype": torch.float64},
            lambda: fn(x, 1, dtype=torch.float64),
            "accumulate in f64",
        )


def gen_logsumexp(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, dims, keep, nc in REDUCE_CASES:
        d = dims if dims is not None else tuple(range(len(shape))) or (0,)
        x = make(shape, dtype, noncontig=nc, low=-30.0, high=30.0)
        yield Sample(
            "logsumexp",
            [x],
            {"dims": d, "keepdim": keep},
            lambda x=x, d=d, k=keep: torch.logsumexp(x, d, keepdim=k),
            f"{shape} dims={d} keep={keep}",
        )


for _op in ("all", "any", "count_nonzero"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_logical_reduce(op, d, m)
for _op in ("nansum", "prod"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_nansum_prod(op, d, m)
GENERATORS["logsumexp"] = gen_logsumexp


# --- activations ----------------------------------------------------------------------------
ACTIVATIONS: dict[str, list[tuple[dict[str, Any], Callable[..., Any]]]] = {
    "leaky_relu": [
        ({"negative_slope": 0.01}, lambda x: F.leaky_relu(x)),
        ({"negative_slope": 0.3}, lambda x: F.leaky_relu(x, 0.3)),
    ],
    "hardsigmoid": [({}, F.hardsigmoid)],
    "hardswish": [({}, F.hardswish)],
    "elu": [
        ({"alpha": 1.0, "scale": 1.0, "input_scale": 1.0}, F.elu),
        ({"alpha": 0.7, "scale": 1.0, "input_scale": 1.0}, lambda x: F.elu(x, 0.7)),
        (
            {"alpha": 1.6732632423543772, "scale": 1.0507009873554805, "input_scale": 1.0},
            F.selu,
        ),
        ({"alpha": 1.3, "scale": 1.0, "input_scale": 1.0 / 1.3}, lambda x: F.celu(x, 1.3)),
    ],
    "softplus": [
        ({"beta": 1.0, "threshold": 20.0}, F.softplus),
        ({"beta": 2.0, "threshold": 3.0}, lambda x: F.softplus(x, 2.0, 3.0)),
    ],
    "mish": [({}, F.mish)],
    "logsigmoid": [({}, F.logsigmoid)],
    "hardshrink": [({"lambd": 0.5}, F.hardshrink), ({"lambd": 0.3}, lambda x: x.hardshrink(0.3))],
    "softshrink": [
        ({"lambd": 0.5}, F.softshrink),
        ({"lambd": 0.3}, lambda x: F.softshrink(x, 0.3)),
    ],
    "threshold": [({"threshold": 0.1, "value": 20.0}, lambda x: F.threshold(x, 0.1, 20.0))],
}
# NOTE: values at the bounds, where rounding a bound to a 16-bit dtype decides the result
EDGES: dict[str, list[float]] = {
    "hardshrink": [0.30078125, -0.30078125, 0.5, -0.5, 0.3, 0.2998046875],
    "softshrink": [0.30078125, -0.30078125, 0.5, -0.5, 0.3, -0.3],
    "threshold": [0.1, 0.10009765625, 0.0999755859375, 0.0999999940395355],
}


def gen_activation(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for attrs, fn in ACTIVATIONS[op]:
        for shape, nc in UNARY_SHAPES:
            x = make(shape, dtype, noncontig=nc, low=-6.0, high=6.0)
            yield Sample(op, [x], dict(attrs), lambda x=x, fn=fn: fn(x), f"{shape} {attrs}")
        if op in EDGES:
            e = torch.tensor(EDGES[op], dtype=torch.float64).to(dtype)
            yield Sample(op, [e], dict(attrs), lambda x=e, fn=fn: fn(x), f"bounds {attrs}")


for _op in ACTIVATIONS:
    GENERATORS[_op] = lambda d, m, op=_op: gen_activation(op, d, m)


def gen_cumsum(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    """Running sums along a dim: last, first, negative, of a non-contiguous input, of a 0-d one
    and of an empty dim, with PyTorch's result dtype or one asked for."""
    for shape, dim, nc, out in (
        ((3, 5, 7), -1, False, None),
        ((6, 4), 0, True, None),
        ((2, 9), 1, False, torch.float64),
        ((), 0, False, None),
        ((0, 3), 0, False, None),
    ):
        if out is not None and not dtype.is_floating_point:
            out = torch.int64
        x = make(shape, dtype, noncontig=nc)
        yield Sample(
            "cumsum", [x], {"dim": dim, "dtype": out},
            lambda x=x, d=dim, o=out: torch.cumsum(x, d, dtype=o),
            f"{shape} dim={dim} dtype={out}",
        )  # fmt: skip


GENERATORS["cumsum"] = gen_cumsum
