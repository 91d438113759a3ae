"""A Hugging Face language model trained with ``dynamic=True``, its loss inside the compiled
module: its causal mask's packed-sequence check takes a ``cumsum`` (an extern IR op,
``plait.ir.ops.scan``) and its loss is ``F.cross_entropy`` (``plait.frontend.lower_loss``);
both were calls a dynamic capture could not take, so the whole step ran in eager. Now forward
and backward run in Stax, judged by the gate (loss and gradients) at several lengths. Also
``cumsum`` alone at symbolic sizes, bitwise eager's (ATen runs it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import plait
import plait.conformance
from tests.util import assert_bitwise


def test_cumsum_runs_at_symbolic_sizes_as_eager() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x > 0).cumsum(-1) * 2 + x.cumsum(0, dtype=torch.float64).float().long()

    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    for n in (3, 5, 9):
        x = torch.randn(n, n + 2, generator=torch.Generator().manual_seed(n)) * 4
        assert_bitwise(compiled(x), fn(x), f"size {n}")
    (spec,) = plait.explain(compiled).specializations
    assert spec.manifest.fallbacks == []
    nodes = spec.manifest.executor["evidence"]["nodes"]
    assert [n["op"] for n in nodes if n["op"] == "cumsum"] == ["cumsum", "cumsum"]


class _LanguageModelLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import transformers

        cfg = transformers.GPT2Config(
            n_layer=1, n_embd=32, n_head=4, vocab_size=97, n_positions=64, use_cache=False,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        self.lm = transformers.GPT2LMHeadModel(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.lm(ids).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(0, 1))


def test_a_language_model_trains_with_dynamic_shapes_in_stax() -> None:
    torch.manual_seed(0)
    model = _LanguageModelLoss().train()
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    for t in (6, 11):

        def ids(seed: int, t: int = t) -> tuple[torch.Tensor]:
            return (torch.randint(0, 97, (2, t), generator=torch.Generator().manual_seed(seed)),)

        report = plait.conformance.check(
            model, compiled, ids, grads=True, draws=2, candidate_module=model
        )
        assert report.ok, f"length {t}: {report}"
    for spec in plait.explain(compiled).specializations:
        manifest = spec.manifest
        assert manifest.executor["backend"] == "stax" and manifest.fallbacks == []
        assert manifest.executor["backward"]["backend"] == "stax"
