"""Training through nn.EmbeddingBag gives eager's outputs and gradients. Capture records
``F.embedding_bag`` as ``aten._embedding_bag_forward_only`` (its weight does not require grad
while it traces), which has no derivative: PyTorch's autograd refuses its integer results
(offset2bag, bag_size, max_indices). Its gradient is that of ``aten._embedding_bag``, the overload
eager calls when a gradient flows (same arguments, same bags), for the weight and for the
per-sample weights alike; a sparse gradient is refused loudly and left to eager."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, PlaitCompileError
from tests.conformance.models import randn, seeded
from tests.util import assert_bitwise, contract_tol

ROWS, DIM, BAGS, PER_BAG = 10, 4, 3, 5
TOL = contract_tol("reduction", torch.float32)


def _assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=TOL["rtol"], atol=TOL["atol"], msg=what)


def _indices(gen: torch.Generator, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Indices in ``layout``: a 2-D batch of equal bags, or 1-D with the offsets where each bag
    starts (bags of any size, empty ones among them); ``offsets_to_end``: those offsets and the
    end of the last bag, the input's length (``include_last_offset=True`` requires it: PyTorch's
    backward reads memory it never wrote for indices past the last offset, and eager's own
    gradient then differs between two runs)."""
    if layout == "2d":
        return torch.randint(0, ROWS, (BAGS, PER_BAG), generator=gen), None
    flat = torch.randint(0, ROWS, (BAGS * PER_BAG,), generator=gen)
    starts = torch.randint(0, flat.numel() + 1, (BAGS - 1,), generator=gen).sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), starts])
    if layout == "offsets_to_end":
        offsets = torch.cat([offsets, torch.tensor([flat.numel()])])
    return flat, offsets


def _step(
    model: nn.Module, idx: torch.Tensor, offsets: torch.Tensor | None, psw: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The bags, then the weight's and the per-sample weights' gradients of a backward seeded
    with a fixed random cotangent."""
    model.zero_grad(set_to_none=True)
    leaf = None if psw is None else psw.clone().requires_grad_(True)
    out = model(idx, offsets, per_sample_weights=leaf)
    out.backward(randn(*out.shape, seed=int(idx.sum())))
    grad = model.weight.grad
    assert grad is None or isinstance(grad, torch.Tensor)
    return out.detach(), grad, None if leaf is None else leaf.grad


def _assert_eager_gradients(
    model: nn.Module, layout: str, seed: int, *, per_sample: bool = False
) -> None:
    gen = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        compiled = plait.compile(copy.deepcopy(model), backend="stax", options={"cache": False})
        for draw in range(3):
            idx, offsets = _indices(gen, layout)
            psw = randn(*idx.shape, seed=seed * 10 + draw) if per_sample else None
            got, want = _step(compiled, idx, offsets, psw), _step(model, idx, offsets, psw)
            for what, g, w in zip(("bags", "weight grad", "per-sample grad"), got, want):
                assert (g is None) == (w is None), f"draw {draw}: {what}"
                if g is not None and w is not None:
                    _assert_close(g, w, f"draw {draw}: {what}")
    manifest = compiled.specializations[-1].compiled.manifest
    assert manifest.autograd and not manifest.fallbacks, manifest.fallbacks


@pytest.mark.parametrize("layout", ["2d", "offsets"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_gradient_matches_eager(mode: str, layout: str) -> None:
    model = seeded(1, lambda: nn.EmbeddingBag(ROWS, DIM, mode=mode))
    _assert_eager_gradients(model, layout, seed=2)


@pytest.mark.parametrize("layout", ["2d", "offsets"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_with_padding_idx_matches_eager(mode: str, layout: str) -> None:
    model = seeded(3, lambda: nn.EmbeddingBag(ROWS, DIM, mode=mode, padding_idx=2))
    _assert_eager_gradients(model, layout, seed=4)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_with_last_offset_and_frequency_scaling_matches_eager(mode: str) -> None:
    model = seeded(
        5,
        lambda: nn.EmbeddingBag(
            ROWS, DIM, mode=mode, include_last_offset=True, scale_grad_by_freq=True
        ),
    )
    _assert_eager_gradients(model, "offsets_to_end", seed=6)


@pytest.mark.parametrize("padding_idx", [None, 1])
@pytest.mark.parametrize("layout", ["2d", "offsets"])
def test_per_sample_weights_take_eager_gradient(layout: str, padding_idx: int | None) -> None:
    model = seeded(7, lambda: nn.EmbeddingBag(ROWS, DIM, mode="sum", padding_idx=padding_idx))
    _assert_eager_gradients(model, layout, seed=8, per_sample=True)


def test_per_sample_weights_gradient_with_a_frozen_weight() -> None:
    model = seeded(9, lambda: nn.EmbeddingBag(ROWS, DIM, mode="sum"))
    model.weight.requires_grad_(False)
    _assert_eager_gradients(model, "offsets", seed=10, per_sample=True)


class BagClassifier(nn.Module):
    """Mean of each bag's embeddings, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = nn.EmbeddingBag(ROWS, DIM, mode="mean", padding_idx=0)
        self.head = nn.Linear(DIM, 3)

    def forward(self, idx: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bags(idx, offsets))


def test_sgd_steps_match_eager() -> None:
    model = seeded(11, BagClassifier)
    compiled_model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        compiled = plait.compile(compiled_model, backend="stax", options={"cache": False})
        runs = [(model, model), (compiled_model, compiled)]
        optimizers = [
            torch.optim.SGD(owner.parameters(), lr=0.5, momentum=0.9) for owner, _ in runs
        ]
        for step in range(4):
            idx, offsets = _indices(gen, "offsets")
            target = torch.randint(0, 3, (BAGS,), generator=gen)
            for (_, call), opt in zip(runs, optimizers):
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(call(idx, offsets), target).backward()
                opt.step()
            for (name, want), got in zip(model.named_parameters(), compiled_model.parameters()):
                _assert_close(got, want, f"step {step}: {name}")
    manifest = compiled.specializations[-1].compiled.manifest
    assert manifest.autograd and not manifest.fallbacks, manifest.fallbacks


def test_sparse_gradient_is_refused_loudly() -> None:
    model = seeded(13, lambda: nn.EmbeddingBag(ROWS, DIM, mode="mean", sparse=True))
    idx, _ = _indices(torch.Generator().manual_seed(14), "2d")
    strict = plait.compile(
        copy.deepcopy(model), backend="stax", fullgraph=True, options={"cache": False}
    )
    with pytest.raises(PlaitCompileError, match="sparse gradient"):
        strict(idx).sum().backward()
    compiled = plait.compile(copy.deepcopy(model), backend="stax", options={"cache": False})
    with pytest.warns(CaptureFallbackWarning, match="sparse gradient"):
        compiled(idx).sum().backward()
    manifest = compiled.specializations[-1].compiled.manifest
    assert any("sparse gradient" in f["reason"] for f in manifest.fallbacks), manifest.fallbacks
    got = compiled.weight.grad
    model(idx).sum().backward()
    want = model.weight.grad
    assert isinstance(got, torch.Tensor) and got.is_sparse and isinstance(want, torch.Tensor)
    assert_bitwise(got.to_dense(), want.to_dense())


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_gradient_matches_eager(padding_idx: int | None) -> None:
    model = seeded(15, lambda: nn.Embedding(ROWS, DIM, padding_idx=padding_idx, sparse=False))
    gen = torch.Generator().manual_seed(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        compiled = plait.compile(copy.deepcopy(model), backend="stax", options={"cache": False})
        for draw in range(3):
            idx = torch.randint(0, ROWS, (BAGS, PER_BAG), generator=gen)
            cotangent = randn(BAGS, PER_BAG, DIM, seed=draw)
            found = []
            for m in (compiled, model):
                m.zero_grad(set_to_none=True)
                out = m(idx)
                out.backward(cotangent)
                found.append((out.detach(), m.weight.grad))
            for what, g, w in zip(("embeddings", "weight grad"), *found):
                _assert_close(g, w, f"draw {draw}: {what}")
    manifest = compiled.specializations[-1].compiled.manifest
    assert manifest.autograd and not manifest.fallbacks, manifest.fallbacks
