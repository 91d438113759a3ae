"""The ATen -> IR table: functional ATen overloads that a plait IR op computes exactly.

An ATen graph traced from a call with no capture rule (:mod:`plait.frontend.aten_trace`) emits
one IR node per ATen node: the IR op this table names when it has one, else a typed ``aten``
extern node. An entry ``emit(b, args, kwargs)`` gets the ATen node's arguments with tensors
replaced by IR values and returns the IR value, or None when this call's arguments have no
exactly equivalent IR op (then the node stays an ``aten`` node). The caller checks that the
emitted value's type equals the ATen node's traced type, and uses an ``aten`` node otherwise.

Adding a native op is one line: ``aten.<op>.<overload>: _positional("<ir op>", <operands>,
*<attribute names>)`` (or one of the argument-mapping helpers below);
tests/capture/test_aten_table.py checks every entry against the overload on fresh values.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((2, 3), torch.float32))
    >>> v = ATEN_TO_IR[torch.ops.aten.exp.default](gb, (x,), {})
    >>> v.producer.op
    'exp'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from plait.ir import GraphBuilder, Value

aten = torch.ops.aten
Emit = Callable[[GraphBuilder, tuple, dict], Any]


def _positional(op: str, count: int, *names: str) -> Emit:
    """``count`` operands, then attributes ``names`` from the remaining positional arguments or
    keywords; any other argument makes the call unmapped."""

    def emit(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
        attrs: dict[str, Any] = {}
        rest = list(args[count:])
        for i, v in enumerate(rest):
            if i >= len(names):
                return None
            attrs[names[i]] = v
        for k, v in kwargs.items():
            if k not in names:
                return None
            attrs[k] = v
        return b.call(op, *args[:count], **attrs)

    return emit


def _reduce(op: str) -> Emit:
    """``aten.sum.dim_IntList(x, dim, keepdim=False, dtype=None)`` and its kin: an empty or
    absent ``dim`` reduces every dim in ATen; the IR spells that ``dims=None``."""

    def emit(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
        params = dict(zip(("dim", "keepdim", "dtype"), args[1:]))
        params.update(kwargs)
        if set(params) - {"dim", "keepdim", "dtype"}:
            return None
        dims = params.pop("dim", None)
        attrs: dict[str, Any] = {"dims": tuple(dims) if dims else None, **params}
        return b.call(op, args[0], **attrs)

    return emit


def _reduce_all(op: str) -> Emit:
    """``aten.sum.default(x, *, dtype=None)``: every dim."""

    def emit(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
        if len(args) != 1 or set(kwargs) - {"dtype"}:
            return None
        return b.call(op, args[0], dims=None, **kwargs)

    return emit


def _prod_all(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
    """``aten.prod.default``, except into a 16-bit float: eager multiplies in 16 bits there."""
    dtype = kwargs.get("dtype") or getattr(getattr(args[0], "type", None), "dtype", None)
    if dtype in (torch.bfloat16, torch.float16):
        return None
    return _reduce_all("prod")(b, args, kwargs)


def _to_dtype(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
    """``aten._to_copy.default(x, dtype=d)`` with no device, layout or memory format change."""
    if len(args) != 1 or set(kwargs) != {"dtype"}:
        return None
    return b.call("to_dtype", args[0], dtype=kwargs["dtype"])


def _expand(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
    if kwargs.get("implicit", False) or len(args) != 2:
        return None
    return b.call("expand", args[0], shape=tuple(args[1]))


def _reshape(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
    if kwargs or len(args) != 2:
        return None
    return b.call("reshape", args[0], shape=tuple(args[1]))


def _softmax(op: str) -> Emit:
    def emit(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != 3 or args[2]:  # NOTE: half_to_float: a CUDA-only spelling
            return None
        return b.call(op, args[0], dim=args[1])

    return emit


def _cat(b: GraphBuilder, args: tuple, kwargs: dict) -> Any:
    if kwargs or not args or not args[0]:
        return None
    return b.call("cat", list(args[0]), dim=args[1] if len(args) > 1 else 0)


_UNARY = (
    *("exp", "log", "sqrt", "rsqrt", "neg", "abs", "relu", "sigmoid", "tanh", "erf"),
    *("reciprocal", "logical_not", "silu"),
    *("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"),
    *("expm1", "log1p", "log2", "log10", "exp2", "erfc", "floor", "ceil", "trunc", "frac"),
    *("sign", "signbit", "isnan", "isinf", "isfinite", "isposinf", "isneginf", "bitwise_not"),
    *("hardsigmoid", "hardswish", "mish", "round"),
)
_BINARY = ("mul", "eq", "ne", "lt", "le", "gt", "ge")  # NOTE: .Tensor and .Scalar overloads
_BINARY_DEFAULT = (
    *("maximum", "minimum", "logical_and", "logical_or", "logical_xor"),
    *("atan2", "hypot", "fmax", "fmin"),
)
_BINARY_TENSOR = ("copysign", "xlogy", "fmod", "remainder", "bitwise_and", "bitwise_or")

# NOTE: keyed by OpOverload; an IR op listed here must compute exactly what the overload does
# for every argument the entry accepts (the entry returns None for the others).
ATEN_TO_IR: dict[Any, Emit] = {
    **{getattr(aten, name).default: _positional(name, 1) for name in _UNARY},
    **{getattr(aten, name).Tensor: _positional(name, 2) for name in _BINARY},
    **{getattr(aten, name).Scalar: _positional(name, 2) for name in _BINARY},
    **{getattr(aten, name).default: _positional(name, 2) for name in _BINARY_DEFAULT},
    **{getattr(aten, name).Tensor: _positional(name, 2) for name in _BINARY_TENSOR},
    aten.bitwise_xor.Tensor: _positional("bitwise_xor", 2),
    aten.round.decimals: _positional("round", 1, "decimals"),
    aten.leaky_relu.default: _positional("leaky_relu", 1, "negative_slope"),
    aten.hardshrink.default: _positional("hardshrink", 1, "lambd"),
    aten.softshrink.default: _positional("softshrink", 1, "lambd"),
    aten.threshold.default: _positional("threshold", 1, "threshold", "value"),
    aten.elu.default: _positional("elu", 1, "alpha", "scale", "input_scale"),
    aten.softplus.default: _positional("softplus", 1, "beta", "threshold"),
    aten.prod.default: _prod_all,
    aten.all.default: _reduce_all("all"),
    aten.any.default: _reduce_all("any"),
    aten.add.Tensor: _positional("add", 2, "alpha"),
    aten.add.Scalar: _positional("add", 2, "alpha"),
    aten.sub.Tensor: _positional("sub", 2, "alpha"),
    aten.sub.Scalar: _positional("sub", 2, "alpha"),
    aten.div.Tensor: _positional("div", 2),
    aten.div.Scalar: _positional("div", 2),
    aten.pow.Tensor_Scalar: _positional("pow", 2),
    aten.pow.Tensor_Tensor: _positional("pow", 2),
    aten.where.self: _positional("where", 3),
    aten.gelu.default: _positional("gelu", 1, "approximate"),
    aten.clamp.default: _positional("clamp", 1, "min", "max"),
    aten.tril.default: _positional("tril", 1, "diagonal"),
    aten.triu.default: _positional("triu", 1, "diagonal"),
    aten._to_copy.default: _to_dtype,
    aten.sum.dim_IntList: _reduce("sum"),
    aten.sum.default: _reduce_all("sum"),
    aten.mean.dim: _reduce("mean"),
    aten.mean.default: _reduce_all("mean"),
    aten.amax.default: _reduce("amax"),
    aten.amin.default: _reduce("amin"),
    aten._softmax.default: _softmax("softmax"),
    aten._log_softmax.default: _softmax("log_softmax"),
    aten.view_copy.default: _reshape,
    aten._unsafe_view.default: _reshape,
    aten.permute_copy.default: _positional("permute", 1, "dims"),
    aten.expand_copy.default: _expand,
    aten.transpose_copy.int: _positional("transpose", 1, "dim0", "dim1"),
    aten.unsqueeze_copy.default: _positional("unsqueeze", 1, "dim"),
    aten.squeeze_copy.dims: _positional("squeeze", 1, "dims"),
    aten.squeeze_copy.dim: _positional("squeeze", 1, "dims"),
    aten.select_copy.int: _positional("select", 1, "dim", "index"),
    # NOTE: functionalization's form of `.detach()`: PyTorch's autograd has no derivative for
    # it (a torch_vjp over it raises); plait's detach passes none, as eager's detach
    aten.detach_copy.default: _positional("detach", 1),
    aten.cat.default: _cat,
    aten.mm.default: _positional("matmul", 2),
    aten.bmm.default: _positional("bmm", 2),
}


def emit_native(b: GraphBuilder, op: Any, args: tuple, kwargs: dict) -> Value | None:
    """The IR value the table's entry for ``op`` emits, or None (no entry, or none for these
    arguments: a literal where the IR op wants a tensor, an argument it has no attribute for)."""
    entry = ATEN_TO_IR.get(op)
    if entry is None:
        return None
    value = entry(b, args, kwargs)
    return value if isinstance(value, Value) else None
