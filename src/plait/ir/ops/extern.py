"""Extern ops (heavy kernels PyTorch already does best), random ops, constants and opaque calls."""

from __future__ import annotations

import importlib
import json
import struct
from typing import Any

import sympy
import torch
import torch.nn.functional as F

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
