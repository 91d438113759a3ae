"""The rewrite engine's use counts and node set, kept up to date as rules fire (never
recounted per try), equal a recount of the rewritten graph after every firing."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import plait
import plait.passes.rewrite as rewrite
from plait.passes import TRAINING_PIPELINE, run_pipeline


def _nonzero(counts: dict[int, int]) -> dict[int, int]:
    return {k: v for k, v in counts.items() if v}


def test_use_counts_follow_every_firing(monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 64, (1, 8))
    graph = plait.capture(model, (ids,)).graph
    assert graph is not None
    original = rewrite._try
    fired: list[str] = []

    def checking(graph: Any, node: Any, rule: Any, *rest: Any) -> bool:
        users, present = rest[-2], rest[-1]
        if not original(graph, node, rule, *rest):
            return False
        assert _nonzero(users) == _nonzero(rewrite._users(graph)), rule.name
        assert present == {id(n) for n in graph.nodes}, rule.name
        fired.append(rule.name)
        return True

    monkeypatch.setattr(rewrite, "_try", checking)
    run_pipeline(graph, TRAINING_PIPELINE)
    assert len(fired) >= 10, fired
