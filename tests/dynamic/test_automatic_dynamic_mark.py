"""The automatic dynamic record is found through a mark under a cheap key (the callable's class,
its inputs' ranks and dtypes): a callable without one is not described at all at its first
call, and instances of one class that share the mark keep their own records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import plait
import plait.dynamic_shapes
from tests.util import contract_tol


class Scaled(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) * 2.0


def _model(width: int) -> Scaled:
    torch.manual_seed(width)
    return Scaled(width).eval()


def _first_input_type(model: torch.nn.Module, cache: Path, rows: int) -> str:
    """The input type of a fresh compile's first specialization, checked against eager."""
    compiled = plait.compile(model, options={"cache": str(cache)})
    x = torch.randn(rows, model.proj.in_features)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("matmul", torch.float32))
    return str(compiled.specializations[0].graph.inputs[0].type)


def _made_dynamic(model: torch.nn.Module, cache: Path) -> None:
    compiled = plait.compile(model, options={"cache": str(cache)})
    with torch.no_grad():
        for rows in (4, 6):
            compiled(torch.randn(rows, model.proj.in_features))
    assert "s0" in str(compiled.specializations[-1].graph.inputs[0].type)


def test_a_callable_without_a_mark_is_not_described(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    described: list[Any] = []
    real = plait.dynamic_shapes.front_parts

    def counting(*args: Any, **kwargs: Any) -> Any:
        described.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(plait.dynamic_shapes, "front_parts", counting)
    assert _first_input_type(_model(8), tmp_path / "cache", 4) == "f32[4, 8]"
    assert described == []


def test_instances_sharing_a_mark_keep_their_own_records(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _made_dynamic(_model(8), cache)
    _made_dynamic(_model(16), cache)
    # NOTE: fresh compiles in this process read the records as a new process would
    assert _first_input_type(_model(8), cache, 5) == "f32[s0, 8]"
    assert _first_input_type(_model(16), cache, 7) == "f32[s0, 16]"
    # NOTE: an instance of the same class that was never made dynamic finds the mark, not a
    # record: it starts static
    assert _first_input_type(_model(32), cache, 5) == "f32[5, 32]"
