"""Outputs held in a dataclass are judged field by field (the gate raised PyTorch's "Boolean value
of Tensor with more than one value is ambiguous" comparing two instances with ``==``), as
``plait.compile`` returns them."""

from __future__ import annotations

import dataclasses

import torch

import plait
from plait.conformance import check


@dataclasses.dataclass
class Pair:
    exp: torch.Tensor
    rest: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: torch.Tensor
    count: int = dataclasses.field(default=0, init=False)


def pair(x: torch.Tensor) -> Pair:
    return Pair(x.exp(), {"sin": x.sin()})


def pair_with_cos(x: torch.Tensor) -> Pair:
    return Pair(x.exp(), {"sin": x.cos()})


def test_a_wrong_field_fails_where_it_is() -> None:
    report = check(pair, pair_with_cos, (torch.randn(3, 4),))
    assert not report.ok
    assert {f.where for f in report.errors} == {"output.rest['sin']"}, report


def test_a_compiled_program_returning_a_dataclass_is_judged() -> None:
    report = check(pair, plait.compile(pair, options={"cache": False}), (torch.randn(3, 4),))
    assert report.ok and report.checks_run["tolerance"] > 0, report


def test_frozen_dataclasses_and_their_class_are_structure() -> None:
    def frozen(x: torch.Tensor) -> Frozen:
        return Frozen(x * 2)

    assert check(frozen, frozen, (torch.randn(5),)).ok
    report = check(pair, lambda x: {"exp": x.exp(), "rest": {"sin": x.sin()}}, (torch.randn(2),))
    assert any(f.check == "structure" for f in report.errors), report
