"""A call whose structure differs from the exported one only in the order of a dict argument's
keys is refused (the program may depend on that order), and the refusal shows both orders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import plait
from plait.errors import CompiledInputError
from tests.export.models import seeded


def _combine(inp: dict[str, torch.Tensor]) -> torch.Tensor:
    return inp["a"] * 2 + inp["b"]


def test_a_dict_argument_in_another_key_order_is_refused_naming_the_orders(
    tmp_path: Path,
) -> None:
    gen = seeded(61)
    example = ({"a": torch.randn(3, generator=gen), "b": torch.randn(3, generator=gen)},)
    loaded = plait.load(plait.export(_combine, example, native=False).save(tmp_path / "d.plait"))
    a, b = torch.randn(3, generator=gen), torch.randn(3, generator=gen)
    assert torch.equal(loaded({"a": a, "b": b}), _combine({"a": a, "b": b}))
    with pytest.raises(
        CompiledInputError,
        match=r"expected \(inp: {.a.: tensor, .b.: tensor}\), "
        r"got \(inp: {.b.: tensor, .a.: tensor}\)",
    ):
        loaded({"b": b, "a": a})
