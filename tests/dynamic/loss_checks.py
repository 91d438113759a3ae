"""A symbolic training program with a loss inside, judged by the gate at several batch sizes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

import plait
import plait.conformance

Batches = Callable[[int], Callable[[int], tuple[torch.Tensor, torch.Tensor]]]


def judged_at_sizes(
    model: torch.nn.Module,
    batches: Batches,
    sizes: Sequence[int],
    precision: torch.dtype | None = None,
) -> tuple[Any, set[str]]:
    """Compile ``model`` with symbolic dims and judge it (loss and gradients) at each batch size
    ``n`` on ``batches(n)``'s draws: one native Stax specialization, no fallback, its loss as a
    ``log_softmax``. Returns the specialization's manifest and the ops its nodes ran."""
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    for n in sizes:
        report = plait.conformance.check(
            model, compiled, batches(n), grads=True, draws=2, candidate_module=model,
            precision=precision,
        )  # fmt: skip
        assert report.ok, f"batch {n}: {report}"
    (spec,) = plait.explain(compiled).specializations
    manifest = spec.manifest
    assert manifest.executor["backend"] == "stax" and manifest.fallbacks == [], manifest.fallbacks
    ops = {n["op"] for n in manifest.executor["evidence"]["nodes"]}
    assert "log_softmax" in ops, ops
    return manifest, ops
