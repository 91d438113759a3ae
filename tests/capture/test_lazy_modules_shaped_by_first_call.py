"""A lazy module (``nn.LazyLinear``) compiled before its first call: that call runs eagerly,
warned (its pre-hook gives the uninitialized parameters their shapes from the input, which a
capture cannot: traced, the module's slots hold no uninitialized parameter), and the next call
captures and compiles the shaped module. Under ``fullgraph=True`` the first call raises
``GraphCaptureError``. (Capture used to let PyTorch's own ``AssertionError`` out of the hook,
and a fallback's guards read the uninitialized parameters' shapes, which raise.)"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_grads_match_and_clear, contract_tol


def _lazy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LazyLinear(6), nn.ReLU(), nn.LazyLinear(3))


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("train", [False, True])
def test_first_call_shapes_the_module_and_the_next_compiles(train: bool) -> None:
    model = _lazy().train(train)
    reference = copy.deepcopy(model)
    compiled = plait.compile(model)
    tol = contract_tol("model", torch.float32)
    for call in range(3):
        x = _x(call)
        # NOTE: the first call initializes the parameters from the generator: the same state
        torch.manual_seed(call)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = compiled(x)
        torch.manual_seed(call)
        want = reference(x)
        fallbacks = [w for w in seen if issubclass(w.category, CaptureFallbackWarning)]
        assert len(fallbacks) == (call == 0), [str(w.message) for w in seen]
        if call == 0:
            assert "lazy module" in str(fallbacks[0].message)
        torch.testing.assert_close(got, want, **tol)
        if train:
            got.square().sum().backward()
            want.square().sum().backward()
            assert_grads_match_and_clear(model, reference, tol)
    assert [s.program.has_graph for s in compiled.specializations] == [False, True]


def test_fullgraph_refuses_an_unshaped_lazy_module() -> None:
    model = _lazy()
    with pytest.raises(GraphCaptureError, match="lazy module"):
        plait.compile(model, fullgraph=True)(_x(0))
    reference = _lazy()
    reference(_x(0))  # NOTE: shaped by a call, as the message asks
    compiled = plait.compile(reference, fullgraph=True)
    with torch.no_grad():
        for seed in (1, 2):
            x = _x(seed)
            torch.testing.assert_close(
                compiled(x), reference(x), **contract_tol("model", torch.float32)
            )
