"""A module whose parameters are inference tensors (made or loaded under
``torch.inference_mode()``): they have no version counter, which a compiled program's guards and
prepared weights read to see writes to its state. Its capture is refused by name: the call runs
eagerly, warned, and under ``fullgraph=True`` raises ``GraphCaptureError`` saying what to do.
(Capture used to let PyTorch's ``RuntimeError: Inference tensors do not track version
counter`` out.) A model made outside inference mode compiles and runs inside it."""

from __future__ import annotations

import warnings

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.codegen.hf_vision_models import mobilenet_v2
from tests.util import contract_tol


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return mobilenet_v2().eval()


def _x(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_fullgraph_names_the_inference_tensor_and_what_to_do() -> None:
    with torch.inference_mode():
        model = _model()
    compiled = plait.compile(model, backend="stax", fullgraph=True)
    with pytest.raises(GraphCaptureError, match="inference tensor") as info, torch.inference_mode():
        compiled(_x(1))
    assert "outside torch.inference_mode()" in str(info.value)


def test_the_call_runs_eagerly_and_says_why() -> None:
    with torch.inference_mode():
        model = _model()
    compiled = plait.compile(model, backend="stax")
    tol = contract_tol("model", torch.float32)
    with torch.inference_mode():
        for call in range(2):
            x = _x(call)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                got = compiled(x).last_hidden_state
            torch.testing.assert_close(got, model(x).last_hidden_state, **tol)
            fallbacks = [str(w.message) for w in seen if w.category is CaptureFallbackWarning]
            assert call > 0 or any("inference tensor" in m for m in fallbacks), fallbacks


def test_a_model_made_outside_inference_mode_compiles_and_runs_inside_it() -> None:
    model = _model()
    compiled = plait.compile(model, backend="stax", fullgraph=True)
    tol = contract_tol("model", torch.float32)
    with torch.inference_mode():
        for call in range(3):
            x = _x(call)
            got = compiled(x).last_hidden_state
            torch.testing.assert_close(got, model(x).last_hidden_state, **tol)
