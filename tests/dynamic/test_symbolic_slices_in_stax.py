"""A ``cat``/``constant_pad`` of a piece of symbolic size ``s - 1`` (``x[1:]``, ``logits[:, :-1]``,
and the backward of any such slice, which pads the gradient back to ``s`` rows) compiles in Stax:
a symbolic size is at least 2 (capture specializes 0 and 1, and the guards check it), so
``s - 1`` is at least 1 and the selection's clamped load stays inside the piece. Before, Stax
took ``s - 1`` as possibly 0, refused the graph, and the program (a language model's shifted
loss, attention on a sliced sequence) ran in the reference interpreter. Judged by the gate,
results and gradients, at several sizes from one specialization; a piece that may really be
empty (``s - 2``) is still refused."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.conformance
from plait.codegen.views import guarded_lower_bound
from plait.errors import CaptureFallbackWarning
from plait.symbolic import symbol
from plait.symbolic.poly import from_dim


def _in_stax(compiled: Any, *, training: bool = True) -> None:
    """One specialization, forward (and backward) run by Stax, no fallback."""
    (spec,) = plait.explain(compiled).specializations
    manifest = spec.manifest
    assert manifest.executor["backend"] == "stax", manifest.options.get("backend_choice")
    assert manifest.fallbacks == []
    assert "dynamic_refused" not in manifest.options
    if training:
        assert manifest.executor["backward"]["backend"] == "stax"


def _judged(
    reference: Callable[..., Any],
    compiled: Any,
    inputs: Callable[[int], Any],
    sizes: tuple[int, ...],
    module: torch.nn.Module | None = None,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for n in sizes:
            report = plait.conformance.check(
                reference,
                compiled,
                lambda seed, n=n: inputs(n * 1000 + seed, n),
                grads=True,
                draws=2,
                reference_module=module,
                candidate_module=module,
            )
            assert report.ok, f"size {n}: {report}"


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _shifted_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x[1:].cumsum(0)


def _shifted_cat(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[1:] * 2, x[:-1].tanh()], 0)


def _shifted_pad(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x[:, :-1].sin(), (1, 2))


PROGRAMS = {"cumsum": _shifted_cumsum, "cat": _shifted_cat, "pad": _shifted_pad}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_piece_one_shorter_than_a_symbolic_size_compiles_in_stax(name: str) -> None:
    fn = PROGRAMS[name]
    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    _judged(fn, compiled, lambda seed, n: (_randn(n, n + 3, seed=seed),), (2, 3, 7))
    _in_stax(compiled)


class _LanguageModelLoss(torch.nn.Module):
    def __init__(self, vocab: int = 29, width: int = 16) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.mix(self.embed(ids))))
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab), ids[:, 1:].reshape(-1))


def test_a_shifted_language_model_loss_trains_in_stax() -> None:
    torch.manual_seed(0)
    model = _LanguageModelLoss().train()
    compiled = plait.compile(model, dynamic=True, options={"cache": False})

    def ids(seed: int, t: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, 29, (3, t), generator=torch.Generator().manual_seed(seed)),)

    _judged(model, compiled, ids, (2, 5, 12), module=model)
    _in_stax(compiled)


class _SlicedAttention(torch.nn.Module):
    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        return F.scaled_dot_product_attention(q[:, :, 1:], k, v)


def test_attention_on_a_sliced_query_trains_in_stax() -> None:
    torch.manual_seed(0)
    model = _SlicedAttention().train()
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    _judged(model, compiled, lambda seed, t: (_randn(2, t, 16, seed=seed),), (3, 6, 11), model)
    _in_stax(compiled)


def test_a_piece_that_may_be_empty_is_still_refused() -> None:
    """``x[2:]`` has ``s - 2`` rows: 0 at ``s = 2``, which the guards admit."""
    s = from_dim(symbol("s0"))
    assert guarded_lower_bound(s - 1) == 1 and guarded_lower_bound(s * s - 3) == 1
    assert guarded_lower_bound(s - 2) == 0 and guarded_lower_bound(from_dim(symbol("dd0"))) == 0

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[2:], x], 0)

    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    with pytest.warns(CaptureFallbackWarning, match="may be 0 at run time"):
        compiled(torch.randn(4, 3))
