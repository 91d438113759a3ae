"""Causal self-attention on the CPU in blocks of query rows.

ATen's CPU flash kernel walks the keys in blocks of 512 and, under ``is_causal``, skips only
whole blocks past the diagonal: for a sequence of up to about a thousand tokens it computes
every score above the diagonal and then masks it (at 512 tokens, twice the products causal
attention needs). Here the query rows go in blocks of :data:`ROWS`, each block against the keys
up to its own last row, with the diagonal's additive mask (a slice of one cached
``(MAX_LEN, MAX_LEN)`` causal mask): the same kernel, the same result within the contract's
attention row (the softmax sums over fewer masked terms: rounding, not a different function),
about 60% of the work.

Only where it is faster on the kernel's blocking: a float32 query of :data:`MIN_LEN` to
:data:`MAX_LEN` tokens, as long as the keys; other lengths (decided per call, so a symbolic
sequence length works) call the op as eager does. So do operands eager would not give its flash
kernel (a last dim that is not contiguous, which the kernel reads as if it were) and operands
whose scores or values are not all safely finite (:func:`same_function`): the additive mask
meets an infinite score past the diagonal as ``inf - inf = NaN`` where eager's causal kernel
overwrites it, and a 64-row block multiplies fewer infinite values by zero weights than eager's
512-key blocks do.

Example:
    >>> import torch
    >>> from torch.nn.functional import scaled_dot_product_attention as sdpa
    >>> q, k, v = (torch.randn(1, 2, 200, 16) for _ in range(3))
    >>> attend = causal_in_row_blocks(scale=None)
    >>> bool(torch.allclose(attend(q, k, v), sdpa(q, k, v, is_causal=True), atol=1e-6))
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from plait.ir.graph import Node
from plait.ir.types import TensorType

ROWS = 64
# NOTE: measured against the whole-sequence kernel (torch 2.13, AVX-512, float32, 12 heads of
# 64): 0.75-0.9x its time from 128 to 896 tokens, 0.6-0.7x at 256-512; none at 1024 and more,
# where the kernel's own block skipping applies.
MIN_LEN, MAX_LEN = 128, 1023

_MASKS: dict[torch.dtype, torch.Tensor] = {}


def applies(node: Node) -> bool:
    """Whether an attention node may run in row blocks: on the CPU, float32, causal, without a
    mask, dropout or grouped heads, query, keys and values of one shape (batch and heads not
    broadcast: the flash kernel reads one batch of keys per batch of queries), and a positive
    scale if any: eager's causal kernel scales the scores after masking them, so a zero or
    negative scale makes NaN and positive infinities of the masked ones, which the row blocks'
    additive mask would not."""
    a = node.attrs
    if not a["is_causal"] or a["dropout_p"] != 0 or a["enable_gqa"]:
        return False
    if a["scale"] is not None and not a["scale"] > 0:
        return False
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return False
    types = [getattr(x, "type", None) for x in node.inputs[:3]]
    q, k, v = types
    if not (isinstance(q, TensorType) and isinstance(k, TensorType) and isinstance(v, TensorType)):
        return False
    if q.device != "cpu" or {q.dtype, k.dtype, v.dtype} != {torch.float32}:
        return False
    if q.rank != 4 or k.rank != 4 or v.rank != 4:
        return False
    return q.shape == k.shape == v.shape


def _mask(dtype: torch.dtype) -> torch.Tensor:
    """The additive causal mask of :data:`MAX_LEN` tokens: 0 on and below the diagonal, -inf
    above. Rows ``[o, e)`` against keys ``[0, e)`` are its slice ``[o:e, :e]``.

    NOTE: on the CPU whatever the default device (``torch.set_default_device``) of the call
    that first makes it: it is kept for every later call."""
    if dtype not in _MASKS:
        cpu = torch.device("cpu")
        keep = torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool, device=cpu).tril()
        mask = torch.zeros(MAX_LEN, MAX_LEN, dtype=dtype, device=cpu)
        _MASKS[dtype] = mask.masked_fill(~keep, -torch.inf)
    return _MASKS[dtype]


# NOTE: a float32 sum of products whose exact magnitudes sum to less than this stays finite,
# in any order of summation (each rounding grows it by at most 2**-24 times itself)
_SAFE = torch.finfo(torch.float32).max / 2


def same_function(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> bool:
    """Whether the row blocks compute eager's function on these operands (else the op runs as
    in eager): eager runs its flash kernel on them (one shape, unit last-dim strides), every
    score ``q k^T * scale`` is finite (bounded by the operands' largest magnitudes: no NaN, no
    overflow) and so is every weighted sum of values. Reads each operand once."""
    if not q.shape == k.shape == v.shape or q.numel() == 0:
        return False
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return False
    dim, length = q.shape[-1], q.shape[-2]
    s = abs(scale) if scale is not None else dim**-0.5
    mq, mk, mv = (float(t.abs().amax()) for t in (q, k, v))
    # NOTE: NaN compares false: an operand holding NaN or an infinity runs as in eager
    return dim * mq * mk * max(1.0, s) < _SAFE and length * mv < _SAFE


def causal_in_row_blocks(scale: float | None) -> Callable[..., torch.Tensor]:
    """``scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)`` for the
    :func:`applies` cases, in row blocks where the length is in range."""
    sdpa = torch._C._nn.scaled_dot_product_attention
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: None = None
    ) -> torch.Tensor:
        length = q.shape[-2]
        if not MIN_LEN <= length <= MAX_LEN or not torch._C._get_flash_sdp_enabled():
            return sdpa(q, k, v, None, 0.0, True, scale=scale)
        if not same_function(q, k, v, scale):
            return sdpa(q, k, v, None, 0.0, True, scale=scale)
        b, h, _, d = q.shape
        # NOTE: the layout the whole-sequence flash kernel returns (batch, tokens, heads, dim),
        # on q's device (never the default device)
        out = torch.empty(b, length, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
        causal = _mask(q.dtype)
        for start in range(0, length, ROWS):
            end = min(start + ROWS, length)
            rows = flash(
                q[:, :, start:end], k[:, :, :end], v[:, :, :end],
                attn_mask=causal[start:end, :end], scale=scale,
            )[0]  # fmt: skip
            out[:, :, start:end] = rows
        return out

    return attend
