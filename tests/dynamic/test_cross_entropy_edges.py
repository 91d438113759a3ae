"""Edges of ``F.cross_entropy``'s rule in a dynamic capture (``plait.frontend.lower_loss``):
Byte targets compared with ``ignore_index`` as ATen compares them (as int64), every target or
all but one ignored, an ``ignore_index`` that is a class, spatial dims that are static, 16-bit
logits, class weights and label smoothing; each judged by the gate, loss and gradients, at
several batch sizes from one specialization that runs the rule (no fallback)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.conformance
from tests.dynamic.loss_checks import judged_at_sizes

_SIZES = (2, 5, 11)  # NOTE: batch sizes each program is judged at


class _Head(torch.nn.Module):
    def __init__(
        self,
        classes: int,
        spatial: tuple[int, ...] = (),
        dtype: torch.dtype | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__()
        n = classes
        for d in spatial:
            n *= d
        self.head = torch.nn.Linear(6, n)
        self.classes, self.spatial, self.dtype, self.kwargs = classes, spatial, dtype, kwargs

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = self.head(x)
        if self.spatial:
            y = y.view(y.shape[0], self.classes, *self.spatial)
        if self.dtype is not None:
            y = y.to(self.dtype)
        return F.cross_entropy(y, target, **self.kwargs)  # type: ignore[arg-type]


def _batches(
    classes: int,
    *,
    spatial: tuple[int, ...] = (),
    ignored: int = -100,
    share: float = 0.3,
    dtype: torch.dtype = torch.int64,
    pinned: int | None = None,
) -> Callable[[int], Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """A factory per batch size: fresh logits' inputs and targets, a ``share`` of them
    ``ignored`` (all of them for a share above 1), the first one ``pinned`` where given."""

    def at(n: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
        def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            g = torch.Generator().manual_seed(seed)
            target = torch.randint(0, classes, (n, *spatial), generator=g)
            target[torch.rand(target.shape, generator=g) < share] = ignored
            if pinned is not None:
                target.view(-1)[0] = pinned
            return torch.randn(n, 6, generator=g), target.to(dtype)

        return draw

    return at


def test_byte_targets_compare_with_ignore_index_as_int64() -> None:
    """``uint8 != -100`` is computed in uint8, where -100 is 156: class 156 was ignored."""
    torch.manual_seed(0)
    judged_at_sizes(_Head(200), _batches(200, share=0.0, dtype=torch.uint8, pinned=156), _SIZES)


def test_a_byte_target_equal_to_a_wrapped_ignore_index_raises_as_in_eager() -> None:
    torch.manual_seed(0)
    model = _Head(5)
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    x, target = _batches(5, share=0.0, dtype=torch.uint8)(4)(0)
    compiled(x, target)
    target[1] = 156  # NOTE: -100 as a uint8, and out of range for five classes
    with pytest.raises(IndexError):
        model(x, target)
    with pytest.raises(IndexError):
        compiled(x, target)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_every_target_ignored(reduction: str) -> None:
    torch.manual_seed(0)
    judged_at_sizes(_Head(5, reduction=reduction), _batches(5, share=2.0), _SIZES)


def test_all_but_one_target_ignored() -> None:
    torch.manual_seed(0)
    judged_at_sizes(_Head(5), _batches(5, share=2.0, pinned=3), _SIZES)


def test_an_ignore_index_that_is_a_class() -> None:
    torch.manual_seed(0)
    judged_at_sizes(_Head(5, ignore_index=2), _batches(5, ignored=2), _SIZES)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_static_spatial_dims(reduction: str) -> None:
    torch.manual_seed(0)
    model = _Head(3, spatial=(4, 7), reduction=reduction)
    judged_at_sizes(model, _batches(3, spatial=(4, 7)), _SIZES)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_logits(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    judged_at_sizes(_Head(5, dtype=dtype), _batches(5), _SIZES, precision=dtype)


_WEIGHTS = torch.tensor([0.5, 1.5, 0.25, 2.0, 1.0])


@pytest.mark.parametrize(
    ("kwargs", "spatial"),
    [
        ({"weight": _WEIGHTS}, ()),
        ({"weight": _WEIGHTS, "reduction": "none"}, ()),
        ({"label_smoothing": 0.2}, ()),
        ({"label_smoothing": 0.1, "reduction": "sum"}, ()),
        ({"weight": _WEIGHTS, "label_smoothing": 0.3}, ()),
        ({"weight": _WEIGHTS, "label_smoothing": 0.3, "ignore_index": 1}, (4, 7)),
        ({"weight": _WEIGHTS, "label_smoothing": 0.3, "reduction": "none"}, (4, 7)),
    ],
    ids=["weight", "weight-none", "smoothing", "smoothing-sum", "both", "both-spatial-ignore",
         "both-spatial-none"],
)  # fmt: skip
def test_class_weights_and_label_smoothing(
    kwargs: dict[str, object], spatial: tuple[int, ...]
) -> None:
    """Lowered as ATen computes them (the mean divides by the targets' weights; the smoothing
    term is masked and reduced as the loss): before, each was the recorded eager fallback."""
    torch.manual_seed(0)
    ignored = int(kwargs.get("ignore_index", -100))  # type: ignore[call-overload]
    model = _Head(5, spatial=spatial, **kwargs)
    judged_at_sizes(model, _batches(5, spatial=spatial, ignored=ignored), _SIZES)


def test_every_target_ignored_with_weights_and_smoothing() -> None:
    torch.manual_seed(0)
    judged_at_sizes(_Head(5, weight=_WEIGHTS, label_smoothing=0.1), _batches(5, share=2.0), _SIZES)


def test_class_weights_that_require_grad_raise_as_in_eager() -> None:
    weight = _WEIGHTS.clone().requires_grad_()
    model = _Head(5, weight=weight)
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    x, target = _batches(5)(4)(0)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        model(x, target)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        compiled(x, target)
