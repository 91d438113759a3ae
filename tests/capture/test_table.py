"""The torch-function → IR table: each rule's IR computes exactly what eager PyTorch computes
(bitwise, on fresh inputs), including scalars on either side of an operator, dtype promotion,
casts, reductions, views and factories. Calls with no rule: an error under fullgraph, else an
opaque node that is counted and reported."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.frontend import table
from tests.capture.helpers import assert_same, opaque_path  # noqa: F401  (fixture)

X = (3, 4)
PROGRAMS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...], torch.dtype]] = {
    "scalar_ops": (
        lambda x: (2.0 + x, x - 1, 1 - x, 3 * x, x / 2, 2.0 / x, x**2, 2**x, -x, abs(x), x // 0.5),
        (X,),
        torch.float32,
    ),
    "int_promotion": (
        lambda x: (
            x + 1.5,
            x * 2,
            x / 2,
            x // 2,
            x > 1,
            (x == 2) & (x > 0),
            ~(x > 1),
            x.float().mean(),
        ),
        (X,),
        torch.int64,
    ),
    "bf16_scalars": (
        lambda x: (
            x * 0.1 + 1e-3,
            x.exp(),
            x.sigmoid(),
            x.float(),
            x.to(torch.float64),
            x.type_as(torch.ones(1)),
        ),
        (X,),
        torch.bfloat16,
    ),
    "unary": (
        lambda x: (
            x.relu(),
            x.tanh(),
            torch.erf(x),
            x.abs().sqrt(),
            x.abs().rsqrt(),
            x.abs().log(),
            x.reciprocal(),
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
            F.silu(x),
            torch.sigmoid(x),
        ),
        (X,),
        torch.float32,
    ),
    "binary": (
        lambda x, y: (
            x + y,
            torch.add(x, y, alpha=2),
            torch.sub(x, y, alpha=0.5),
            torch.rsub(x, y),
            x * y,
            x / y,
            torch.div(x, y, rounding_mode="trunc"),
            torch.maximum(x, y),
            torch.minimum(x, y),
            torch.max(x, y),
            x >= y,
            x != y,
            torch.logical_or(x > 0, y > 0),
        ),
        (X, X),
        torch.float32,
    ),
    "where_clamp": (
        lambda x, y: (
            torch.where(x > 0, x, y),
            torch.where(x > 0, x, 0.0),
            x.where(x > y, y),
            x.clamp(-0.5, 0.5),
            x.clamp(min=0),
            torch.clamp(x, max=y),
            x.clip(y, y + 1),
            x.masked_fill(y > 0, float("-inf")),
            x.long().masked_fill(y > 0, 7),
        ),
        (X, X),
        torch.float32,
    ),
    "reductions": (
        lambda x: (
            x.sum(),
            x.sum(1),
            x.sum(dim=(0, 1), keepdim=True),
            x.mean(-1, keepdim=True),
            x.sum(dtype=torch.float64),
            x.amax(0),
            x.amin(),
            x.max(),
            torch.min(x),
            x.var(1),
            x.var(unbiased=False),
            torch.var(x, 0, correction=0),
            x.softmax(-1),
            F.log_softmax(x, dim=0),
            F.softmax(x, 1, dtype=torch.float64),
        ),
        (X,),
        torch.float32,
    ),
    "matmul": (
        lambda a, b: (
            a @ b.t(),
            torch.matmul(a, b.T),
            a.mm(b.mT),
            torch.bmm(a[None], b.t()[None]),
            F.linear(a, b),
        ),
        (X, X),
        torch.float32,
    ),
    "views": (
        lambda x: (
            x.view(2, 6),
            x.reshape(-1),
            x.view(4, 3).t(),
            x.permute(1, 0),
            x.transpose(0, 1),
            x.unsqueeze(0).expand(2, 3, 4),
            x[None].squeeze(0),
            x.flatten(),
            x.unflatten(1, (2, 2)),
            x.narrow(1, 1, 2),
            x.select(0, -1),
            x.expand_as(torch.empty(2, 3, 4)),
            x.view_as(torch.empty(12)),
            x.contiguous(),
            x.t().contiguous(),
        ),
        (X,),
        torch.float32,
    ),
    "indexing": (
        lambda x: (
            x[0],
            x[-1, 1:],
            x[:, ::2],
            x[..., None, 1],
            x[1:, None],
            x[:, torch.tensor([3, -1, 0])],
            x[torch.tensor([[0, 2], [1, 1]])],
            x.index_select(1, torch.tensor([2, 0])),
        ),
        (X,),
        torch.float32,
    ),
    "split_cat": (
        lambda x: (
            *x.split(2, dim=1),
            *torch.split(x, [1, 2], 0),
            *x.chunk(3, 1),
            *x.unbind(1),
            torch.cat([x, x], 1),
            torch.stack([x, x], -1),
            torch.cat((x, x.long()), 0),
            list(x),
        ),
        (X,),
        torch.float32,
    ),
    "factories": (
        lambda x: (
            torch.zeros(2, 3),
            torch.ones((2,), dtype=torch.int32),
            torch.full((2, 2), 1.5),
            torch.full((2,), 3),
            torch.zeros_like(x),
            torch.ones_like(x, dtype=torch.float64),
            torch.full_like(x, -1),
            x.new_zeros(3),
            x.new_ones((2, 2)),
            x.new_full((1,), 7.0),
            torch.arange(5),
            torch.arange(1, 4, 0.5),
            torch.arange(x.shape[1]),
            torch.tensor([1.0, 2.0]) * x[0, :2],
            torch.tril(torch.ones(3, 3)),
            x.triu(1),
        ),
        (X,),
        torch.float32,
    ),
    "attention": (
        lambda q, k: (
            F.scaled_dot_product_attention(q, k, k),
            F.scaled_dot_product_attention(q, k, k, is_causal=True),
            F.scaled_dot_product_attention(q, k, k, attn_mask=q @ k.mT),
            F.scaled_dot_product_attention(q, k, k, scale=0.3),
        ),
        ((2, 5, 8), (2, 5, 8)),
        torch.float32,
    ),
    "nn": (
        lambda x: (
            F.layer_norm(x, (4,)),
            F.group_norm(x[None, :, :, None], 3),
            F.max_pool2d(x[None, None], 2),
            F.avg_pool2d(x[None, None], (1, 2)),
            F.adaptive_avg_pool2d(x[None, None], (None, 2)),
            F.batch_norm(x, None, None, training=True),
            F.hardtanh(x),
            F.dropout(x, 0.3, training=False),
        ),
        (X,),
        torch.float32,
    ),
    "metadata": (
        lambda x: (
            x.shape,
            x.size(-1),
            x.dim(),
            x.ndim,
            x.numel(),
            len(x),
            x.dtype,
            x.device,
            x.is_floating_point(),
            torch.is_floating_point(x),
            torch.is_complex(x),
            torch.is_signed(x),
            x.requires_grad,
            x * math.sqrt(x.size(-1)),
            x.new_zeros(x.shape[::-1]),
        ),
        (X,),
        torch.float32,
    ),
}


def _make(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(-3, 4, shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_rule_matches_eager(name: str) -> None:
    fn, shapes, dtype = PROGRAMS[name]
    compiled = plait.compile(fn, backend="eager", fullgraph=True)
    for i in range(2):
        g = torch.Generator().manual_seed(i)
        args = [_make(s, dtype, g) for s in shapes]
        assert_same(compiled(*args), fn(*args), name)
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].opaque_counts == {}


def test_conv2d_variants() -> None:
    w = torch.randn(4, 2, 3, 3)

    def f(x: torch.Tensor) -> Any:
        return (
            F.conv2d(x, w, padding=1),
            F.conv2d(x, w, stride=2, dilation=(1, 2)),
            F.conv2d(x, w, padding="same"),
            F.conv2d(x, w[:, :1], groups=2, padding="valid"),
        )

    compiled = plait.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(1, 2, 7, 7)
    assert_same(compiled(x), f(x))
    assert sum(v.kind == "const" for v in compiled.specializations[0].graph.inputs) == 1


def test_unknown_call_is_an_error_under_fullgraph() -> None:
    """A call with no rule and no faithful ATen program (gaussian_nll_loss reads its ``var``
    to raise on negative entries) is an error under fullgraph, naming both."""
    fn = lambda x: F.gaussian_nll_loss(x, x, x.abs())
    with pytest.raises(GraphCaptureError, match=r"no capture rule maps .*gaussian_nll") as info:
        plait.capture(fn, (torch.randn(3),))
    assert info.value.kind == "unsupported"
    assert "no ATen program" in str(info.value)


def test_unknown_call_with_an_aten_program_is_captured_under_fullgraph() -> None:
    captured = plait.capture(lambda x: x.cumprod(0), (torch.randn(3),))
    assert [(n.op, n.attrs["name"]) for n in captured.graph.nodes] == [("aten", "cumprod")]


@pytest.mark.usefixtures("opaque_path")
def test_unknown_call_becomes_a_counted_opaque_node() -> None:
    f = plait.compile(lambda x: torch.lgamma(x) + torch.digamma(x).lgamma(), backend="eager")
    x = torch.randn(5)
    with pytest.warns(CaptureFallbackWarning, match=r"opaque PyTorch nodes: .*torch.digamma x1"):
        assert_same(f(x), torch.lgamma(x) + torch.digamma(x).lgamma())
    spec = f.specializations[0]
    assert spec.opaque_counts == {"torch.Tensor.lgamma": 1, "torch.lgamma": 1, "torch.digamma": 1}
    assert [n.attrs["target"] for n in spec.graph.nodes if n.op == "opaque"] == [
        "torch.lgamma",
        "torch.digamma",
        "torch.Tensor.lgamma",
    ]


def test_unknown_call_the_ir_cannot_express_falls_back() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.bernoulli(generator=torch.Generator().manual_seed(0))

    f = plait.compile(fn, backend="eager")
    x = torch.rand(4) / 4
    with pytest.warns(CaptureFallbackWarning, match="cannot be an opaque node: a Generator"):
        assert_same(f(x), fn(x))
    assert f.specializations[0].graph is None


def test_table_covers_the_core_spellings() -> None:
    covered = set(table.covered())
    for func in (
        torch.add,
        torch.Tensor.add,
        torch.Tensor.__add__,
        torch.Tensor.__radd__,
        torch.Tensor.add_,
        torch.Tensor.__iadd__,
        F.relu,
        torch.relu_,
        F.linear,
        F.conv2d,
        F.batch_norm,
        F.layer_norm,
        F.scaled_dot_product_attention,
        torch.Tensor.shape.__get__,  # type: ignore[attr-defined]
        torch.Tensor.size,
        torch.Tensor.item,
    ):
        assert func in covered, func
