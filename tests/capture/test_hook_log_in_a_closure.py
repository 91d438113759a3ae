"""A forward hook that logs its module's output into a list held by a closure (a common way to
record activations) gets eager's tensors, whose values are the call's.

The capture's run appended its own tensor to the list; the program was then refused (it changes
a value it reads) and the call ran eagerly, but only module attributes and globals were put back
before that run: the list kept the capture's tensor, which any later use refused, and the call's
own value was missing. Closure values are now put back as globals' contents are."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise


def _logged_linear() -> tuple[nn.Module, list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    model = nn.Linear(4, 3)
    log: list[torch.Tensor] = []
    by_name: dict[str, list[torch.Tensor]] = {"out": []}

    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        log.append(out.detach().clone())
        by_name["out"].append(out * 1.0)

    model.register_forward_hook(hook)
    return model, log, by_name


def test_hook_log_holds_each_calls_eager_tensor() -> None:
    model, log, by_name = _logged_linear()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    calls = [torch.randn(2, 4, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    for k, x in enumerate(calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.no_grad():
                got = compiled(x)
        if k == 0:
            assert any(issubclass(w.category, CaptureFallbackWarning) for w in caught)
        with torch.no_grad():
            want = nn.functional.linear(x, model.weight, model.bias)
        assert_bitwise(got, want, f"call {k}")
    assert len(log) == len(by_name["out"]) == len(calls)
    for k, x in enumerate(calls):
        with torch.no_grad():
            want = nn.functional.linear(x, model.weight, model.bias)
        assert type(log[k]) is torch.Tensor and type(by_name["out"][k]) is torch.Tensor
        assert_bitwise(log[k], want, f"log {k}")
        assert_bitwise(by_name["out"][k], want, f"dict log {k}")
