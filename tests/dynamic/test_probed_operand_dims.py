"""Result dims of a probed ``aten`` node (``plait.ir.ops.aten_symbolic``) that are operand dims
other than a bare symbol: attention's fused kernel on a sliced query (``s1 - 1`` rows against
``s1`` keys), a concatenated one (``s1 + 1``), a flattened one (``s0*s1``). Before, only a bare
symbol was recognized, so a training capture of such attention could not type its nodes. A dim
two operand dims match at both assignments is ambiguous and raises.

End to end, such programs train in Stax (``tests/dynamic/test_symbolic_slices_in_stax.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import sympy
import torch

from plait.ir.ops.aten_symbolic import probed_types
from plait.ir.ops.registry import TypeRuleError
from plait.ir.types import TensorType
from plait.symbolic import symbol

S0, S1 = symbol("s0"), symbol("s1")


def _flash_forward(ops: Sequence[TensorType]) -> list[TensorType]:
    """The CPU flash attention's meta kernel on static operand types."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch._C.DisableTorchFunction(), FakeTensorMode():
        q, k, v = (torch.empty(t.shape, dtype=t.dtype) for t in ops)
        outs = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v)
        return [TensorType(tuple(o.shape), o.dtype) for o in outs]


@pytest.mark.parametrize(
    "rows", [S1 - 1, S1 + 1, S0 * S1], ids=["sliced", "concatenated", "flattened"]
)
def test_a_result_dim_may_be_an_operand_dim(rows: sympy.Expr) -> None:
    q = TensorType((S0, 2, rows, 4), torch.float32)
    kv = TensorType((S0, 2, S1, 4), torch.float32)
    out, logsumexp = probed_types(_flash_forward, (q, kv, kv))
    assert out.shape == (S0, 2, rows, 4), out
    assert logsumexp.shape == (S0, 2, rows), logsumexp


def test_a_result_dim_two_operand_dims_match_raises() -> None:
    """``2*floor(s0/2) + 1`` is ``s0`` at every odd prime: the probe cannot tell them apart."""
    odd = 2 * sympy.floor(S0 / 2) + 1
    ops = (TensorType((S0, 3), torch.float32), TensorType((odd, 3), torch.float32))

    def first(o: Sequence[TensorType]) -> list[TensorType]:
        return [TensorType(o[0].shape, torch.float32)]

    with pytest.raises(TypeRuleError, match="could be any of"):
        probed_types(first, ops)
