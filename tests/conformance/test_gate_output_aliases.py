"""Outputs that share memory: a candidate that hands out one tensor (or overlapping views of one
buffer) for outputs eager returns separately fails the gate; a candidate that copies what eager
returns as views of one another is a warning; disjoint views of one buffer are no alias."""

from __future__ import annotations

import torch

from plait.conformance import check
from plait.conformance.judge import overlapping_outputs
from plait.conformance.runner import Run


def two_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, x + 1


def one_sum_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x + 1  # NOTE: a common subexpression merged across outputs
    return y, y


def sum_and_its_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x + 1
    return y, y[1:]


def sum_and_copied_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x + 1
    return y, (x + 1)[1:]


def test_one_tensor_for_two_outputs_fails() -> None:
    x = torch.randn(4, 5)
    report = check(two_sums, one_sum_twice, (x,))
    assert not report.ok
    assert any(f.check == "alias" and "output[1]" in f.message for f in report.errors), report
    assert check(two_sums, two_sums, (x,)).ok


def test_overlapping_views_for_separate_outputs_fail() -> None:
    report = check(sum_and_copied_rows, sum_and_its_rows, (torch.randn(4, 5),))
    assert any(f.check == "alias" and f.where == "output[0]" for f in report.errors), report


def test_copies_of_eagers_views_warn() -> None:
    report = check(sum_and_its_rows, sum_and_copied_rows, (torch.randn(4, 5),))
    assert report.ok
    assert any(f.check == "alias" for f in report.warnings), report


def test_disjoint_views_of_one_buffer_are_no_alias() -> None:
    y = torch.randn(6, 5)
    run = Run(outputs=(y[:3], y[3:], y[:, ::2], y[:, 1::2], y[::2], y[1::2], y[2]))
    assert overlapping_outputs(run) == {
        ("output[0]", "output[2]"), ("output[0]", "output[3]"), ("output[0]", "output[4]"),
        ("output[0]", "output[5]"), ("output[0]", "output[6]"), ("output[1]", "output[2]"),
        ("output[1]", "output[3]"), ("output[1]", "output[4]"), ("output[1]", "output[5]"),
        ("output[2]", "output[4]"), ("output[2]", "output[5]"), ("output[2]", "output[6]"),
        ("output[3]", "output[4]"), ("output[3]", "output[5]"), ("output[3]", "output[6]"),
        ("output[4]", "output[6]"),
    }  # fmt: skip
