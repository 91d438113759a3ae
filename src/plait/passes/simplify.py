"""Algebraic simplification: identities, cancelling pairs, collapsed view chains.

Results are bitwise what the original computes for every input, NaN, +-0 and +-inf included: a
rule fires only where its identity holds in IEEE arithmetic. ``x + (-0.0)`` and ``x - 0.0`` are
``x``, but ``x + 0.0`` is not (``-0.0 + 0.0`` is ``+0.0``), nor ``x - (-0.0)``; ``x * 1``,
``x / 1`` and ``x ** 1`` are ``x``; ``x * 0``, ``x - x`` and ``x == x`` have no rule (inf and NaN).
The driver refuses any rule that would change a type.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from plait.ir import TensorType, Value
from plait.passes.manager import VALUE_EQUAL, PassContext, register_pass
from plait.passes.rewrite import Lit, Match, Op, Rule, Var, apply_rules


def _type(v: Any) -> TensorType:
    assert isinstance(v, Value) and isinstance(v.type, TensorType)
    return v.type


def _same_shape(m: Match) -> Any:
    """The view is a no-op when the result has the input's shape."""
    x = m["x"]
    if str(_type(x)) == str(m.root.outputs[0].type):
        return x
    return None


def _is(value: float) -> Any:
    return lambda v: not isinstance(v, bool) and v == value


def _float_operand(x: Any) -> bool:
    return _type(x).dtype.is_floating_point or _type(x).dtype.is_complex


def _zero_identity(m: Match, subtract: bool) -> Any:
    """``x + alpha * z`` (``x - alpha * z`` when ``subtract``) with ``z`` a zero literal is ``x``
    bitwise: always for integer ``x``; for floating ``x`` only with ``alpha == 1`` (``inf * 0`` is
    NaN) and the zero of the sign that keeps ``x = -0.0``: ``-0.0 + (-0.0)`` and ``-0.0 - 0.0`` are
    ``-0.0``, ``-0.0 + 0.0`` and ``-0.0 - (-0.0)`` are ``+0.0``."""
    x, z, alpha = m["x"], m["z"], m.root.attrs.get("alpha", 1)
    if not _float_operand(x):
        return x
    if isinstance(alpha, bool) or alpha != 1:
        return None
    negative_zero = isinstance(z, float) and math.copysign(1.0, z) < 0
    return x if negative_zero != subtract else None


def _compose_permute(m: Match, emit: Any) -> Any:
    inner = m["inner"].attrs["dims"]
    outer = m.root.attrs["dims"]
    n = len(inner)
    dims = tuple(inner[d % n] % n for d in outer)
    if dims == tuple(range(n)):
        return m["x"]
    return emit("permute", m["x"], dims=dims)


def _identity_permute(m: Match) -> Any:
    n = _type(m["x"]).rank
    return m["x"] if tuple(d % max(n, 1) for d in m.root.attrs["dims"]) == tuple(range(n)) else None


def _reshape_chain(m: Match, emit: Any) -> Any:
    return emit("reshape", m["x"], shape=_type(m.root.outputs[0]).shape)


_EXACT_WIDENING = {
    torch.float16: (torch.float32, torch.float64),
    torch.bfloat16: (torch.float32, torch.float64),
    torch.float32: (torch.float64,),
    torch.int8: (torch.int16, torch.int32, torch.int64),
    torch.int16: (torch.int32, torch.int64),
    torch.int32: (torch.int64,),
    torch.uint8: (torch.int16, torch.int32, torch.int64),
}


def _cast_round_trip(m: Match) -> Any:
    """``to(wider)`` then back to the original dtype is exact: drop both."""
    x = m["x"]
    src, mid = _type(x).dtype, m["inner"].attrs["dtype"]
    if m.root.attrs["dtype"] == src and mid in _EXACT_WIDENING.get(src, ()):
        return x
    return None


RULES = [
    Rule("simplify.mul-one", Op("mul", Var("x"), Lit(_is(1))), lambda m, e: m["x"]),
    Rule("simplify.one-mul", Op("mul", Lit(_is(1)), Var("x")), lambda m, e: m["x"]),
    Rule(
        "simplify.add-zero",
        Op("add", Var("x"), Lit(_is(0), name="z")),
        lambda m, e: _zero_identity(m, subtract=False),
    ),
    Rule(
        "simplify.zero-add",
        Op("add", Lit(_is(0), name="z"), Var("x"), attrs=lambda a: a["alpha"] == 1),
        lambda m, e: _zero_identity(m, subtract=False),
    ),
    Rule(
        "simplify.sub-zero",
        Op("sub", Var("x"), Lit(_is(0), name="z")),
        lambda m, e: _zero_identity(m, subtract=True),
    ),
    Rule(
        "simplify.div-one",
        Op("div", Var("x"), Lit(_is(1)), attrs=lambda a: a["rounding_mode"] is None),
        lambda m, e: m["x"],
    ),
    Rule("simplify.pow-one", Op("pow", Var("x"), Lit(_is(1))), lambda m, e: m["x"]),
    Rule("simplify.double-neg", Op("neg", Op("neg", Var("x"))), lambda m, e: m["x"]),
    Rule(
        "simplify.double-not", Op("logical_not", Op("logical_not", Var("x"))), lambda m, e: m["x"]
    ),
    Rule(
        "simplify.cast-same-dtype",
        Op("to_dtype", Var("x")),
        lambda m, e: m["x"] if _type(m["x"]).dtype == m.root.attrs["dtype"] else None,
    ),
    Rule(
        "simplify.cast-round-trip",
        Op("to_dtype", Op("to_dtype", Var("x"), name="inner")),
        lambda m, e: _cast_round_trip(m),
    ),
    Rule(
        "simplify.dropout-eval",
        Op("dropout", Var("x"), attrs=lambda a: not a["train"] or a["p"] == 0.0),
        lambda m, e: m["x"],
    ),
    Rule(
        "simplify.identity-view",
        Op(("reshape", "view", "expand", "contiguous", "squeeze", "flatten", "slice"), Var("x")),
        lambda m, e: _same_shape(m),
    ),
    Rule(
        "simplify.zero-pad",
        Op("constant_pad", Var("x"), attrs=lambda a: not any(a["pad"])),
        lambda m, e: _same_shape(m),
    ),
    Rule("simplify.identity-permute", Op("permute", Var("x")), lambda m, e: _identity_permute(m)),
    Rule(
        "simplify.permute-permute",
        Op("permute", Op("permute", Var("x"), name="inner")),
        _compose_permute,
    ),
    Rule(
        "simplify.reshape-chain",
        Op(("reshape", "view"), Op(("reshape", "view"), Var("x"))),
        _reshape_chain,
    ),
]


@register_pass("simplify", VALUE_EQUAL, rules=tuple(r.name for r in RULES))
def simplify(graph: Any, ctx: PassContext) -> Any:
    """Remove identities (x*1, x+0, casts to the same dtype, no-op views and pads, eval
    dropout), cancel pairs (double neg, permute chains, lossless cast round trips), collapse
    reshape chains."""
    return apply_rules(graph, RULES, ctx.record)
