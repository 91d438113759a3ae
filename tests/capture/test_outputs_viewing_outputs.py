"""An output that views another output the program computes (``y`` and ``y.view(-1)``, or
``y[0]`` and ``y[1:]`` of a ``y`` not returned) comes back as a view of the same tensor, as in
eager: the graph returns the base once and the views are made of it after the call, so a write
to one output afterwards shows in the others (:mod:`plait.frontend.output_views`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise


def _y(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1  # NOTE: exact in float32, so compiled and eager agree bitwise


CASES: dict[str, Callable[[torch.Tensor], Any]] = {
    "view": lambda x: ((y := _y(x)), y.view(-1)),
    "view_first": lambda x: ((y := _y(x)).view(-1), y),
    "transpose": lambda x: ((y := _y(x)), y.t()),
    "slice_with_offset": lambda x: ((y := _y(x)), y[1:, 1:]),
    "view_of_view": lambda x: ((y := _y(x)), (v := y.t()[1:]), v.unsqueeze(0)),
    "two_views_of_one_base": lambda x: ((y := _y(x)), y[0], y[:, 2]),
    "views_of_an_unreturned_base": lambda x: ((y := _y(x))[0], y[1:], y.t()),
    "base_is_an_input_view": lambda x: ((v := x[1:]), v.view(-1), _y(x)),
    "computed_from_an_input_view": lambda x: ((y := _y(x[1:])), y.view(-1)),
    "written_after_viewed": lambda x: ((v := (y := _y(x))[0]), y.add_(1), v.view(1, -1)),
    "dtype_view": lambda x: (
        (y := torch.complex(_y(x), x * 4)),
        torch.view_as_real(y),
        torch.view_as_real(y)[1],
    ),
    "in_a_dict_and_list": lambda x: {"y": (y := _y(x)), "views": [y[1], y.t()], "z": x - 1},
    "detached": lambda x: ((y := _y(x)), y.detach()[1:]),
}


def _leaves(out: Any) -> list[torch.Tensor]:
    if isinstance(out, dict):
        return [t for v in out.values() for t in _leaves(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _leaves(v)]
    return [out]


def _storages(leaves: list[torch.Tensor]) -> list[int]:
    """Which leaves share memory (each leaf's first leaf of the same storage)."""
    ptrs = [t.untyped_storage().data_ptr() for t in leaves]
    return [ptrs.index(p) for p in ptrs]


def _compiled(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    if backend == "dynamo":
        return torch.compile(fn, backend="plait")
    return plait.compile(fn, backend=backend)


def _check(fn: Callable[..., Any], compiled: Callable[..., Any], shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape)
    want, got = _leaves(fn(x.clone())), _leaves(compiled(x.clone()))
    assert _storages(got) == _storages(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_bitwise(g, w, f"leaf {i}")
        assert g.stride() == w.stride(), f"leaf {i}"
    for k in range(len(want)):  # NOTE: a write to one output, read through each of the others
        x = torch.randn(*shape)
        want, got = _leaves(fn(x.clone())), _leaves(compiled(x.clone()))
        want[k].add_(1)
        got[k].add_(1)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_bitwise(g, w, f"leaf {i} after writing leaf {k}")


@pytest.mark.parametrize("backend", ["stax", "eager"])
@pytest.mark.parametrize("name", list(CASES))
def test_output_views_of_outputs_share_memory_as_eager(name: str, backend: str) -> None:
    fn = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        compiled = _compiled(fn, backend)
        for shape in ((3, 4), (3, 4)):
            _check(fn, compiled, shape)


@pytest.mark.parametrize("name", ["view", "views_of_an_unreturned_base", "in_a_dict_and_list"])
def test_output_views_of_outputs_share_memory_through_torch_compile(name: str) -> None:
    fn = CASES[name]
    _check(fn, _compiled(fn, "dynamo"), (3, 4))


def test_compiled_base_of_another_layout_is_laid_out_as_eager() -> None:
    """A base eager makes transposed (``x.t() * 2`` keeps its operand's strides) is handed out
    in that layout, so the views read it element for element."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x.t() * 2
        return y, y[1:], y.reshape(-1)

    _check(fn, plait.compile(fn), (3, 4))


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_output_views_of_outputs_are_differentiable_views(backend: str) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 3
        return y, y[0], y.t()[1:]

    compiled = plait.compile(fn, backend=backend)
    x = torch.randn(3, 4)
    grads = []
    for f in (fn, compiled):
        leaf = x.clone().requires_grad_()
        y, first, rest = f(leaf)
        assert first._base is y or first._base is y._base
        (y.sum() + 2 * first.sum() + 5 * rest.sum()).backward()
        grads.append(leaf.grad)
    assert_bitwise(grads[1], grads[0])


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_output_views_of_outputs_written_under_grad_write_through(backend: str) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 3
        return y, y[0]

    compiled = plait.compile(fn, backend=backend)
    x = torch.randn(3, 4)
    results = []
    for f in (fn, compiled):
        leaf = x.clone().requires_grad_()
        y, first = f(leaf)
        first.mul_(2)  # NOTE: through the view: autograd rebases y's history
        (y * torch.arange(4.0)).sum().backward()
        results.append((y.detach(), leaf.grad))
    assert_bitwise(results[1][0], results[0][0])
    assert_bitwise(results[1][1], results[0][1])
