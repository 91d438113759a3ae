"""``torch._native_multi_head_attention`` called by the program (the kernel of
``nn.MultiheadAttention``'s fast path): with ``need_weights=False`` its kernel returns no weights
(``None``) where its meta kernel makes an empty tensor, so the ATen node typed a result eager
leaves undefined and capture crashed with an ``AttributeError``. The node's outputs are now the
results its arguments ask for (``need_weights`` decides the weights, as ``output_mask`` decides a
backward kernel's), and the call compiles to one ATen extern node that gives eager's bits, with
weights or without, with a mask or without (rows whose every key is masked: NaN as eager's)."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.ir.ops.aten import output_mask
from tests.util import assert_bitwise

E, HEADS = 8, 2
NO_CACHE = {"cache": False}


def _weights(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3 * E, E), (3 * E,), (E, E), (E,)]
    return tuple(torch.randn(*s, generator=g) for s in shapes)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask", [None, "key_padding", "attention"])
def test_native_attention_compiles_as_eager(need_weights: bool, mask: str | None) -> None:
    qkv_w, qkv_b, proj_w, proj_b = _weights(0)
    mask_type = {None: None, "key_padding": 1, "attention": 0}[mask]

    def program(q: torch.Tensor, m: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        return torch._native_multi_head_attention(
            q, q, q, E, HEADS, qkv_w, qkv_b, proj_w, proj_b, m,
            need_weights=need_weights, mask_type=mask_type,
        )  # fmt: skip

    compiled = plait.compile(program, fullgraph=True, options=NO_CACHE)
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        q = torch.randn(2, 5, E, generator=g)
        m = None
        if mask == "key_padding":
            m = torch.rand(2, 5, generator=g) > 0.5
            m[1] = True  # NOTE: every key of one batch entry masked
        elif mask == "attention":
            m = torch.rand(5, 5, generator=g) > 0.5
        with torch.no_grad():
            got, want = compiled(q, m), program(q, m)
        assert len(got) == len(want) == 2
        assert_bitwise(got[0], want[0], "output")
        if need_weights:
            assert_bitwise(got[1], want[1], "weights")
        else:
            assert got[1] is None and want[1] is None
    counts = compiled.specializations[0].manifest.executor["evidence"]["counts"]
    assert counts["fallback"] == 0, counts


def test_the_weights_flag_decides_the_defined_results() -> None:
    op = torch.ops.aten._native_multi_head_attention.default
    nine = [None] * 9
    assert output_mask(op, nine, {"need_weights": False}) == [True, False]
    assert output_mask(op, [*nine, None, False], {}) == [True, False]
    assert output_mask(op, nine, {}) == [True, True]  # NOTE: the schema's default
    assert output_mask(torch.ops.aten.relu.default, [None], {}) is None
