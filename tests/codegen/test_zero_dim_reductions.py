"""Every reduction of the IR on a 0-dim tensor, through ``plait.compile`` (Stax), against eager.

PyTorch accepts ``dim=0`` and ``dim=-1`` on a 0-dim tensor and returns the value reduced over
nothing (``amax``: the value; ``var``: NaN with correction 1). The type rules normalized those
dims to an axis 0 that a 0-dim shape does not have (``amax``/``amin`` raised IndexError at
capture). The ops come from the registry: each op with a ``dims`` or ``dim`` attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from plait.ir.ops import all_ops
from tests.util import assert_bitwise

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-zero-dim")]


def _reductions() -> list[str]:
    names = []
    for name, op in sorted(all_ops().items()):
        attrs = {a.name for a in op.attrs}
        if op.category.value == "reduction" and ({"dims", "dim"} & attrs):
            names.append(name)
    return names


# NOTE: the torch spelling of each reduction over ``dim`` (test data: a new reduction op must
# be added here, or the coverage test names it).
SPELLING: dict[str, Callable[[torch.Tensor, Any, bool], torch.Tensor]] = {
    "amax": lambda t, d, k: torch.amax(t, d, keepdim=k),
    "amin": lambda t, d, k: torch.amin(t, d, keepdim=k),
    "sum": lambda t, d, k: torch.sum(t, d, keepdim=k),
    "mean": lambda t, d, k: torch.mean(t, d, keepdim=k),
    "var": lambda t, d, k: torch.var(t, d, keepdim=k),
    "softmax": lambda t, d, k: torch.softmax(t, d if isinstance(d, int) else d[0]),
    "log_softmax": lambda t, d, k: torch.log_softmax(t, d if isinstance(d, int) else d[0]),
    "all": lambda t, d, k: torch.all(t, d, keepdim=k),
    "any": lambda t, d, k: torch.any(t, d, keepdim=k),
    "count_nonzero": lambda t, d, k: torch.count_nonzero(t, d),  # NOTE: it has no keepdim
    "nansum": lambda t, d, k: torch.nansum(t, d, keepdim=k),
    "prod": lambda t, d, k: torch.prod(t, d if isinstance(d, int) else d[0], keepdim=k),
    "logsumexp": lambda t, d, k: torch.logsumexp(t, d, keepdim=k),
}
DIMS = [0, -1, (0,), (-1,)]


def test_every_reduction_has_a_spelling() -> None:
    assert sorted(SPELLING) == _reductions()


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: {got} vs {want}"
    keep = ~want.isnan()
    assert_bitwise(got[keep], want[keep], what)


# NOTE: eager warns that var over one value has no degrees of freedom (the result is NaN).
@pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom:UserWarning")
@pytest.mark.parametrize("op", sorted(SPELLING))
@pytest.mark.parametrize("keepdim", [False, True], ids=["drop", "keep"])
def test_zero_dim_reduction_matches_eager(op: str, keepdim: bool) -> None:
    spell = SPELLING[op]
    gen = torch.Generator().manual_seed(7)
    for dim in DIMS:
        compiled = plait.compile(lambda t, d=dim: spell(t, d, keepdim), backend="stax")
        for draw in range(2):
            x = torch.randn((), generator=gen) * 3
            with torch.no_grad():
                got, want = compiled(x), spell(x, dim, keepdim)
            _same(got, want, f"{op} dim={dim} keepdim={keepdim} draw {draw}")


# NOTE: with gradients, Stax runs the captured graph by the reference interpreter (it says so).
@pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom:UserWarning")
@pytest.mark.filterwarnings("ignore::plait.errors.CaptureFallbackWarning")
@pytest.mark.parametrize("op", ["amax", "amin", "sum", "var"])
def test_zero_dim_reduction_gradient_matches_eager(op: str) -> None:
    spell = SPELLING[op]
    compiled = plait.compile(lambda t: spell(t, 0, False), backend="stax")
    x = (torch.randn((), generator=torch.Generator().manual_seed(3)) * 3).requires_grad_()
    got = compiled(x)
    (grad,) = torch.autograd.grad(got, x)
    x2 = x.detach().clone().requires_grad_()
    want = spell(x2, 0, False)
    (want_grad,) = torch.autograd.grad(want, x2)
    _same(got.detach(), want.detach(), f"{op} value")
    _same(grad, want_grad, f"{op} grad")
