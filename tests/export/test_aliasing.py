"""A program whose outputs are its inputs or views of them exports, verifies and, loaded, hands
back those outputs aliasing the call's inputs as eager PyTorch does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import plait
from plait.errors import ExportError
from tests.export.models import seeded
from tests.util import contract_tol


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _transposed(x: torch.Tensor) -> torch.Tensor:
    return x.t()


def _slices_and_a_sum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x[1:], x[:, 1], x.sum(0)


@pytest.mark.parametrize(
    "fn", [_identity, _transposed, _slices_and_a_sum], ids=lambda f: f.__name__
)
def test_outputs_that_are_inputs_or_their_views_export_verify_and_alias(
    fn: Any, tmp_path: Path
) -> None:
    gen = seeded(21)
    path = plait.export(fn, (torch.randn(3, 4, generator=gen),), native=False).save(
        tmp_path / "alias.plait"
    )
    assert plait.verify(path).ok
    loaded = plait.load(path)
    x = torch.randn(3, 4, generator=gen)
    got, want = loaded(x), fn(x)
    got_leaves = got if isinstance(got, tuple) else (got,)
    want_leaves = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got_leaves, want_leaves):
        assert torch.equal(g, w)
        same_memory = g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert same_memory == (w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())


def _views_of_a_computed_base(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2 + 1
    return y.t(), y, y[1:, 1:]


def test_outputs_that_view_another_output_load_as_views_of_it(tmp_path: Path) -> None:
    """The loaded program hands back the views of a computed output as eager does: a write to
    one output shows in the others."""
    gen = seeded(22)
    fn = _views_of_a_computed_base
    path = plait.export(fn, (torch.randn(3, 4, generator=gen),), native=False).save(
        tmp_path / "views.plait"
    )
    assert plait.verify(path).ok
    loaded = plait.load(path)
    x = torch.randn(3, 4, generator=gen)
    got, want = loaded(x), fn(x)
    got[1].add_(1)
    want[1].add_(1)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
        assert g.untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b.sin()


def test_an_example_passing_one_tensor_twice_is_refused_with_the_two_names(
    tmp_path: Path,
) -> None:
    """Capture traces one tensor passed twice as one (``a is b`` as in eager); an artifact takes
    each input apart, so such an example is refused before anything is compiled."""
    x = torch.randn(3, 4, generator=seeded(22))
    with pytest.raises(ExportError, match=r"one tensor as a and as b: .*distinct tensors"):
        plait.export(_product, (x, x), native=False)
    path = plait.export(_product, (x, x.clone()), native=False).save(tmp_path / "two.plait")
    loaded = plait.load(path)
    y, z = torch.randn(3, 4, generator=seeded(23)), torch.randn(3, 4, generator=seeded(24))
    torch.testing.assert_close(
        loaded(y, z), _product(y, z), **contract_tol("pointwise", torch.float32)
    )


def test_an_example_passing_the_models_own_parameter_is_refused(tmp_path: Path) -> None:
    """``m(m.weight)`` traces the input as the parameter; an artifact holds its weights apart
    from its inputs, so such an example is refused, naming both."""
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ExportError, match=r"the model's weight and as input"):
        plait.export(model, (model.weight,), native=False)
    x = torch.randn(4, 4, generator=seeded(25))
    loaded = plait.load(plait.export(model, (x,), native=False).save(tmp_path / "lin.plait"))
    y = torch.randn(4, 4, generator=seeded(26))
    with torch.no_grad():
        torch.testing.assert_close(loaded(y), model(y), **contract_tol("matmul", torch.float32))
