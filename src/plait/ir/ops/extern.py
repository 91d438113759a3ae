"""Extern ops (heavy kernels PyTorch already does best), random ops, constants and opaque calls."""

from __future__ import annotations

import functools
import importlib
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from plait.ir.graph import Operand, Value
from plait.ir.ops.registry import (
    OPTIONAL_TENSOR,
    VARIADIC,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import broadcast_shapes, device_of, require_float, wrap_dim
from plait.ir.ops.vjp import VjpContext, nondifferentiable, torch_vjp_rule, vjp
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, Type
from plait.symbolic import Dim, dims_equal, normalize

FLOATS = FLOAT_DTYPES
ALL = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)


def _same_dtype(name: str, *ts: Type) -> torch.dtype:
    dtypes = {t.dtype for t in ts if isinstance(t, TensorType)}
    if len(dtypes) != 1:
        raise TypeRuleError(f"{name}: operands must share a dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def _check_dim(name: str, a: Dim, b: Dim, what: str) -> None:
    if not dims_equal(a, b):
        raise TypeRuleError(f"{name}: {what}: {a} != {b}")


def _conv_out(n: Dim, k: int, stride: int, pad: int, dil: int, ceil: bool = False) -> Dim:
    span = n + 2 * pad - dil * (k - 1) - 1
    if ceil:
        out = -(-span // stride) + 1
        # NOTE: PyTorch drops a last window that would start inside the right padding.
        if isinstance(out, int) and (out - 1) * stride >= n + pad:
            out -= 1
        return normalize(out)
    return normalize(span // stride + 1)


def _conv2d_rule(
    x: TensorType,
    w: TensorType,
    b: Type,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    groups: int,
) -> list[Type]:
    require_float(x, "conv2d")
    if x.rank != 4 or w.rank != 4:
        raise TypeRuleError(f"conv2d: expects 4-D input and weight, got {x} and {w}")
    dtype = _same_dtype("conv2d", x, w, b)
    _check_dim("conv2d", x.shape[1], normalize(w.shape[1] * groups), "input channels vs weight")
    if isinstance(b, TensorType):
        _check_dim("conv2d", b.shape[0], w.shape[0], "bias size vs output channels")
    if len(stride) != 2 or len(padding) != 2 or len(dilation) != 2:
        raise TypeRuleError("conv2d: stride, padding and dilation take two values each")
    h, wd = (
        _conv_out(x.shape[2 + i], int(w.shape[2 + i]), stride[i], padding[i], dilation[i])
        for i in range(2)
    )
    return [TensorType((x.shape[0], w.shape[0], h, wd), dtype, device_of(x, w, b))]


register(
    OpDef(
        "conv2d",
        Category.EXTERN,
        (Param("x"), Param("weight"), Param("bias", OPTIONAL_TENSOR)),
        (
            Attr("stride", "ints", (1, 1)),
            Attr("padding", "ints", (0, 0)),
            Attr("dilation", "ints", (1, 1)),
            Attr("groups", "int", 1),
        ),
        _conv2d_rule,
        lambda x, w, b, stride, padding, dilation, groups: F.conv2d(
            x, w, b, stride, padding, dilation, groups
        ),
        FLOATS,
    )
)


def _linear_rule(x: TensorType, w: TensorType, b: Type) -> list[Type]:
    require_float(x, "linear")
    dtype = _same_dtype("linear", x, w, b)
    if x.rank < 1 or w.rank != 2:
        raise TypeRuleError(f"linear: expects input rank >= 1 and a 2-D weight, got {x}, {w}")
    _check_dim("linear", x.shape[-1], w.shape[1], "in_features")
    if isinstance(b, TensorType):
        _check_dim("linear", b.shape[-1], w.shape[0], "bias vs out_features")
    return [TensorType((*x.shape[:-1], w.shape[0]), dtype, device_of(x, w, b))]


register(
    OpDef(
        "linear",
        Category.EXTERN,
        (Param("x"), Param("weight"), Param("bias", OPTIONAL_TENSOR)),
        (),
        _linear_rule,
        F.linear,
        FLOATS,
    )
)


def _matmul_rule(a: TensorType, b: TensorType) -> list[Type]:
    dtype = _same_dtype("matmul", a, b)
    if a.rank == 0 or b.rank == 0:
        raise TypeRuleError("matmul: operands must have rank >= 1")
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.rank == 1 else b.shape[-2]
    _check_dim("matmul", k_a, k_b, "contracted dims")
    if a.rank == 1 and b.rank == 1:
        shape: tuple[Dim, ...] = ()
    elif b.rank == 1:
        shape = a.shape[:-1]
    elif a.rank == 1:
        shape = (*b.shape[:-2], b.shape[-1])
    else:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        shape = (*batch, a.shape[-2], b.shape[-1])
    return [TensorType(shape, dtype, device_of(a, b))]


register(
    OpDef(
        "matmul",
        Category.EXTERN,
        (Param("a"), Param("b")),
        (),
        _matmul_rule,
        torch.matmul,
        (*FLOATS, *INT_DTYPES),
    )
)


def _bmm_rule(a: TensorType, b: TensorType) -> list[Type]:
    dtype = _same_dtype("bmm", a, b)
    if a.rank != 3 or b.rank != 3:
        raise TypeRuleError(f"bmm: expects 3-D operands, got {a} and {b}")
    _check_dim("bmm", a.shape[0], b.shape[0], "batch")
    _check_dim("bmm", a.shape[2], b.shape[1], "contracted dims")
    return [TensorType((a.shape[0], a.shape[1], b.shape[2]), dtype, device_of(a, b))]


register(
    OpDef(
        "bmm",
        Category.EXTERN,
        (Param("a"), Param("b")),
        (),
        _bmm_rule,
        torch.bmm,
        (*FLOATS, *INT_DTYPES),
    )
)


def _sdpa_rule(
    q: TensorType,
    k: TensorType,
    v: TensorType,
    mask: Type,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool = False,
) -> list[Type]:
    require_float(q, "scaled_dot_product_attention")
    dtype = _same_dtype("scaled_dot_product_attention", q, k, v)
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise TypeRuleError(f"scaled_dot_product_attention: ranks differ: {q}, {k}, {v}")
    if enable_gqa:
        # NOTE: grouped query attention: each key/value head serves Hq / Hkv query heads
        if q.rank < 3:
            raise TypeRuleError("scaled_dot_product_attention: enable_gqa needs a head dim")
        hq, hkv = q.shape[-3], k.shape[-3]
        _check_dim("scaled_dot_product_attention", k.shape[-3], v.shape[-3], "k/v heads")
        if not (isinstance(hq, int) and isinstance(hkv, int)) or hkv == 0 or hq % hkv:
            raise TypeRuleError(
                f"scaled_dot_product_attention: {hq} query heads over {hkv} key/value heads"
            )
        k = k.with_shape((*k.shape[:-3], hq, *k.shape[-2:]))
    _check_dim("scaled_dot_product_attention", q.shape[-1], k.shape[-1], "q/k head dim")
    _check_dim("scaled_dot_product_attention", k.shape[-2], v.shape[-2], "k/v length")
    if isinstance(mask, TensorType):
        if is_causal:
            raise TypeRuleError("scaled_dot_product_attention: is_causal with an explicit mask")
        if mask.dtype not in (torch.bool, dtype):
            raise TypeRuleError(f"scaled_dot_product_attention: mask dtype {mask.dtype}")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return [TensorType((*batch, q.shape[-2], v.shape[-1]), dtype, device_of(q, k, v, mask))]


register(
    OpDef(
        "scaled_dot_product_attention",
        Category.EXTERN,
        (Param("q"), Param("k"), Param("v"), Param("attn_mask", OPTIONAL_TENSOR)),
        (
            Attr("dropout_p", "float", 0.0),
            Attr("is_causal", "bool", False),
            Attr("scale", "float?", None),
            Attr("enable_gqa", "bool", False),
        ),
        _sdpa_rule,
        lambda q, k, v, m, dropout_p, is_causal, scale, enable_gqa: F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=m,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        ),
        FLOATS,
        random_when=lambda a: a["dropout_p"] > 0,
    )
)


def _embedding_rule(indices: TensorType, weight: TensorType, padding_idx: int | None) -> list[Type]:
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeRuleError(f"embedding: indices must be int64 or int32, got {indices.dtype}")
    if weight.rank != 2:
        raise TypeRuleError(f"embedding: weight must be 2-D, got {weight}")
    shape = (*indices.shape, weight.shape[1])
    return [TensorType(shape, weight.dtype, device_of(indices, weight))]


register(
    OpDef(
        "embedding",
        Category.EXTERN,
        (Param("indices"), Param("weight")),
        (Attr("padding_idx", "int?", None),),
        _embedding_rule,
        lambda i, w, padding_idx: F.embedding(i, w, padding_idx),
        FLOATS,
    )
)


def _index_select_rule(x: TensorType, index: TensorType, dim: int) -> list[Type]:
    if index.dtype not in (torch.int64, torch.int32) or index.rank > 1:
        raise TypeRuleError(f"index_select: index must be a 1-D int64/int32 tensor, got {index}")
    d = wrap_dim(dim, x.rank, "index_select")
    n = index.shape[0] if index.rank else 1
    shape = list(x.shape)
    if x.rank:
        shape[d] = n
    return [TensorType(tuple(shape), x.dtype, device_of(x, index))]


register(
    OpDef(
        "index_select",
        Category.EXTERN,
        (Param("x"), Param("index")),
        (Attr("dim", "int"),),
        _index_select_rule,
        lambda x, i, dim: torch.index_select(x, dim, i),
        ALL,
    )
)


def _pool_rule(name: str) -> Any:
    def rule(
        x: TensorType,
        kernel_size: tuple,
        stride: tuple | None,
        padding: tuple,
        ceil_mode: bool,
        dilation: tuple = (1, 1),
        **_: Any,
    ) -> list[Type]:
        if x.rank not in (3, 4):
            raise TypeRuleError(f"{name}: expects a 3-D or 4-D input, got {x}")
        stride = stride or kernel_size
        for what, v in (("kernel_size", kernel_size), ("stride", stride), ("padding", padding)):
            if len(v) != 2:
                raise TypeRuleError(f"{name}: {what} takes two values, got {list(v)}")
        if any(2 * p > k for p, k in zip(padding, kernel_size)):
            raise TypeRuleError(f"{name}: padding {list(padding)} exceeds half the kernel")
        hw = tuple(
            _conv_out(
                x.shape[x.rank - 2 + i],
                kernel_size[i],
                stride[i],
                padding[i],
                dilation[i],
                ceil_mode,
            )
            for i in range(2)
        )
        return [x.with_shape((*x.shape[:-2], *hw))]

    return rule


_POOL_ATTRS = (
    Attr("kernel_size", "ints"),
    Attr("stride", "ints?", None),
    Attr("padding", "ints", (0, 0)),
)
register(
    OpDef(
        "max_pool2d",
        Category.EXTERN,
        (Param("x"),),
        (*_POOL_ATTRS, Attr("dilation", "ints", (1, 1)), Attr("ceil_mode", "bool", False)),
        _pool_rule("max_pool2d"),
        lambda x, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool2d(
            x, kernel_size, stride, padding, dilation, ceil_mode
        ),
        (*FLOATS, torch.int64),
    )
)
register(
    OpDef(
        "avg_pool2d",
        Category.EXTERN,
        (Param("x"),),
        (
            *_POOL_ATTRS,
            Attr("ceil_mode", "bool", False),
            Attr("count_include_pad", "bool", True),
            Attr("divisor_override", "int?", None),
        ),
        _pool_rule("avg_pool2d"),
        lambda x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: (
            F.avg_pool2d(
                x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
            )
        ),
        FLOATS,
    )
)


def _adaptive_rule(x: TensorType, output_size: tuple) -> list[Type]:
    require_float(x, "adaptive_avg_pool2d")
    if x.rank not in (3, 4) or len(output_size) != 2:
        raise TypeRuleError(f"adaptive_avg_pool2d: expects 3-D/4-D input and two sizes, got {x}")
    return [x.with_shape((*x.shape[:-2], *output_size))]


register(
    OpDef(
        "adaptive_avg_pool2d",
        Category.EXTERN,
        (Param("x"),),
        (Attr("output_size", "ints"),),
        _adaptive_rule,
        lambda x, output_size: F.adaptive_avg_pool2d(x, output_size),
        FLOATS,
    )
)


# --- random --------------------------------------------------------------------------------
def _dropout_rule(x: TensorType, p: float, train: bool) -> list[Type]:
    require_float(x, "dropout")
    if not 0.0 <= p <= 1.0:
        raise TypeRuleError(f"dropout: p must be in [0, 1], got {p}")
    return [x]


register(
    OpDef(
        "dropout",
        Category.RANDOM,
        (Param("x"),),
        (Attr("p", "float", 0.5), Attr("train", "bool", True)),
        _dropout_rule,
        lambda x, p, train: F.dropout(x, p, train),
        FLOATS,
        "identity when train is false",
        random_when=lambda a: a["train"] and a["p"] > 0,
    )
)


# --- constants -----------------------------------------------------------------------------
def _full_rule(shape: tuple, dtype: torch.dtype, device: str, **_: Any) -> list[Type]:
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise TypeRuleError(f"negative dim in shape {list(shape)}")
    return [TensorType(tuple(shape), dtype, device)]


_CONST_ATTRS = (Attr("shape", "dims"), Attr("dtype", "dtype"), Attr("device", "str", "cpu"))
register(
    OpDef(
        "full",
        Category.CONSTANT,
        (),
        (*_CONST_ATTRS, Attr("value", "scalar")),
        _full_rule,
        lambda shape, dtype, device, value: torch.full(shape, value, dtype=dtype, device=device),
        ALL,
    )
)
register(
    OpDef(
        "zeros",
        Category.CONSTANT,
        (),
        _CONST_ATTRS,
        _full_rule,
        lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device),
        ALL,
    )
)
register(
    OpDef(
        "ones",
        Category.CONSTANT,
        (),
        _CONST_ATTRS,
        _full_rule,
        lambda shape, dtype, device: torch.ones(shape, dtype=dtype, device=device),
        ALL,
    )
)


def arange_length(start: float, end: float, step: float) -> int:
    """PyTorch's arange element count: ceil((end - start) / step), never negative."""
    import math

    if step == 0:
        raise TypeRuleError("arange: step must be nonzero")
    return max(0, math.ceil((end - start) / step))


def _arange_rule(start: Any, end: Any, step: Any, dtype: torch.dtype, device: str) -> list[Type]:
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        return [TensorType((arange_length(start, end, step),), dtype, device)]
    # NOTE: symbolic bounds are size expressions; with integer start and step the length is
    # exact integer arithmetic, never a float ceil.
    if not (isinstance(start, int) and isinstance(step, int)) or step <= 0:
        raise TypeRuleError(
            "arange: a symbolic end needs an integer start and a positive "
            "integer step; specialize the bounds"
        )
    if isinstance(end, float):
        raise TypeRuleError("arange: a float end with a symbolic start; specialize them")
    length = normalize(sympy.Max(0, sympy.ceiling((end - start) / sympy.Integer(step))))
    return [TensorType((length,), dtype, device)]


register(
    OpDef(
        "arange",
        Category.CONSTANT,
        (),
        (
            Attr("start", "scalar", 0),
            Attr("end", "scalar"),
            Attr("step", "scalar", 1),
            Attr("dtype", "dtype"),
            Attr("device", "str", "cpu"),
        ),
        _arange_rule,
        lambda start, end, step, dtype, device: torch.arange(
            start, end, step, dtype=dtype, device=device
        ),
        (*FLOATS, *INT_DTYPES),
    )
)


# --- opaque --------------------------------------------------------------------------------
def resolve_target(target: str) -> Any:
    """Look up a PyTorch callable by dotted path. NOTE: only ``torch.*`` is resolvable, so an
    artifact's text can name a PyTorch function but never make plait import arbitrary code."""
    if target != "torch" and not target.startswith("torch."):
        raise TypeRuleError(f"opaque: target {target!r} is not a torch callable")
    module_name, _, attr = target.rpartition(".")
    obj: Any = None
    while module_name:
        try:
            obj = importlib.import_module(module_name)
            break
        except ImportError:
            module_name, _, parent = module_name.rpartition(".")
            attr = f"{parent}.{attr}"
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeRuleError(f"opaque: {target!r} is not callable")
    return obj


def _call_spec(literals: str, kwliterals: str) -> tuple[list[Any] | None, dict[str, Any]]:
    """Decode the JSON call spec: ``literals`` is the full positional argument list, where
    ``{"t": i}`` stands for tensor operand ``i``; ``kwliterals`` holds the keyword arguments
    (tensor operands there too). Values stay encoded; :func:`decode_literal` decodes them."""
    try:
        positional = json.loads(literals) if literals else None
        keywords = json.loads(kwliterals) if kwliterals else {}
    except json.JSONDecodeError as exc:
        raise TypeRuleError(f"opaque: malformed call spec: {exc}") from None
    if positional is not None and not isinstance(positional, list):
        raise TypeRuleError("opaque: literals must be a JSON list")
    if not isinstance(keywords, dict):
        raise TypeRuleError("opaque: kwliterals must be a JSON object")
    return positional, keywords


def _named(module: Any, kind: type, name: Any, what: str) -> Any:
    obj = getattr(module, str(name), None)
    if not isinstance(obj, kind):
        raise TypeRuleError(f"opaque: unknown {what} {name!r}")
    return obj


# NOTE: a literal is JSON data, or a one-key object whose key names what it encodes. Each tag
# gives back exactly the Python value the call was made with (a tuple stays a tuple: a Python
# function may tell it from a list).
_TAGS: dict[str, Any] = {
    "dtype": lambda b, t: _named(torch, torch.dtype, b, "dtype"),
    "device": lambda b, t: torch.device(str(b)),
    "memory_format": lambda b, t: _named(torch, torch.memory_format, b, "memory format"),
    "layout": lambda b, t: _named(torch, torch.layout, b, "layout"),
    "tuple": lambda b, t: tuple(decode_literal(v, t) for v in b),
    "size": lambda b, t: torch.Size(int(v) for v in b),
    "slice": lambda b, t: slice(*(decode_literal(v, t) for v in b)),
    "ellipsis": lambda b, t: ...,
    "complex": lambda b, t: complex(decode_literal(b[0], t), decode_literal(b[1], t)),
    "float": lambda b, t: struct.unpack("<d", bytes.fromhex(str(b)))[0],
    "dict": lambda b, t: {decode_literal(k, t): decode_literal(v, t) for k, v in b},
}


def decode_literal(spec: Any, tensors: list[Any]) -> Any:
    """An argument of an opaque (or random) call from its JSON form; ``{"t": i}`` is
    ``tensors[i]``.

    Example:
        >>> decode_literal({"tuple": [2, {"dtype": "float64"}, {"ellipsis": 0}]}, [])
        (2, torch.float64, Ellipsis)
    """
    if isinstance(spec, dict):
        if len(spec) != 1:
            raise TypeRuleError(f"opaque: a literal object has one key, got {sorted(spec)}")
        ((tag, body),) = spec.items()
        if tag == "t":
            if not isinstance(body, int) or not 0 <= body < len(tensors):
                raise TypeRuleError(f"opaque: no tensor operand {body!r}")
            return tensors[body]
        decode = _TAGS.get(tag)
        if decode is None:
            raise TypeRuleError(f"opaque: unknown literal {spec!r}")
        try:
            return decode(body, tensors)
        except (TypeError, ValueError, struct.error) as exc:
            raise TypeRuleError(f"opaque: malformed literal {spec!r}: {exc}") from None
    if isinstance(spec, list):
        return [decode_literal(s, tensors) for s in spec]
    return spec


def count_operands(spec: Any) -> int:
    """How many ``{"t": i}`` markers an encoded argument holds."""
    if isinstance(spec, dict):
        if set(spec) == {"t"}:
            return 1
        return sum(count_operands(v) for v in spec.values())
    if isinstance(spec, list):
        return sum(count_operands(v) for v in spec)
    return 0


def decode_call(
    tensors: list[Any], literals: str, kwliterals: str
) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of an opaque or random call."""
    positional, keywords = _call_spec(literals, kwliterals)
    args = list(tensors) if positional is None else decode_literal(positional, tensors)
    return args, {k: decode_literal(v, tensors) for k, v in keywords.items()}


def _opaque_rule(
    *args: Any, target: str, out_types: str, literals: str, kwliterals: str
) -> list[Type]:
    from plait.ir.text import parse_type

    resolve_target(target)
    positional, keywords = _call_spec(literals, kwliterals)
    if positional is not None or keywords:
        # NOTE: without ``literals`` the operands are the positional arguments, all of them
        used = len(args[0]) if positional is None else count_operands(positional)
        used += count_operands(keywords)
        if used != len(args[0]):
            raise TypeRuleError(
                f"opaque: the call spec uses {used} tensor operand(s), the node has {len(args[0])}"
            )
    types = [parse_type(s.strip()) for s in out_types.split(";") if s.strip()]
    if not types:
        raise TypeRuleError("opaque: out_types must name at least one output type")
    return types


def _opaque_ref(
    args: list[Any], target: str, out_types: str, literals: str, kwliterals: str
) -> Any:
    call_args, keywords = decode_call(list(args), literals, kwliterals)
    return resolve_target(target)(*call_args, **keywords)


register(
    OpDef(
        "opaque",
        Category.OPAQUE,
        (Param("args", VARIADIC),),
        (
            Attr("target", "str"),
            Attr("out_types", "str"),
            Attr("literals", "str", ""),
            Attr("kwliterals", "str", ""),
        ),
        _opaque_rule,
        _opaque_ref,
        ALL,
        "a PyTorch call with no IR op; run by PyTorch and counted as a fallback",
        fixed_outputs=None,
    )
)


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: the heavy backward kernels are typed ATen nodes (PyTorch's own backward kernels, eager's
# derivative); an ``aten`` node takes static shapes, so a node of symbolic shape falls back to
# ``torch_vjp`` (PyTorch's autograd over the reference, which runs the forward op again).


def _tensor(o: Operand | None) -> TensorType:
    assert isinstance(o, Value) and isinstance(o.type, TensorType), f"{o!r} is not a tensor"
    return o.type


def _static(*values: Operand | None) -> bool:
    return all(_tensor(v).is_static for v in values if isinstance(v, Value))


def _aten(ctx: VjpContext, name: str, tensors: list[Value], literals: list[Any]) -> tuple:
    """An ``aten`` node ``aten.<name>.default`` over ``tensors`` (``{"t": i}`` in ``literals``);
    its defined results."""
    return ctx.call("aten", tensors, name=name, overload="default", literals=json.dumps(literals))


class NoDerivativeError(ValueError):
    """A derivative rule cannot differentiate its node as asked (a random op whose gradient
    needs the numbers it drew); raised while the joint graph is built."""


@vjp("conv2d")
def _conv2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    x, w, b = ctx.inputs
    output_mask = [ctx.wants(0), ctx.wants(1), ctx.wants(2)]
    g = ctx.grad()
    if not _static(g, x, w):
        return torch_vjp_rule(ctx)
    assert isinstance(x, Value) and isinstance(w, Value)
    a = ctx.attrs
    # NOTE: eager's convolution_backward: one kernel for every wanted gradient; the forward
    # convolution never runs again (output_mask leaves the unwanted ones undefined: no outputs)
    bias_sizes = [_tensor(w).shape[0]] if isinstance(b, Value) else None
    literals = [
        *({"t": i} for i in range(3)),
        bias_sizes,
        list(a["stride"]),
        list(a["padding"]),
        list(a["dilation"]),
        False,
        [0, 0],
        a["groups"],
        output_mask,
    ]
    found = iter(_aten(ctx, "convolution_backward", [g, x, w], literals))
    return [next(found) if wanted else None for wanted in output_mask]


@vjp("linear")
def _linear_vjp(ctx: VjpContext) -> list[Operand | None]:
    x, w, b = ctx.inputs
    g = ctx.grad()
    tx, tw = _tensor(x), _tensor(w)
    gx = ctx.call("matmul", g, w) if ctx.wants(0) else None
    gw = None
    if ctx.wants(1):
        if tx.rank == 1:
            gw = ctx.call("mul", ctx.call("unsqueeze", g, dim=1), ctx.call("unsqueeze", x, dim=0))
        else:
            # NOTE: the batch dims fold into the contraction: g^T x over (N, out) and (N, in)
            rows = normalize(sympy.Mul(*tx.shape[:-1]))
            g2 = g if tx.rank == 2 else ctx.call("reshape", g, shape=(rows, tw.shape[0]))
            x2 = x if tx.rank == 2 else ctx.call("reshape", x, shape=(rows, tw.shape[1]))
            gw = ctx.call("matmul", ctx.call("transpose", g2, dim0=0, dim1=1), x2)
    gb = ctx.sum_to(g, b.type) if ctx.wants(2) and isinstance(b, Value) else None
    return [gx, gw, gb]


@vjp("matmul")
def _matmul_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    g = ctx.grad()
    ta, tb = _tensor(a), _tensor(b)
    ga = gb = None
    if ta.rank == 1 and tb.rank == 1:  # NOTE: a dot product: g is 0-d
        ga = ctx.call("mul", g, b) if ctx.wants(0) else None
        gb = ctx.call("mul", g, a) if ctx.wants(1) else None
    elif tb.rank == 1:  # NOTE: (..., m, k) @ (k,) -> (..., m)
        if ctx.wants(0):
            ga = ctx.call("mul", ctx.call("unsqueeze", g, dim=-1), b)
        if ctx.wants(1):
            gb = ctx.sum_to(ctx.call("mul", ctx.call("unsqueeze", g, dim=-1), a), tb)
    elif ta.rank == 1:  # NOTE: (k,) @ (..., k, n) -> (..., n)
        if ctx.wants(0):
            ga = ctx.call("matmul", b, ctx.call("unsqueeze", g, dim=-1))
            ga = ctx.sum_to(ctx.call("squeeze", ga, dims=(-1,)), ta)
        if ctx.wants(1):
            a_col = ctx.call("unsqueeze", a, dim=-1)
            gb = ctx.call("mul", a_col, ctx.call("unsqueeze", g, dim=-2))
    else:  # NOTE: batched: the batch dims broadcast, so each gradient sums over what was added
        if ctx.wants(0):
            ga = ctx.sum_to(ctx.call("matmul", g, ctx.call("transpose", b, dim0=-2, dim1=-1)), ta)
        if ctx.wants(1):
            gb = ctx.sum_to(ctx.call("matmul", ctx.call("transpose", a, dim0=-2, dim1=-1), g), tb)
    return [ga, gb]


@vjp("bmm")
def _bmm_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    g = ctx.grad()
    ga = ctx.call("bmm", g, ctx.call("transpose", b, dim0=1, dim1=2)) if ctx.wants(0) else None
    gb = ctx.call("bmm", ctx.call("transpose", a, dim0=1, dim1=2), g) if ctx.wants(1) else None
    return [ga, gb]


def _repeat_heads(ctx: VjpContext, x: Value, groups: int) -> Value:
    """``x.repeat_interleave(groups, dim=-3)``: each key/value head serves ``groups`` query
    heads (grouped query attention)."""
    t = _tensor(x)
    *lead, h, s, e = t.shape
    wide = ctx.call("expand", ctx.call("unsqueeze", x, dim=-3), shape=(*lead, h, groups, s, e))
    return ctx.call("reshape", wide, shape=(*lead, normalize(h * groups), s, e))


def _fold_heads(ctx: VjpContext, g: Value, groups: int) -> Value:
    """The gradient of :func:`_repeat_heads`: each key/value head sums its query heads'."""
    *lead, h, s, e = _tensor(g).shape
    split = ctx.call("reshape", g, shape=(*lead, normalize(h // groups), groups, s, e))
    return ctx.call("sum", split, dims=(len(lead) + 1,), keepdim=False)


@vjp("scaled_dot_product_attention")
def _sdpa_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Attention's gradient from its math: the scores and their softmax are computed again
    (the node does not keep them), then the four products of the softmax's backward.

    NOTE: eager's math: ``S = q k^T * scale`` (keys/values heads repeated under enable_gqa),
    masked (is_causal: keep key j <= query i, top-left aligned; a bool mask keeps where true; a
    float mask is added), ``P = softmax(S)`` with a fully masked row giving zeros (eager's
    ``_safe_softmax``, and its CPU flash kernel), ``O = P v``."""
    q, k, v, mask = ctx.inputs
    a = ctx.attrs
    if a["dropout_p"] > 0:
        raise NoDerivativeError(
            f"scaled_dot_product_attention with dropout_p={a['dropout_p']}: its gradient needs "
            "the dropout mask it drew, which the node does not return; plait differentiates "
            "attention without dropout only"
        )
    tq, tk = _tensor(q), _tensor(k)
    head_dim = tq.shape[-1]
    if a["scale"] is None and not isinstance(head_dim, int):
        return torch_vjp_rule(ctx)
    assert isinstance(q, Value) and isinstance(k, Value) and isinstance(v, Value)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(int(head_dim))
    # NOTE: half precision computes in float32 (eager's kernels accumulate in float32)
    work = torch.float32 if tq.dtype in (torch.float16, torch.bfloat16) else tq.dtype

    def up(x: Value) -> Value:
        return x if _tensor(x).dtype == work else ctx.call("to_dtype", x, dtype=work)

    qc, kc, vc, g = up(q), up(k), up(v), up(ctx.grad())
    groups = 1
    if a["enable_gqa"]:
        groups = int(tq.shape[-3]) // int(tk.shape[-3])
    if groups > 1:
        kc, vc = _repeat_heads(ctx, kc, groups), _repeat_heads(ctx, vc, groups)
    scores = ctx.call(
        "mul", ctx.call("matmul", qc, ctx.call("transpose", kc, dim0=-2, dim1=-1)), scale
    )
    if a["is_causal"]:
        rows = ctx.call("arange", end=tq.shape[-2], dtype=torch.int64, device=tq.device)
        cols = ctx.call("arange", end=tk.shape[-2], dtype=torch.int64, device=tq.device)
        keep = ctx.call("ge", ctx.call("unsqueeze", rows, dim=-1), cols)
        scores = ctx.call("where", keep, scores, -math.inf)
    elif isinstance(mask, Value) and _tensor(mask).dtype == torch.bool:
        scores = ctx.call("where", mask, scores, -math.inf)
    elif isinstance(mask, Value):
        scores = ctx.call("add", scores, up(mask))
    p = ctx.call("softmax", scores, dim=-1)
    if isinstance(mask, Value):
        row_max = ctx.call("amax", scores, dims=(-1,), keepdim=True)
        p = ctx.call("where", ctx.call("isneginf", row_max), 0.0, p)
    out: list[Operand | None] = [None, None, None, None]
    if ctx.wants(2):
        gv = ctx.call("matmul", ctx.call("transpose", p, dim0=-2, dim1=-1), g)
        out[2] = ctx.sum_to(_fold_heads(ctx, gv, groups) if groups > 1 else gv, v.type)
    if not (ctx.wants(0) or ctx.wants(1) or ctx.wants(3)):
        return out
    dp = ctx.call("matmul", g, ctx.call("transpose", vc, dim0=-2, dim1=-1))
    inner = ctx.call("sum", ctx.call("mul", dp, p), dims=(-1,), keepdim=True)
    ds = ctx.call("mul", p, ctx.call("sub", dp, inner))  # NOTE: the gradient of the scores
    if ctx.wants(0):
        out[0] = ctx.sum_to(ctx.call("mul", ctx.call("matmul", ds, kc), scale), q.type)
    if ctx.wants(1):
        gk = ctx.call("matmul", ctx.call("transpose", ds, dim0=-2, dim1=-1), qc)
        gk = ctx.call("mul", gk, scale)
        out[1] = ctx.sum_to(_fold_heads(ctx, gk, groups) if groups > 1 else gk, k.type)
    if ctx.wants(3) and isinstance(mask, Value):
        out[3] = ctx.sum_to(ds, mask.type)  # NOTE: a float mask is added to the scores
    return out


@vjp("embedding")
def _embedding_vjp(ctx: VjpContext) -> list[Operand | None]:
    indices, w = ctx.inputs
    if not ctx.wants(1):
        return [None, None]
    g = ctx.grad()
    if not _static(g, indices, w):
        return torch_vjp_rule(ctx)
    assert isinstance(indices, Value)
    n = int(_tensor(w).shape[0])
    pad = ctx.attrs["padding_idx"]
    # NOTE: F.embedding counts a negative padding_idx from the end; -1 here means none
    pad = -1 if pad is None else (pad + n if pad < 0 else pad)
    (gw,) = _aten(
        ctx, "embedding_dense_backward", [g, indices], [{"t": 0}, {"t": 1}, n, pad, False]
    )
    return [None, gw]


@vjp("index_select")
def _index_select_vjp(ctx: VjpContext) -> list[Operand | None]:
    x, index = ctx.inputs
    if not ctx.wants(0):
        return [None, None]
    assert isinstance(x, Value) and isinstance(index, Value)
    g = ctx.grad()
    if not _static(g, x, index):
        return torch_vjp_rule(ctx)
    # NOTE: eager's index_select_backward: zeros of x's shape, index_add of the cotangent
    zeros = ctx.zeros_like(x)
    dim = ctx.attrs["dim"]
    (gx,) = _aten(ctx, "index_add", [zeros, index, g], [{"t": 0}, dim, {"t": 1}, {"t": 2}])
    return [gx, None]


def _pool_stride(attrs: Any) -> list[int]:
    return list(attrs["stride"] or attrs["kernel_size"])


@vjp("max_pool2d")
def _max_pool2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    assert isinstance(x, Value)
    g = ctx.grad()
    if not _static(g, x):
        return torch_vjp_rule(ctx)
    a = ctx.attrs
    window = max_pool_window(a)
    # NOTE: the node returns no indices: the rule finds them again (eager's kernel, its ties);
    # the autograd layer makes the node ATen's max_pool2d_with_indices where it can, which keeps
    # them (then this rule is not used)
    _, indices = _aten(ctx, "max_pool2d_with_indices", [x], [{"t": 0}, *window])
    (gx,) = max_pool_backward(ctx, g, x, indices, a)
    return [gx]


def max_pool_window(attrs: Any) -> list[Any]:
    """The window arguments of ATen's max_pool2d_with_indices for a max_pool2d node's attrs:
    kernel size, stride, padding, dilation, ceil mode."""
    return [
        list(attrs["kernel_size"]),
        _pool_stride(attrs),
        list(attrs["padding"]),
        list(attrs["dilation"]),
        attrs["ceil_mode"],
    ]


def max_pool_backward(
    ctx: VjpContext, g: Value, x: Value, indices: Value, attrs: Any
) -> tuple[Any, ...]:
    """``max_pool2d_with_indices_backward``: the cotangent routed to the maxima the forward
    found (its indices)."""
    literals = [{"t": 0}, {"t": 1}, *max_pool_window(attrs), {"t": 2}]
    return tuple(_aten(ctx, "max_pool2d_with_indices_backward", [g, x, indices], literals))


@vjp("avg_pool2d")
def _avg_pool2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    assert isinstance(x, Value)
    g = ctx.grad()
    if not _static(g, x):
        return torch_vjp_rule(ctx)
    a = ctx.attrs
    literals = [
        {"t": 0},
        {"t": 1},
        list(a["kernel_size"]),
        _pool_stride(a),
        list(a["padding"]),
        a["ceil_mode"],
        a["count_include_pad"],
        a["divisor_override"],
    ]
    (gx,) = _aten(ctx, "avg_pool2d_backward", [g, x], literals)
    return [gx]


@vjp("adaptive_avg_pool2d")
def _adaptive_avg_pool2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    assert isinstance(x, Value)
    g = ctx.grad()
    if not _static(g, x):
        return torch_vjp_rule(ctx)
    (gx,) = _aten(ctx, "_adaptive_avg_pool2d_backward", [g, x], [{"t": 0}, {"t": 1}])
    return [gx]


@vjp("dropout")
def _dropout_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Eval mode and p=0 are the identity, and p=1 multiplies by zero (eager draws nothing for
    either). Train mode's gradient for 0 < p < 1 is the mask it drew, which the node does not
    return: the joint graph first rewrites it into ``aten native_dropout`` (its mask an output;
    the same draws as F.dropout), whose rule reads the mask."""
    p, train = ctx.attrs["p"], ctx.attrs["train"]
    if not ctx.wants(0):
        return [None]
    if not train or p == 0:
        return [ctx.grad()]
    if p == 1:
        return [ctx.call("mul", ctx.grad(), 0.0)]  # NOTE: eager's x * zeros: NaN stays NaN
    raise NoDerivativeError(
        f"dropout in train mode (p={p}): its gradient needs the mask it drew; the joint graph "
        "must first rewrite it into aten native_dropout "
        "(plait.autograd.joint.prepare_for_autograd)"
    )


nondifferentiable("full", "zeros", "ones", "arange")


# --- PyTorch's autograd on a call it runs (opaque, aten, random nodes) ---------------------------
# NOTE: random ATen overloads whose eager derivative is zero for every operand (derivatives.yaml:
# zeros_like; the draw does not depend on the operand's value differentiably). A call made of
# these draws alone has no gradient; tests/autograd/test_vjp_extern.py checks each against eager.
ZERO_GRADIENT_DRAWS = frozenset(
    {
        "aten.bernoulli.default",
        "aten.bernoulli.Tensor",
        "aten.uniform.default",
        "aten.normal.Tensor_float",
        "aten.normal.float_Tensor",
        "aten.normal.Tensor_Tensor",
        "aten.exponential.default",
        "aten.geometric.default",
        "aten.log_normal.default",
        "aten.cauchy.default",
        "aten.poisson.default",
    }
)


@dataclass(frozen=True)
class CallProbe:
    """What PyTorch makes of one call, run once on fake tensors with the wanted operands
    requiring grad: whether autograd differentiates each result, the ATen overloads it
    dispatched (``aten.flip.default``) and those of them that draw random numbers."""

    differentiable: tuple[bool, ...]
    calls: tuple[str, ...]
    draws: tuple[str, ...]


def draws_random(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether ATen overload ``func`` called so draws from the generator: it is tagged
    ``nondeterministic_seeded`` and no argument turns its randomness off (``train=False``,
    ``dropout=0``, ``dropout_p=0``: the RNN and attention overloads)."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    bound = {arg.name: value for arg, value in zip(func._schema.arguments, args)}
    bound.update(kwargs)
    if bound.get("train") is False:
        return False
    return not any(bound.get(name) in (0, 0.0) for name in ("dropout", "dropout_p"))


@functools.lru_cache(maxsize=1024)
def probe_call(
    target: str, literals: str, kwliterals: str, operands: tuple[Type, ...], wanted: tuple[int, ...]
) -> CallProbe | None:
    """Run ``target`` (``aten.<name>.<overload>`` or a ``torch.*`` callable) with the node's
    arguments on fake CPU tensors, ``operands[i]`` requiring grad for ``i`` in ``wanted``; None
    when it cannot run so (no fake kernel, a symbolic shape)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    if target.startswith("aten."):
        from plait.ir.ops.aten import resolve_overload

        fn: Any = resolve_overload(*target.removeprefix("aten.").rsplit(".", 1))
    else:
        fn = resolve_target(target)
    calls: list[str] = []
    draws: list[str] = []

    class Dispatched(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func.namespace == "aten":
                calls.append(str(func))
                if draws_random(func, args, kwargs):
                    draws.append(str(func))
            return func(*args, **kwargs)

    if not all(isinstance(t, TensorType) and t.is_static for t in operands):
        return None
    try:
        # NOTE: fake CPU tensors whatever the node's device: autograd on fake CUDA tensors needs
        # a CUDA build, and differentiability and draws do not depend on the device
        with torch._C.DisableTorchFunction(), FakeTensorMode():
            fakes = [torch.empty(t.shape, dtype=t.dtype) for t in operands]  # type: ignore[union-attr]
            for i in wanted:
                fakes[i].requires_grad_(True)
            args, keywords = decode_call(fakes, literals, kwliterals)
            with torch.enable_grad(), Dispatched():
                out = fn(*args, **keywords)
    except Exception:  # NOTE: no fake kernel for this call: the caller assumes the worst
        return None
    outs = [o for o in out if o is not None] if isinstance(out, (tuple, list)) else [out]
    differentiable = tuple(isinstance(o, torch.Tensor) and o.requires_grad for o in outs)
    return CallProbe(differentiable, tuple(calls), tuple(draws))


def call_probe(ctx: VjpContext, target: str) -> CallProbe | None:
    """:func:`probe_call` for the node of ``ctx`` (an opaque, aten or random call node)."""
    if not all(isinstance(o, Value) for o in ctx.inputs):
        return None
    types = tuple(o.type for o in ctx.inputs if isinstance(o, Value))
    wanted = tuple(
        i
        for i, t in enumerate(types)
        if ctx.wants(i) and isinstance(t, TensorType) and t.dtype in FLOAT_DTYPES
    )
    return probe_call(target, ctx.attrs["literals"], ctx.attrs["kwliterals"], types, wanted)


def differentiated_call(ctx: VjpContext, probe: CallProbe | None) -> list[Operand | None]:
    """``torch_vjp`` over the node's reference, seeded with the cotangents of the results
    PyTorch's autograd differentiates (all of them when ``probe`` is None): a result it does not
    (``empty_like``, ``rand_like``) has no gradient, and ``torch.autograd.grad`` refuses it."""
    grads = list(ctx.grads)
    if probe is not None and len(probe.differentiable) == len(grads):
        grads = [g if d else None for g, d in zip(grads, probe.differentiable)]
    return torch_vjp_rule(VjpContext(ctx.builder, ctx.node, grads, ctx.needs))


@vjp("opaque")
def _opaque_vjp(ctx: VjpContext) -> list[Operand | None]:
    """PyTorch's autograd over the call (it runs the call again in the backward). NOTE: capture
    makes a call that moved the generator a ``random_call``; an opaque node whose call draws
    (a hand-written one) is refused: running it again would draw other numbers."""
    target = ctx.attrs["target"]
    probe = call_probe(ctx, target)
    if probe is not None and probe.draws:
        raise NoDerivativeError(
            f"opaque {target} draws random numbers ({', '.join(probe.draws)}): its gradient "
            "would run it again and draw others"
        )
    return differentiated_call(ctx, probe)
