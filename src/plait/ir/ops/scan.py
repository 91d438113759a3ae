"""``cumsum``: the running sum along one dim, an extern op (Stax has no scan template: ATen's
kernel runs it, so its results are eager's bit for bit), typed at symbolic dims like any IR op.

Hugging Face's causal masks for training (no cache, no attention mask: ``masking_utils``'s
packed-sequence check) take the ``cumsum`` of a ``(batch, tokens)`` comparison; without an IR
op it was an ``aten`` or opaque node, which take static shapes, so a language model trained
with ``dynamic=True`` ran wholly in eager. The result dtype is PyTorch's: ``dtype`` when given,
else int64 for integer and bool inputs, the input's otherwise. Its derivative is PyTorch's
(``torch_vjp``).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, interpret
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((2, 3), torch.bool))
    >>> gb.output(gb.call("cumsum", x, dim=1))
    >>> g = gb.build()
    >>> str(g.outputs[0].type)
    'i64[2, 3]'
    >>> interpret(g, [torch.tensor([[True, False, True], [False, True, True]])])[0].tolist()
    [[1, 1, 2], [0, 1, 2]]
"""

from __future__ import annotations

import torch

from plait.ir.ops.extern import ALL
from plait.ir.ops.registry import Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.ops.rules import wrap_dim
from plait.ir.ops.vjp import torch_vjp_rule, vjp
from plait.ir.types import TensorType, Type


def _cumsum_rule(x: TensorType, dim: int, dtype: torch.dtype | None) -> list[Type]:
    wrap_dim(dim, max(x.rank, 1), "cumsum")
    if dtype is None:
        floating = x.dtype.is_floating_point or x.dtype.is_complex
        dtype = x.dtype if floating else torch.int64
    if dtype == torch.bool:
        raise TypeRuleError("cumsum: a bool result dtype")
    return [TensorType(x.shape, dtype, x.device)]


register(
    OpDef(
        "cumsum",
        Category.EXTERN,
        (Param("x"),),
        (Attr("dim", "int"), Attr("dtype", "dtype?", None)),
        _cumsum_rule,
        lambda x, dim, dtype: torch.cumsum(x, dim, dtype=dtype),
        ALL,
    )
)
vjp("cumsum")(torch_vjp_rule)
