"""Scalar rules: each pointwise IR op as kernel-IR statements, with PyTorch's semantics.

A rule receives its operands already loaded (statements in their compute types, or Python
literals) and returns one statement in the compute type of the node's output dtype; the caller
rounds 16-bit results. Semantics follow eager PyTorch on the CPU: type promotion from the IR's own
rules, 16-bit floats computed in float32 ("opmath") with Python scalars kept at float32 precision,
integer arithmetic that wraps, integer division by zero reported as an error, NaN-propagating
maximum/minimum, relu and clamp as PyTorch writes them (NaN and -0.0 pass through), and
PyTorch's special cases for ``pow`` by a scalar.

Example:
    >>> sorted(RULES)[:4]
    ['abs', 'acos', 'acosh', 'add']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from plait.codegen.index import Ix
from plait.codegen.kir import KernelBuilder, Stmt, is_float, scalar_of
from plait.codegen.scalar_activations import ACTIVATIONS
from plait.codegen.scalar_args import (
    Arg,
    Rule,
    cast,
    narrow,
    one_element,
    out_type,
    rules_into,
    storage_type,
    to,
    unary_float,
)
from plait.ir.graph import Node
from plait.ir.ops.pointwise import FLOAT_MATH
from plait.ir.ops.rules import float_dtype, promote
from plait.ir.types import TensorType, scalar_type_of

RULES: dict[str, Rule] = {}
rule = rules_into(RULES)


def _out_dtype(node: Node) -> torch.dtype:
    t = node.outputs[0].type
    assert isinstance(t, TensorType)
    return t.dtype


def _common(args: Sequence[Arg]) -> torch.dtype:
    types = [a.type for a in args if a.type is not None]
    dtype = promote(types[0], types[1] if len(types) > 1 else None)
    return dtype


# --- unary math -----------------------------------------------------------------------------
@rule("exp", "log", "sqrt", "tanh", "erf")
def _transcendental(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    return b.op(node.op, [x], t)


# NOTE: the largest arguments whose exp is finite. ATen's vectorized sinh and cosh (Sleef) go
# through exp(|x|) and overflow past these, where std:: (and the true value) is finite up to
# ln(2 * max): eager's contiguous loop gives the infinity, so does plait.
_EXP_FINITE = {"f32": 88.72283172607422, "f64": 709.782712893384}


@rule(*FLOAT_MATH)
def _float_math(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    """libm's function in the compute type (PyTorch: Sleef or std::, within a few ulp)."""
    x, t = unary_float(b, node, args)
    y = b.op(node.op, [x], t)
    if node.op in ("sinh", "cosh"):
        overflow = b.op("gt", [b.op("abs", [x], t), b.const(_EXP_FINITE[t], t)], "b")
        inf = b.const(math.inf, t)
        big = inf if node.op == "cosh" else b.op("copysign", [inf, x], t)
        y = b.op("where", [overflow, big, y], t)
    return y


@rule("floor", "ceil", "trunc")
def _rounding(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x = to(b, args[0], t)
    return b.op(node.op, [x], t) if is_float(t) else x


@rule("round")
def _round(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x = to(b, args[0], t)
    if not is_float(t):
        return x
    decimals = node.attrs["decimals"]
    if decimals == 0:
        return b.op("rint", [x], t)  # NOTE: half to even under the default rounding mode
    # NOTE: ATen's round_decimals: a power of ten computed in double, cast to the compute type;
    # rint(x * p) / p, or rint(x / p) * p for negative decimals.
    p = b.const(float(10.0 ** abs(decimals)), t)
    if decimals > 0:
        return b.op("div", [b.op("rint", [b.op("mul", [x, p], t)], t), p], t)
    return b.op("mul", [b.op("rint", [b.op("div", [x, p], t)], t), p], t)


@rule("frac")
def _frac(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    return b.op("sub", [x, b.op("trunc", [x], t)], t)


@rule("sign")
def _sign(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    # NOTE: ATen's ``(0 < x) - (x < 0)``: NaN gives 0, -0.0 gives +0.0.
    t = out_type(node)
    x = to(b, args[0], t)
    if t == "b":
        return x
    zero = b.const(0, t)
    pos, neg = b.op("lt", [zero, x], "b"), b.op("lt", [x, zero], "b")
    return b.op("sub", [cast(b, pos, t), cast(b, neg, t)], t)


@rule("bitwise_not")
def _bitwise_not(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x = to(b, args[0], t)
    return b.op("not", [x], "b") if t == "b" else b.op("bnot", [x], t)


@rule("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit")
def _predicate(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    a = args[0]
    assert isinstance(a.type, TensorType)
    t = scalar_of(a.type.dtype)
    x = to(b, a, t)
    if not is_float(t):
        if node.op == "isfinite":
            return b.const(True, "b")
        if node.op == "signbit" and t not in ("b", "u8"):
            return b.op("lt", [x, b.const(0, t)], "b")
        return b.const(False, "b")
    inf = b.const(math.inf, t)
    if node.op == "isnan":
        return b.op("ne", [x, x], "b")
    if node.op == "isinf":
        return b.op("eq", [b.op("abs", [x], t), inf], "b")
    if node.op == "isfinite":
        return b.op("lt", [b.op("abs", [x], t), inf], "b")
    if node.op == "isposinf":
        return b.op("eq", [x, inf], "b")
    if node.op == "isneginf":
        return b.op("eq", [x, b.const(-math.inf, t)], "b")
    return b.op("signbit", [x], "b")


@rule("rsqrt")
def _rsqrt(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    return b.op("div", [b.const(1.0, t), b.op("sqrt", [x], t)], t)


@rule("reciprocal")
def _reciprocal(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    return b.op("div", [b.const(1.0, t), x], t)


@rule("neg")
def _neg(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    return b.op("neg", [to(b, args[0], t)], t)


@rule("abs")
def _abs(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    return b.op("abs", [to(b, args[0], t)], t)


@rule("logical_not")
def _not(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    return b.op("not", [to(b, args[0], "b")], "b")


@rule("to_dtype", "contiguous")
def _to_dtype(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    return to(b, args[0], out_type(node))


# --- binary ---------------------------------------------------------------------------------
def _scaled(b: KernelBuilder, x: Stmt, alpha: Any, dtype: torch.dtype) -> Stmt:
    if alpha == 1:
        return x
    # NOTE: ATen converts alpha to the tensor's dtype (``alpha.to<scalar_t>()``), as an operand
    t = scalar_of(dtype)
    return b.op("mul", [narrow(b, Arg(None, alpha, scalar_type_of(alpha)), dtype), x], t)


@rule("add", "sub")
def _add_sub(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t, dtype = out_type(node), _out_dtype(node)
    x, y = narrow(b, args[0], dtype), narrow(b, args[1], dtype)
    if t == "b":
        return b.op("or", [x, y], "b")
    alpha = node.attrs.get("alpha", 1)
    if alpha != 1 and is_float(t):
        return _fused_scaled(b, node.op, x, y, alpha, dtype)
    y = _scaled(b, y, alpha, dtype)
    return b.op(node.op, [x, y], t)


def _fused_scaled(
    b: KernelBuilder, op: str, x: Stmt, y: Stmt, alpha: Any, dtype: torch.dtype
) -> Stmt:
    """``x +- alpha * y`` as ATen's float kernel computes it: one fused multiply-add
    (``vec::fmadd``; its scalar loop is contracted to one too), the product never rounded, so
    an infinite ``x`` beside a finite ``y`` whose scaled value overflows is ``x`` (not
    ``inf - inf``). float32 (and 16-bit, computed in float32): in float64, where the product is
    exact and cannot overflow, rounded once more at the end. float64: product and sum, with an
    infinite ``x`` beside a finite product (``y`` and ``alpha`` finite) giving ``x`` (a
    rounding apart from the fused form)."""
    t = scalar_of(dtype)
    if t == "f32":
        # NOTE: alpha as ATen reads it (converted to the dtype), held exactly in float64
        # (an int straight from int64: through float64 it would round twice)
        wide = None if isinstance(alpha, int) else torch.float64
        a = b.const(float(torch.tensor(alpha, dtype=wide).to(dtype)), "f64")
        product = b.op("mul", [a, b.cast(y, "f64")], "f64")
        return b.cast(b.op(op, [b.cast(x, "f64"), product], "f64"), t)
    if not math.isfinite(float(alpha)):
        return b.op(op, [x, _scaled(b, y, alpha, dtype)], t)  # NOTE: the product is not finite
    inf = b.const(math.inf, t)
    infinite_x = b.op("eq", [b.op("abs", [x], t), inf], "b")
    finite_y = b.op("lt", [b.op("abs", [y], t), inf], "b")
    keep = b.op("and", [infinite_x, finite_y], "b")
    return b.op("where", [keep, x, b.op(op, [x, _scaled(b, y, alpha, dtype)], t)], t)


@rule("mul")
def _mul(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x, y = _opmath_second(b, node, args)
    return b.op("and" if t == "b" else "mul", [x, y], t)


def _opmath_second(b: KernelBuilder, node: Node, args: Sequence[Arg]) -> tuple[Stmt, Stmt]:
    """mul's and div's operands: ATen reads a second operand of one element at the compute
    type's precision (``original_scalar_value<opmath_t>``), the rest rounded to the dtype."""
    t, dtype = out_type(node), _out_dtype(node)
    second = to(b, args[1], t) if one_element(args[1]) else narrow(b, args[1], dtype)
    return narrow(b, args[0], dtype), second


@rule("div")
def _div(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x, y = _opmath_second(b, node, args)
    mode = node.attrs.get("rounding_mode")
    if mode is None:
        return b.op("div", [x, y], t)
    if is_float(t):
        if mode == "trunc" and not one_element(args[1]):
            # NOTE: ATen's tensor path divides in the 16-bit type, then truncates the rounded
            # quotient (bf16 -5.125 / 0.466796875 is -11.0, truncated -11); one element: opmath
            quotient = b.round(b.op("div", [x, y], t), storage_type(node))
            return b.op("trunc", [quotient], t)
        return b.op("fdiv_trunc" if mode == "trunc" else "fdiv_floor", [x, y], t)
    return b.op("idiv_trunc" if mode == "trunc" else "idiv_floor", [x, y], t)


@rule("pow")
def _pow(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t, dtype = out_type(node), _out_dtype(node)
    x = narrow(b, args[0], dtype)
    if not is_float(t):
        return b.op("ipow", [x, to(b, args[1], t)], t)
    e = args[1].literal if args[1].stmt is None else None
    # NOTE: PyTorch's pow_tensor_scalar special cases, for float32/64 and bfloat16 (float16
    # calls pow for every exponent: pow(-inf, 0.5) is +inf there, sqrt(-inf) NaN); the rest
    # call pow.
    out = node.outputs[0].type
    special = isinstance(out, TensorType) and out.dtype != torch.float16
    if (
        special
        and isinstance(e, (int, float))
        and not isinstance(e, bool)
        and args[0].stmt is not None
    ):
        one = b.const(1.0, t)
        if e == 2:
            return b.op("mul", [x, x], t)
        if e == 3:
            return b.op("mul", [b.op("mul", [x, x], t), x], t)
        if e == 0.5:
            return b.op("sqrt", [x], t)
        if e == -0.5:
            return b.op("div", [one, b.op("sqrt", [x], t)], t)
        if e == -1:
            return b.op("div", [one, x], t)
        if e == -2:
            return b.op("div", [one, b.op("mul", [x, x], t)], t)
    if isinstance(e, (int, float)) and _read_as(e, dtype) == 0.5 and args[0].stmt is not None:
        # NOTE: a pow whose exponent reads as 0.5 in the kernel (float16's 0.5, any float's
        # 0.5000000001 that rounds to it): GCC turns a vectorized pow by a constant 0.5 into
        # sqrt, which differs at -0 (pow: +0) and -inf (pow: +inf); written out as pow's result.
        root = b.op("add", [b.op("sqrt", [x], t), b.const(0.0, t)], t)
        minus_inf = b.op("eq", [x, b.const(-math.inf, t)], "b")
        return b.op("where", [minus_inf, b.const(math.inf, t), root], t)
    return b.op("pow", [x, narrow(b, args[1], dtype)], t)


def _read_as(e: float, dtype: torch.dtype) -> float:
    """The exponent as the kernel reads it: rounded to the operation's float dtype (a float64
    kernel reads it as it is)."""
    return float(torch.tensor(float(e), dtype=torch.float64).to(dtype))


@rule("maximum", "minimum")
def _maxmin(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x, y = to(b, args[0], t), to(b, args[1], t)
    if t == "b":
        return b.op("or" if node.op == "maximum" else "and", [x, y], "b")
    return b.op("max" if node.op == "maximum" else "min", [x, y], t)


@rule("atan2", "hypot", "copysign")
def _float_binary(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t, dtype = out_type(node), _out_dtype(node)
    return b.op(node.op, [narrow(b, args[0], dtype), narrow(b, args[1], dtype)], t)


@rule("fmax", "fmin")
def _fmaxmin(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x, y = to(b, args[0], t), to(b, args[1], t)
    if not is_float(t):
        return b.op("max" if node.op == "fmax" else "min", [x, y], t)
    # NOTE: of two equal values (+0, -0) eager returns the first, but the second for bfloat16
    # (its kernel's operand order, in the vector and the scalar loop alike).
    return b.op(node.op, [y, x] if storage_type(node) == "bf16" else [x, y], t)


@rule("fmod", "remainder")
def _mod(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t, dtype = out_type(node), _out_dtype(node)
    x, y = narrow(b, args[0], dtype), narrow(b, args[1], dtype)
    if not is_float(t):
        return b.op("imod_trunc" if node.op == "fmod" else "imod_floor", [x, y], t)
    mod = b.op("fmod", [x, y], t)
    if node.op == "fmod":
        return mod
    # NOTE: ATen's remainder: fmod, then ``mod + b`` where mod is nonzero and its sign differs
    # from b's (the result takes the divisor's sign, as Python's %).
    zero = b.const(0.0, t)
    differ = b.op("ne", [b.op("lt", [y, zero], "b"), b.op("lt", [mod, zero], "b")], "b")
    fix = b.op("and", [b.op("ne", [mod, zero], "b"), differ], "b")
    return b.op("where", [fix, b.op("add", [mod, y], t), mod], t)


@rule("xlogy")
def _xlogy(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    # NOTE: ATen: NaN where y is NaN, else 0 where x == 0, else x * log(y); 16-bit dtypes round
    # log(y) to their precision first (ATen computes std::log on the 16-bit type).
    t, dtype = out_type(node), _out_dtype(node)
    x, y = narrow(b, args[0], dtype), narrow(b, args[1], dtype)
    log = b.round(b.op("log", [y], t), storage_type(node))
    product = b.op("mul", [x, log], t)
    zero = b.const(0.0, t)
    y_nan = b.op("ne", [y, y], "b")
    x_zero = b.op("eq", [x, zero], "b")
    return b.op(
        "where", [y_nan, b.const(math.nan, t), b.op("where", [x_zero, zero, product], t)], t
    )


@rule("bitwise_and", "bitwise_or", "bitwise_xor", "logical_xor")
def _bitwise(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = "b" if node.op == "logical_xor" else out_type(node)
    x, y = to(b, args[0], t), to(b, args[1], t)
    if t == "b":
        return b.op({"bitwise_and": "and", "bitwise_or": "or"}.get(node.op, "ne"), [x, y], "b")
    return b.op({"bitwise_and": "band", "bitwise_or": "bor"}.get(node.op, "bxor"), [x, y], t)


@rule("eq", "ne", "lt", "le", "gt", "ge")
def _compare(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    common = _common(args)
    if common == torch.bool:
        return b.op(node.op, [to(b, args[0], "i32"), to(b, args[1], "i32")], "b")
    return b.op(node.op, [narrow(b, args[0], common), narrow(b, args[1], common)], "b")


@rule("logical_and", "logical_or")
def _logical(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    op = "and" if node.op == "logical_and" else "or"
    return b.op(op, [to(b, args[0], "b"), to(b, args[1], "b")], "b")


@rule("where")
def _where(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    return b.op("where", [to(b, args[0], "b"), to(b, args[1], t), to(b, args[2], t)], t)


@rule("clamp")
def _clamp(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x = to(b, args[0], t)
    lo, hi = node.attrs["min"], node.attrs["max"]
    if any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
        # NOTE: ATen fills the result with NaN when a scalar bound is NaN (before its loop);
        # the comparisons below would leave every x unchanged
        return b.const(math.nan, t)
    # NOTE: PyTorch's clamp by scalars: ``x < lo ? lo : x``, then ``x > hi ? hi : x``: a NaN x
    # stays NaN, a bound that equals x as a zero of the other sign leaves x (-0.0 stays -0.0).
    # The bounds are converted to a 16-bit dtype first, as ATen converts them: a bound below
    # the dtype's least subnormal is a zero there (float16 -0.0 clamped at 1e-40 stays -0.0).
    dtype = _out_dtype(node)
    if lo is not None:
        bound = narrow(b, Arg(None, lo, scalar_type_of(lo)), dtype)
        x = b.op("where", [b.op("lt", [x, bound], "b"), bound, x], t)
    if hi is not None:
        bound = narrow(b, Arg(None, hi, scalar_type_of(hi)), dtype)
        x = b.op("where", [b.op("gt", [x, bound], "b"), bound, x], t)
    return x


@rule("triu", "tril")
def _tri(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x = to(b, args[0], t)
    diff = b.index(idx[-1] - idx[-2])
    diag = b.const(node.attrs["diagonal"], "i64")
    keep = b.op("ge" if node.op == "triu" else "le", [diff, diag], "b")
    return b.op("where", [keep, x, b.const(0, t)], t)


@rule("dropout")
def _dropout_eval(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    return to(b, args[0], out_type(node))


@rule("batch_norm")
def _batch_norm(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    """Inference batch norm is pointwise over (N, C, ...) with per-channel parameters:
    ``y = x * alpha + beta``, ``alpha = weight / sqrt(var + eps)``, ``beta = bias - mean * alpha``
    (PyTorch's CPU formula), in the accumulation type of the input."""
    t = accum_scalar(node.outputs[0].type)
    x, w, bias, mean, var = args
    invstd = b.op(
        "div",
        [b.const(1.0, t), b.op("sqrt", [b.op("add", [to(b, var, t), _eps(b, node, t)], t)], t)],
        t,
    )
    alpha = invstd if w.type is None else b.op("mul", [invstd, to(b, w, t)], t)
    shift = b.op("mul", [to(b, mean, t), alpha], t)
    beta = b.op("neg", [shift], t) if bias.type is None else b.op("sub", [to(b, bias, t), shift], t)
    y = b.op("add", [b.op("mul", [to(b, x, t), alpha], t), beta], t)
    return cast(b, y, out_type(node))


def _eps(b: KernelBuilder, node: Node, t: str) -> Stmt:
    return b.const(float(node.attrs["eps"]), t)


def accum_scalar(t: Any) -> str:
    """The compute type for a normalization over values of IR type ``t`` (f64 stays f64)."""
    assert isinstance(t, TensorType)
    return "f64" if t.dtype == torch.float64 else scalar_of(float_dtype(t.dtype))


# NOTE: operand positions a rule reads per channel (batch_norm's parameters); the rest are
# broadcast like any pointwise operand.
CHANNEL_OPERANDS: dict[str, tuple[int, ...]] = {"batch_norm": (1, 2, 3, 4)}


@rule("nan_to_num")
def _nan_to_num(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    t = out_type(node)
    x = to(b, args[0], t)
    if not is_float(t):
        return x
    out = node.outputs[0].type
    assert isinstance(out, TensorType)
    info = torch.finfo(out.dtype)

    def replacement(name: str, default: float) -> Stmt:
        # NOTE: ATen casts the replacement to the tensor's dtype (double -> float -> 16 bits).
        value = node.attrs[name]
        return b.round(b.const(default if value is None else float(value), t), storage_type(node))

    inf = b.const(math.inf, t)
    y = b.op(
        "where",
        [b.op("eq", [x, b.op("neg", [inf], t)], "b"), replacement("neginf", info.min), x],
        t,
    )
    y = b.op("where", [b.op("eq", [x, inf], "b"), replacement("posinf", info.max), y], t)
    return b.op("where", [b.op("ne", [x, x], "b"), replacement("nan", 0.0), y], t)


RULES.update(ACTIVATIONS)
