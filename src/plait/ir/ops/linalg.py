"""Dense extern ops (heavy kernels PyTorch already does best): convolution, matrix products,
attention, embedding lookups and index selection; with their derivatives."""

from __future__ import annotations

import math

import sympy
import torch
import torch.nn.functional as F

from plait.ir.graph import Operand, Value
from plait.ir.ops.registry import (
    OPTIONAL_TENSOR,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import broadcast_shapes, device_of, require_float, wrap_dim
from plait.ir.ops.vjp import (
    NoDerivativeError,
    VjpContext,
    all_static,
    aten_node,
    tensor_type,
    torch_vjp_rule,
    vjp,
)
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


def conv_out_size(n: Dim, k: int, stride: int, pad: int, dil: int, ceil: bool = False) -> Dim:
    """The output length of a convolution or pooling window sliding over ``n``."""
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
        conv_out_size(x.shape[2 + i], int(w.shape[2 + i]), stride[i], padding[i], dilation[i])
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


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: the heavy backward kernels are typed ATen nodes (PyTorch's own backward kernels, eager's
# derivative); an ``aten`` node takes static shapes, so a node of symbolic shape falls back to
# ``torch_vjp`` (PyTorch's autograd over the reference, which runs the forward op again).


@vjp("conv2d")
def _conv2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    x, w, b = ctx.inputs
    output_mask = [ctx.wants(0), ctx.wants(1), ctx.wants(2)]
    g = ctx.grad()
    if not all_static(g, x, w):
        return torch_vjp_rule(ctx)
    assert isinstance(x, Value) and isinstance(w, Value)
    a = ctx.attrs
    # NOTE: eager's convolution_backward: one kernel for every wanted gradient; the forward
    # convolution never runs again (output_mask leaves the unwanted ones undefined: no outputs)
    bias_sizes = [tensor_type(w).shape[0]] if isinstance(b, Value) else None
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
    found = iter(aten_node(ctx, "convolution_backward", [g, x, w], literals))
    return [next(found) if wanted else None for wanted in output_mask]


@vjp("linear")
def _linear_vjp(ctx: VjpContext) -> list[Operand | None]:
    x, w, b = ctx.inputs
    g = ctx.grad()
    tx, tw = tensor_type(x), tensor_type(w)
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
    ta, tb = tensor_type(a), tensor_type(b)
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
    t = tensor_type(x)
    *lead, h, s, e = t.shape
    wide = ctx.call("expand", ctx.call("unsqueeze", x, dim=-3), shape=(*lead, h, groups, s, e))
    return ctx.call("reshape", wide, shape=(*lead, normalize(h * groups), s, e))


def _fold_heads(ctx: VjpContext, g: Value, groups: int) -> Value:
    """The gradient of :func:`_repeat_heads`: each key/value head sums its query heads'."""
    *lead, h, s, e = tensor_type(g).shape
    split = ctx.call("reshape", g, shape=(*lead, normalize(h // groups), groups, s, e))
    return ctx.call("sum", split, dims=(len(lead) + 1,), keepdim=False)


@vjp("scaled_dot_product_attention")
def _sdpa_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Attention's gradient from its math: the scores and their softmax are computed again
    (the node does not keep them), then the four products of the softmax's backward. On CUDA,
    PyTorch's autograd over eager's fused kernel instead (``torch_vjp``).

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
    tq, tk = tensor_type(q), tensor_type(k)
    head_dim = tq.shape[-1]
    if tq.device.startswith("cuda") or not torch._C._get_flash_sdp_enabled():
        # NOTE: the kernel eager picks under the guarded backend settings (on CUDA flash,
        # memory-efficient or cuDNN; with flash off, its math path), forward again then
        # backward, through autograd: eager's gradient, where the math below differs (on CUDA
        # five float32 products; eager's math scales q and k before their product)
        return torch_vjp_rule(ctx)
    if a["scale"] is None and not isinstance(head_dim, int):
        return torch_vjp_rule(ctx)
    assert isinstance(q, Value) and isinstance(k, Value) and isinstance(v, Value)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(int(head_dim))
    # NOTE: half precision computes in float32 (eager's kernels accumulate in float32)
    work = torch.float32 if tq.dtype in (torch.float16, torch.bfloat16) else tq.dtype

    def up(x: Value) -> Value:
        return x if tensor_type(x).dtype == work else ctx.call("to_dtype", x, dtype=work)

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
    elif isinstance(mask, Value) and tensor_type(mask).dtype == torch.bool:
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
    if not all_static(w):
        return torch_vjp_rule(ctx)
    # NOTE: the cotangent and indices may be symbolic: the node is typed by probing
    # (plait.ir.ops.aten_symbolic), its result the weight's static shape
    assert isinstance(indices, Value)
    n = int(tensor_type(w).shape[0])
    pad = ctx.attrs["padding_idx"]
    # NOTE: F.embedding counts a negative padding_idx from the end; -1 here means none
    pad = -1 if pad is None else (pad + n if pad < 0 else pad)
    (gw,) = aten_node(
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
    if not all_static(g, x, index):
        return torch_vjp_rule(ctx)
    # NOTE: eager's index_select_backward: zeros of x's shape, index_add of the cotangent
    zeros = ctx.zeros_like(x)
    dim = ctx.attrs["dim"]
    (gx,) = aten_node(ctx, "index_add", [zeros, index, g], [{"t": 0}, dim, {"t": 1}, {"t": 2}])
    return [gx, None]
