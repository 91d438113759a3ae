"""Causal self-attention on the CPU in blocks of query rows (``plait.codegen.causal_attention``):
within the contract's attention row of eager's kernel at every length around the block and
range bounds, chosen only where it applies, named in the evidence, and per call under a symbolic
sequence length."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen import causal_attention
from plait.ir import GraphBuilder, TensorType
from plait.runtime import compile_graph
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.util import contract_tol

ATTN = contract_tol("attention", torch.float32)
LENGTHS = [
    causal_attention.MIN_LEN - 1,
    causal_attention.MIN_LEN,
    causal_attention.ROWS * 3 + 5,
    512,
    causal_attention.MAX_LEN,
    causal_attention.MAX_LEN + 1,
]


def _heads(gen: torch.Generator, batch: int, length: int) -> list[torch.Tensor]:
    """q, k, v as transposed views of one projection, as GPT-2 makes them."""
    qkv = torch.randn(batch, length, 3 * 48, generator=gen)
    return [t.view(batch, length, 3, 16).transpose(1, 2) for t in qkv.split(48, dim=2)]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_row_blocks_match_eager(length: int, scale: float | None) -> None:
    attend = causal_attention.causal_in_row_blocks(scale)
    gen = torch.Generator().manual_seed(length)
    for _ in range(2):
        q, k, v = _heads(gen, 2, length)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        got = attend(q, k, v, None)
        torch.testing.assert_close(got, want, **ATTN)
        # NOTE: the whole-sequence kernel's layout, which the plan's dry run recorded
        assert got.stride() == want.stride()


def _attention_graph(causal: bool, mask: bool, dtype: torch.dtype) -> tuple[object, list[str]]:
    gb = GraphBuilder()
    q, k, v = (gb.input(n, TensorType((1, 2, 256, 16), dtype)) for n in "qkv")
    m = gb.input("m", TensorType((256, 256), torch.bool)) if mask else None
    gb.output(gb.call("scaled_dot_product_attention", q, k, v, m, is_causal=causal))
    program = compile_graph(gb.build())
    return program, [n["detail"] for n in program.records()["evidence"]["nodes"]]


@pytest.mark.usefixtures("stax_cache")
def test_only_causal_float32_attention_without_mask_runs_in_row_blocks() -> None:
    _, details = _attention_graph(causal=True, mask=False, dtype=torch.float32)
    assert any("in blocks of" in d for d in details), details
    for causal, mask, dtype in [
        (False, False, torch.float32),
        (False, True, torch.float32),
        (True, False, torch.float64),
    ]:
        _, details = _attention_graph(causal, mask, dtype)
        assert not any("in blocks of" in d for d in details), (causal, mask, dtype, details)


class _CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(48, 3 * 48)
        self.proj = nn.Linear(48, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (h.view(b, t, 3, 16).transpose(1, 2) for h in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


@pytest.mark.usefixtures("stax_cache")
def test_symbolic_length_across_the_range_conforms() -> None:
    """One dynamic artifact called below, inside and above the row-block range."""
    torch.manual_seed(0)
    model = _CausalSelfAttention().eval()
    compiled = plait.compile(model, backend="stax", dynamic={"x": {1: "tokens"}})
    with torch.no_grad():
        for length in [64, 300, causal_attention.MAX_LEN + 30, 130]:

            def draw(seed: int, length: int = length) -> tuple[torch.Tensor]:
                gen = torch.Generator().manual_seed(seed)
                return (torch.randn(2, length, 48, generator=gen),)

            report = plait.conformance.check(model, compiled, draw, candidate_module=model)
            assert report.ok, (length, str(report))
    (spec,) = compiled._plait.specializations
    nodes = spec.compiled.manifest.executor["evidence"]["nodes"]
    assert any("in blocks of" in n["detail"] for n in nodes), nodes


class _Attend(nn.Module):
    """Attention of three inputs, the keys given transposed (``(batch, heads, dim, tokens)``,
    as a cache of transposed keys holds them) when ``keys_transposed``."""

    def __init__(self, keys_transposed: bool) -> None:
        super().__init__()
        self.keys_transposed = keys_transposed

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k = k.transpose(-1, -2) if self.keys_transposed else k
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize(
    ("keys_transposed", "shapes"),
    [
        # NOTE: keys whose last dim is not contiguous (eager's flash kernel reads it as if it were)
        (True, [(1, 2, 200, 16), (1, 2, 16, 200), (1, 2, 200, 16)]),
        # NOTE: one batch of keys and values for two of queries (eager broadcasts)
        (False, [(2, 2, 200, 16), (1, 2, 200, 16), (1, 2, 200, 16)]),
    ],
    ids=["strided-keys", "broadcast-batch"],
)
def test_attention_eager_does_not_run_as_flash_conforms(
    keys_transposed: bool, shapes: list[tuple[int, ...]]
) -> None:
    model = _Attend(keys_transposed)
    compiled = plait.compile(model, backend="stax")

    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(s, generator=gen) for s in shapes)

    with torch.no_grad():
        report = plait.conformance.check(model, compiled, draw, candidate_module=model)
    assert report.ok, str(report)


class _Scaled(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("scale", [-0.25, 0.0])
def test_a_scale_that_is_not_positive_gives_eagers_answer(scale: float) -> None:
    """Eager's causal flash kernel scales the scores after masking them (``-inf * scale``):
    NaN for a zero scale and past the diagonal's infinities turned positive for a negative
    one; the row blocks' additive mask would compute the finite answer eager does not."""
    model = _Scaled(scale)
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(2):
            q, k, v = _heads(gen, 2, 200)
            torch.testing.assert_close(compiled(q, k, v), model(q, k, v), **ATTN, equal_nan=True)


def _with(t: torch.Tensor, at: int, value: float) -> torch.Tensor:
    t = t.clone()
    t[:, :, at] = value
    return t


@pytest.mark.parametrize(
    ("operand", "value", "scale"),
    [
        ("k", float("nan"), None),
        ("k", float("inf"), None),
        ("k", -float("inf"), None),
        ("k", 3e37, None),  # NOTE: finite, but its scores overflow to infinity
        ("k", 3e37, 0.01),
        ("v", float("inf"), None),
        ("v", float("nan"), None),
    ],
)
def test_non_finite_values_and_scores_give_eagers_answer(
    operand: str, value: float, scale: float | None
) -> None:
    """Eager's causal kernel overwrites the scores past a row's diagonal with -inf (a NaN or
    infinite score there changes nothing) and multiplies the values past it by zero weights
    within each block of keys it computes (0 * inf: NaN): NaN and infinities land where
    eager's do."""
    length = 200
    gen = torch.Generator().manual_seed(7)
    attend = causal_attention.causal_in_row_blocks(scale)
    for at in [length - 10, 70]:  # NOTE: past the first row block's rows, and inside a block
        q, k, v = _heads(gen, 1, length)
        ops = {"q": q, "k": k, "v": v}
        ops[operand] = _with(ops[operand], at, value)
        q, k, v = ops["q"], ops["k"], ops["v"]
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        got = attend(q, k, v, None)
        torch.testing.assert_close(got, want, **ATTN, equal_nan=True)


def test_a_default_device_neither_moves_the_result_nor_the_cached_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Called first under another default device (``torch.set_default_device``), the row
    blocks still compute on the CPU tensors they are given, and the mask they cache stays
    a CPU tensor for later calls."""
    monkeypatch.setattr(causal_attention, "_MASKS", {})
    attend = causal_attention.causal_in_row_blocks(None)
    gen = torch.Generator().manual_seed(11)
    for default in ["meta", "cpu"]:
        q, k, v = _heads(gen, 2, 200)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with torch.device(default):
            got = attend(q, k, v, None)
        assert got.device == want.device, default
        torch.testing.assert_close(got, want, **ATTN)
