"""16-bit matrix products on CUDA with a dimension that is not a multiple of 8, computed on
operands zero-padded to multiples of 8.

cuBLAS's tensor-core kernels for Hopper read their operands through leading dimensions that
are multiples of 16 bytes; a product whose row length is odd (GPT-2's vocabulary of 50,257
tokens: the language-model head's logits, and both of its gradients) runs an older, slower
kernel (on an H200, 2.2-3.4 ms per product for GPT-2's head at 4,096 tokens, a third of a
training step). Each such product here copies its operands into zero-filled buffers whose
dimensions are rounded up to 8 (keeping each operand's orientation), runs the product there and
returns the view of the real rows and columns. The padding adds only products of zeros, so the
result is the product's, summed in another order: within the contract's matmul row. In a
training step's halves the ``pad-products`` pass (:mod:`plait.passes.pad_products`) writes such
padding into the graph first, one padded value per source shared by every product reading it
(the head's two gradient products: one padded cotangent); what is left is padded here.

Example (the arithmetic is device-independent)::

    >>> import torch
    >>> a, b = torch.randn(5, 3), torch.randn(3, 7)
    >>> bool(torch.allclose(padded_matmul(a, b), a @ b))
    True
    >>> padded_matmul(a, b).shape, padded_matmul(a, b).stride()
    (torch.Size([5, 7]), (8, 1))
    >>> padded_matmul(a.t().contiguous().t(), b).stride()  # a column-major: M padded too
    (8, 1)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from plait.passes.product_alignment import ALIGN


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _padded_matrix(m: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``m`` (2-d) in a zero-filled ``(rows, cols)`` buffer, its orientation kept: a
    column-major operand stays column-major (cuBLAS reads it transposed either way)."""
    r, c = m.shape
    if m.stride(-1) == 1 or c == 1:
        out = m.new_empty(rows, cols)
    else:
        out = m.new_empty(cols, rows).t()
    out[:r, :c] = m
    # NOTE: zeros in the padding only (a whole-buffer fill is another pass over the operand)
    if cols > c:
        out[:, c:].zero_()
    if rows > r:
        out[r:, :c].zero_()
    return out


def _padded_last(x: torch.Tensor, size: int) -> torch.Tensor:
    k = x.shape[-1]
    if k == size:
        return x
    out = x.new_empty(*x.shape[:-1], size)
    out[..., :k] = x
    out[..., k:].zero_()
    return out


def _column_major(m: torch.Tensor) -> bool:
    return m.dim() == 2 and m.stride(0) == 1 and m.stride(1) != 1


def padded_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``a`` of shape ``(..., M, K)`` and a matrix ``b`` ``(K, N)``; M is padded
    only where it is ``a``'s leading dimension (``a`` column-major)."""
    k, n = b.shape
    m = a.shape[-2]
    rows = _up(m) if _column_major(a) else m
    if k % ALIGN == 0 and n % ALIGN == 0 and rows == m:
        return torch.matmul(a, b)
    kp, np_ = _up(k), _up(n)
    bp = _padded_matrix(b, kp, np_)
    if a.dim() == 2:
        return torch.matmul(_padded_matrix(a, rows, kp), bp)[:m, :n]
    return torch.matmul(_padded_last(a, kp), bp)[..., :n]


def padded_linear(x: torch.Tensor, w: torch.Tensor, bias: Any = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` with ``w`` ``(N, K)``."""
    n, k = w.shape
    kp, np_ = _up(k), _up(n)
    wp = _padded_matrix(w, np_, kp)
    bp = None if bias is None else _padded_last(bias, np_)
    return F.linear(_padded_last(x, kp), wp, bp)[..., :n]
