"""The planner runs one extern call per call signature at compile time (a dry run, or a probe
on fresh tensors) and reuses its outcome for the calls that repeat it: a model's repeated
blocks cost one run each, and the compiled program still computes eager's results."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
import plait.runtime.program as program
from plait.codegen import fusion

LAYERS = 5


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the extern calls the planner runs (oneDNN calls made while planning)."""
    planning = [False]
    ran: list[int] = []
    make = fusion.conv_or_linear_call
    plan = program.plan_graph

    def counted_call(node: Any, *args: Any, **kwargs: Any) -> Any:
        call = make(node, *args, **kwargs)
        fn = call.fn

        def run(*a: Any) -> Any:
            if planning[0]:
                ran.append(node.id)
            return fn(*a)

        return dataclasses.replace(call, fn=run)

    def counted_plan(*args: Any, **kwargs: Any) -> Any:
        planning[0] = True
        try:
            return plan(*args, **kwargs)
        finally:
            planning[0] = False

    monkeypatch.setattr(fusion, "conv_or_linear_call", counted_call)
    monkeypatch.setattr(program, "plan_graph", counted_plan)
    return ran


def _check(model: nn.Module, shape: tuple[int, ...]) -> Any:
    # NOTE: no timed choice of library: timing runs a call several times by design (once per
    # signature too: tests/codegen/test_timed_linear.py)
    options = {"cache": False, "stax": {"timed_matmul": False}}
    compiled = plait.compile(model, backend="stax", options=options)

    def draw(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

    with torch.no_grad():
        compiled(*draw(100))
        report = plait.conformance.check(model, compiled, draw, candidate_module=model)
    assert report.ok, str(report)
    return compiled


def test_repeated_linear_blocks_probe_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _counting(monkeypatch)
    torch.manual_seed(0)
    blocks = [m for _ in range(LAYERS) for m in (nn.Linear(32, 32), nn.GELU())]
    # NOTE: 16 rows: linears of the library (plait's native kernel takes at most 8)
    _check(nn.Sequential(*blocks).eval(), (16, 32))
    # NOTE: the first linear reads the graph input, the others a buffer of the same layout
    assert len(ran) == 1, ran


def test_repeated_conv_blocks_dry_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _counting(monkeypatch)
    torch.manual_seed(0)
    blocks = [m for _ in range(LAYERS) for m in (nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())]
    _check(nn.Sequential(*blocks).eval(), (1, 8, 12, 12))
    # NOTE: the first conv reads the NCHW graph input, the rest channels_last buffers: two
    # signatures, each run once
    assert 1 <= len(ran) <= 2 < LAYERS, ran
