"""A module that memoizes a tensor on itself (``self.freq = f`` after ``getattr(self, "freq",
None)``) cannot be one graph: the program changes a value it reads. Its calls run eagerly (the
recorded fallback) and answer as eager: the value the failed capture memoized is put back
before the program runs again, where it was refused as a tensor kept from a capture (Hugging
Face's LongRoPE and dynamic RoPE memoize their frequencies so; a compiled Llama with either
raised on every call). A module the compiled program reaches from outside that memoizes so
is refused the same way (its name, absent when read, was guarded as the capture's tensor)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import transformers
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol


class Memoizing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = getattr(self, "freq", None)
        if f is None:
            f = torch.arange(4.0) * 2
        f = f.to(x.device)
        self.freq = f
        return x * f


def test_a_tensor_memoized_on_the_module_is_not_the_capture_s() -> None:
    m = Memoizing()
    _falls_back_matching(
        m, lambda x: x * (torch.arange(4.0) * 2), 7, lambda: type(m.freq) is torch.Tensor
    )


class ScaleOnFirstCall(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "scale", None) is None:
            self.scale = x.abs().mean()
        return x * self.scale


OUTSIDE = ScaleOnFirstCall()


def _through_a_global_module(x: torch.Tensor) -> torch.Tensor:
    return OUTSIDE(x) + 1


@pytest.mark.parametrize("before", ["absent", "None"])
def test_a_tensor_memoized_on_a_module_outside_the_compiled_one_is_eager_s(before: str) -> None:
    """The module is not the compiled one (a function reaches it as a global). A name it
    lacked when read was keyed after the run, so the capture's tensor was guarded as the
    value it reads, and each compiled call scaled by its own input's mean where eager keeps
    the first call's (0.04 off on the second call); a name that held None was refused, and
    the eager run then read the capture's tensor and raised on every call."""
    vars(OUTSIDE).pop("scale", None)
    twin = ScaleOnFirstCall()
    if before == "None":
        OUTSIDE.scale = twin.scale = None
    _falls_back_matching(_through_a_global_module, lambda x: twin(x) + 1, 5)


def test_llama_with_scaled_rope_memoizing_frequencies_matches_eager() -> None:
    scalings = [
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 16,
        },
    ]
    g = torch.Generator().manual_seed(11)
    for scaling in scalings:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            rope_scaling=scaling,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg).eval()
        reference = copy.deepcopy(model)
        compiled = plait.compile(model)
        for length in (8, 40, 8):  # NOTE: 40 > max_position_embeddings: dynamic RoPE grows
            ids = torch.randint(0, 64, (2, length), generator=g)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", CaptureFallbackWarning)
                got = compiled(ids, use_cache=False).logits
                want = reference(ids, use_cache=False).logits
            torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))


def _falls_back_matching(fn: Any, expected: Any, seed: int, holds: Any = lambda: True) -> None:
    """Three calls of ``fn`` compiled, on fresh inputs, each bitwise ``expected(x)`` (and
    ``holds()`` after it); the program fell back."""
    compiled = plait.compile(fn, options={"cache": False})
    g = torch.Generator().manual_seed(seed)
    for i in range(3):
        x = torch.randn(3, 4, generator=g)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(x)
        assert_bitwise(got, expected(x), f"call {i}")
        assert holds(), f"call {i}"
    assert compiled.specializations[0].fallback_reason is not None
