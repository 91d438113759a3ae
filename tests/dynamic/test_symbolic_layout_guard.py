"""A symbolic program that read a layout (a ``view`` that other strides refuse, as GPT-2's
``input_ids.view(-1, t)``) guards a row-major input by its contiguity, not by its strides at the
captured sizes: one specialization serves every size, and other strides still recompile."""

from __future__ import annotations

import torch

import plait
from tests.util import assert_bitwise


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1) * 2.0


def test_a_view_of_a_symbolic_input_serves_every_size() -> None:
    compiled = plait.compile(_flat, dynamic=True, options={"cache": False})
    for b, t in ((2, 7), (3, 12), (2, 5), (4, 16)):
        x = torch.randn(b, t)
        assert_bitwise(compiled(x), _flat(x), f"{b}x{t}")
    assert len(compiled.specializations) == 1, compiled.recompile_reasons


def test_other_strides_still_miss_the_specialization() -> None:
    compiled = plait.compile(_flat, dynamic=True, options={"cache": False})
    x = torch.randn(3, 5)
    assert_bitwise(compiled(x), _flat(x))
    t = torch.randn(6, 4).t()[:, ::2]  # NOTE: no view of these strides merges the dims
    try:
        _flat(t)
    except RuntimeError as eager_error:
        try:
            compiled(t)
        except RuntimeError as err:
            assert "view" in str(err) and "view" in str(eager_error), err
        else:
            raise AssertionError("the compiled program viewed what eager refuses")
