"""fold-bn never moves a NaN or an infinity: a conv/linear + BatchNorm pair whose parameters or
folded result are not all finite (or whose scale is 0) is left unfolded, through ``plait.compile``,
judged against eager with the special-value rule of tests/codegen/test_special_values.py."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.codegen.test_special_values import assert_matches_eager


def _inf_gamma(bn: nn.BatchNorm2d) -> None:
    bn.weight[1] = float("inf")


def _zero_var_no_eps(bn: nn.BatchNorm2d) -> None:
    bn.eps = 0.0
    bn.running_var[2] = 0.0


def _zero_gamma(bn: nn.BatchNorm2d) -> None:
    bn.weight[0] = 0.0


def _nan_mean(bn: nn.BatchNorm2d) -> None:
    bn.running_mean[3] = float("nan")


EDITS: dict[str, Callable[[nn.BatchNorm2d], None]] = {
    "inf-gamma": _inf_gamma,
    "zero-var-no-eps": _zero_var_no_eps,
    "zero-gamma": _zero_gamma,
    "nan-mean": _nan_mean,
}


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("edit", list(EDITS))
def test_conv_bn_with_special_parameters(edit: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].running_mean.normal_()
        EDITS[edit](model[1])
    cf = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for draw in range(3):
            x = torch.randn(2, 3, 6, 6, generator=gen)
            if draw:
                x[0, 0, 2, 2] = float("inf")
                x[1, 1, 0, 0] = float("nan")
            assert_matches_eager([cf(x)], [[model(x)]], "conv", f"{edit} draw {draw}")
    manifest = json.dumps(cf.specializations[-1].manifest.deterministic(), default=str)
    assert "fold-bn.conv" not in manifest


@pytest.mark.usefixtures("stax_cache")
def test_conv_bn_with_finite_parameters_still_folds() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)).eval()
    cf = plait.compile(model, backend="stax")
    with torch.no_grad():
        x = torch.randn(2, 3, 6, 6)
        assert_matches_eager([cf(x)], [[model(x)]], "conv", "finite")
    manifest = json.dumps(cf.specializations[-1].manifest.deterministic(), default=str)
    assert "fold-bn.conv" in manifest
