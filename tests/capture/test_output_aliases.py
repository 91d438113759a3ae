"""An output that is a view of an input, a parameter or a buffer comes back as a view of that
tensor (the same memory, size, strides and offset as eager's), so a write to either afterwards
shows in the other, as in eager. Its layout is guarded; a layout capture cannot keep is the
recorded eager fallback."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise

VIEWS: dict[str, Callable[[torch.Tensor], Any]] = {
    "t": lambda x: x.t(),
    "index": lambda x: x[0],
    "view": lambda x: x.view(-1),
    "reshape": lambda x: x.reshape(2, -1),
    "strided_slice": lambda x: x[1:, ::2],
    "narrow": lambda x: x.narrow(1, 1, 2),
    "unsqueeze_transpose": lambda x: x.unsqueeze(0).transpose(1, 2),
    "chain": lambda x: x.t()[1].unsqueeze(1),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(-1, 1, 0),
    "unfold": lambda x: x.unfold(1, 2, 1),
    "movedim": lambda x: x.movedim(0, 1),
    "broadcast_to": lambda x: torch.broadcast_to(x[1:2], (2, 3, x.shape[1])),
    "mH": lambda x: x.mH,
    "atleast_3d": lambda x: torch.atleast_3d(x),
    "expand": lambda x: x[:1].expand(3, -1),
    "split": lambda x: x.split(1, dim=0),
    "unbind": lambda x: x.unbind(1),
    "with_computed": lambda x: (x * 2, x[2], x.amax(1)),
    "contiguous_itself": lambda x: x.contiguous(),
    "detached": lambda x: x.detach()[1],
    "written_then_viewed": lambda x: x.add_(1)[0],
}


def _leaves(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _same_view(
    got: torch.Tensor, want: torch.Tensor, base: torch.Tensor, ref: torch.Tensor
) -> None:
    """``got`` views ``base`` exactly as ``want`` views ``ref``."""
    assert_bitwise(got, want)
    shares = want.untyped_storage().data_ptr() == ref.untyped_storage().data_ptr()
    assert (got.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()) == shares
    if shares:
        assert got.stride() == want.stride()
        assert got.storage_offset() - base.storage_offset() == (
            want.storage_offset() - ref.storage_offset()
        )
    assert got.requires_grad == want.requires_grad


def _fresh(seed: int, transposed: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if transposed:
        return torch.randn(4, 3, generator=g).t()
    return torch.randn(3, 4, generator=g)


BACKENDS = ["eager", "stax"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_view_of_an_input_is_a_view(name: str, transposed: bool, backend: str) -> None:
    program = VIEWS[name]
    if name in ("view",) and transposed:
        pytest.skip("eager refuses .view(-1) of a transposed tensor")
    compiled = plait.compile(program, backend=backend)
    for seed in (1, 2, 3):
        x = _fresh(seed, transposed)
        ref = x.clone() if not transposed else x.t().clone().t()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: diagonal is opaque
            got = compiled(x)
        want = program(ref)
        for g, w in zip(_leaves(got), _leaves(want)):
            _same_view(g, w, x, ref)
        # NOTE: the point of a view: a later write to the input shows in the output
        with torch.no_grad():
            x.mul_(-3)
            ref.mul_(-3)
        for g, w in zip(_leaves(got), _leaves(want)):
            assert_bitwise(g, w, f"{name} after writing the input")
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].program.has_graph


def test_writing_the_output_writes_the_input() -> None:
    compiled = plait.compile(lambda x: x[1:], backend="eager", fullgraph=True)
    for seed in (1, 2):
        x = _fresh(seed)
        ref = x.clone()
        got, want = compiled(x), ref[1:]
        got.fill_(7.0)
        want.fill_(7.0)
        assert_bitwise(x, ref)


class _Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.register_buffer("table", torch.randn(5, 3))

    def forward(self, x: torch.Tensor) -> Any:
        return self.lin(x), self.lin.weight.t(), self.table[1:3], self.lin.bias


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_of_a_parameter_or_buffer_is_a_view(backend: str) -> None:
    torch.manual_seed(0)
    model = _Holder()
    compiled = plait.compile(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: Stax's no-backward note
        for seed in (1, 2):
            x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
            got, want = compiled(x), model(x)
            _same_view(got[1], want[1], model.lin.weight, model.lin.weight)
            _same_view(got[2], want[2], model.table, model.table)
            assert got[3] is model.lin.bias
            with torch.no_grad():
                model.lin.weight.add_(1.0)
                model.table.mul_(2.0)
            assert_bitwise(got[1], model.lin.weight.t())
            assert_bitwise(got[2], model.table[1:3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_flow_through_a_returned_view(backend: str) -> None:
    def program(x: torch.Tensor) -> Any:
        return x.t()[1:], x.exp().sum()  # NOTE: two gradient terms: their sum is exact

    compiled = plait.compile(program, backend=backend, fullgraph=True)
    for seed in (1, 2):
        x = _fresh(seed).requires_grad_(True)
        ref = x.detach().clone().requires_grad_(True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CaptureFallbackWarning)  # NOTE: nothing falls back
            got = compiled(x)
        want = program(ref)
        (got[0] * 3).sum().add(got[1]).backward()
        (want[0] * 3).sum().add(want[1]).backward()
        assert x.grad is not None
        if backend == "eager":
            assert_bitwise(x.grad, ref.grad, "grad")
        else:
            # NOTE: Stax computes exp natively, within the contract's pointwise budget
            tol = plait.contract.load().tolerance("pointwise", "float32")
            torch.testing.assert_close(x.grad, ref.grad, rtol=tol.rtol, atol=tol.atol)


def test_the_layout_a_view_depends_on_is_guarded() -> None:
    compiled = plait.compile(lambda x: x[0], backend="eager", fullgraph=True)
    x = _fresh(1)
    assert_bitwise(compiled(x), x[0])
    xt = _fresh(2, transposed=True)
    got = compiled(xt)
    assert got.stride() == xt[0].stride()
    assert got.untyped_storage().data_ptr() == xt.untyped_storage().data_ptr()
    assert len(compiled.specializations) == 2
    assert "strides" in compiled.recompile_reasons[0]


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_view_of_an_input_with_gaps_is_returned_as_eager_view(backend: str) -> None:
    """The capture traces a copy with the input's strides (gaps included), so the view it
    returns has eager's strides and offset into the caller's memory."""

    def program(x: torch.Tensor) -> torch.Tensor:
        return x[1]

    compiled = plait.compile(program, backend=backend, fullgraph=True)
    for seed in range(3):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(seed))[:, ::2]
        got, want = compiled(x), program(x)
        _same_view(got, want, x, x)
        assert_bitwise(got, want, f"draw {seed}")


def test_dynamic_view_specializes_its_sizes() -> None:
    compiled = plait.compile(lambda x: x[:, 1], backend="eager", dynamic=True, fullgraph=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        got = compiled(x)
        _same_view(got, x[:, 1], x, x)
    assert all("view of x" in s.program.specialized[0] for s in compiled.specializations)
