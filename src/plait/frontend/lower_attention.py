"""Capture rule for ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``'s slow path).

``nn.MultiheadAttention`` takes its fused fast path only for plain tensors; under capture its
arguments are tracers, so it calls ``F.multi_head_attention_forward``, which returns
``(output, None)`` when ``need_weights=False`` (torchvision's ViT). The rule writes that path as
PyTorch does: the packed in-projection (one ``linear`` when query, key and value are one tensor,
else one per part of the packed weight), heads split by reshapes, ``scaled_dot_product_attention``,
the heads merged back and the out-projection. Every other form (attention weights asked for,
masks, ``bias_k``/``bias_v``, ``add_zero_attn``, separate projection weights, static keys,
dropout in training, unbatched input) raises :class:`~plait.frontend.table.NoIROp`: the call
stays an announced opaque node.

Example:
    >>> import torch, plait
    >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    >>> f = plait.compile(lambda x: mha(x, x, x, need_weights=False)[0], backend="eager")
    >>> x = torch.randn(2, 5, 8)
    >>> with torch.no_grad():
    ...     torch.allclose(f(x), mha(x, x, x, need_weights=False)[0], atol=1e-6)
    True
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F

from plait.frontend.table import NoIROp, op
from plait.frontend.tracer import CaptureContext
from plait.ir import TensorType, Value


def _shape(cx: CaptureContext, t: Any) -> tuple[int, ...]:
    ty = cx.value(t).type
    if not isinstance(ty, TensorType) or not all(isinstance(d, int) for d in ty.shape):
        raise NoIROp("multi_head_attention_forward needs tensors of static sizes")
    return tuple(int(d) for d in ty.shape)


def _unsupported(**forms: Any) -> str | None:
    for name, used in forms.items():
        if used:
            return name
    return None


@op(F.multi_head_attention_forward)
def _multi_head_attention_forward(
    cx: CaptureContext,
    out: Any,
    query: Any,
    key: Any,
    value: Any,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Any,
    in_proj_bias: Any,
    bias_k: Any,
    bias_v: Any,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Any,
    out_proj_bias: Any,
    training: bool = True,
    key_padding_mask: Any = None,
    need_weights: bool = True,
    attn_mask: Any = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Any = None,
    k_proj_weight: Any = None,
    v_proj_weight: Any = None,
    static_k: Any = None,
    static_v: Any = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> Any:
    form = _unsupported(
        need_weights=need_weights,
        bias_k=bias_k is not None or bias_v is not None,
        add_zero_attn=add_zero_attn,
        key_padding_mask=key_padding_mask is not None,
        attn_mask=attn_mask is not None,
        is_causal=is_causal,
        use_separate_proj_weight=use_separate_proj_weight or in_proj_weight is None,
        static_k=static_k is not None or static_v is not None,
        dropout=training and dropout_p > 0,
    )
    if form is not None:
        raise NoIROp(f"multi_head_attention_forward with {form} has no IR op")
    shapes = [_shape(cx, t) for t in (query, key, value)]
    if any(len(s) != 3 for s in shapes):
        raise NoIROp("multi_head_attention_forward of unbatched (2-D) inputs has no IR op")
    (tgt, bsz, embed), (src, _, _), _ = shapes
    heads = int(num_heads)
    head_dim = embed // heads
    q, k, v = _in_projection(cx, query, key, value, in_proj_weight, in_proj_bias, embed)

    def split_heads(x: Value, length: int) -> Value:
        x = cx.call("reshape", x, shape=(length, bsz * heads, head_dim))
        x = cx.call("transpose", x, dim0=0, dim1=1)
        v: Value = cx.call("reshape", x, shape=(bsz, heads, length, head_dim))
        return v

    attn = cx.call(
        "scaled_dot_product_attention",
        split_heads(q, tgt),
        split_heads(k, src),
        split_heads(v, src),
        None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
    )
    merged = cx.call("permute", attn, dims=(2, 0, 1, 3))
    merged = cx.call("reshape", merged, shape=(tgt * bsz, embed))
    projected = cx.call("linear", merged, cx.value(out_proj_weight), _optional(cx, out_proj_bias))
    result = cx.call("reshape", projected, shape=(tgt, bsz, _shape(cx, out_proj_weight)[0]))
    return (result, None)


def _optional(cx: CaptureContext, t: Any) -> Value | None:
    return None if t is None else cx.value(t)


def _in_projection(
    cx: CaptureContext, q: Any, k: Any, v: Any, w: Any, b: Any, embed: int
) -> tuple[Value, Value, Value]:
    """PyTorch's ``_in_projection_packed``: one linear when query, key and value are one
    tensor (then split in three), else each through its third of the packed weight."""
    if q is k and k is v:
        packed = cx.call("linear", cx.value(q), cx.value(w), _optional(cx, b))
        parts = tuple(
            cx.call("slice", packed, dim=-1, start=i * embed, end=(i + 1) * embed, step=1)
            for i in range(3)
        )
        return parts[0], parts[1], parts[2]
    out = []
    for i, x in enumerate((q, k, v)):
        wi = cx.call("slice", cx.value(w), dim=0, start=i * embed, end=(i + 1) * embed, step=1)
        bi = None
        if b is not None:
            bi = cx.call("slice", cx.value(b), dim=0, start=i * embed, end=(i + 1) * embed, step=1)
        out.append(cx.call("linear", cx.value(x), wi, bi))
    return out[0], out[1], out[2]
