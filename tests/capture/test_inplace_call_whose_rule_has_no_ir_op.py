"""An in-place call whose capture rule has no IR op for it keeps its write, as in eager.

The rule runs after the call ran on the samples; when it found no IR op for the call (``clamp_``
with tensor bounds, any in-place op on a complex tensor), the call became an opaque node of the
in-place function whose write was never bound back to its target: the input, and the value the
program returned, kept their old values on every call, silently. Now the write on the samples is
undone and the call is captured as its out-of-place form, whose result rebinds the target."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

Program = Callable[..., torch.Tensor]


def clamp_tensor_bound(x: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    x.clamp_(min=lo)
    return x * 2


def clip_both_bounds(x: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    x.clip_(lo, lo + 1)
    return x


def clamp_min_tensor(x: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    x.clamp_min_(lo)
    return x.sum(0)


def complex_mul(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    z.mul_(w)
    return z


def complex_exp_then_add(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    z.exp_().add_(w, alpha=2)
    return z


def complex_zero_through_view(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    z[::2].zero_()
    return z + w


def _real(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g) * 0.5


def _complex(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(  # type: ignore[return-value]
        torch.complex(torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)) * 0.5
        for _ in range(2)
    )


CASES: list[tuple[Program, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]] = [
    (clamp_tensor_bound, _real),
    (clip_both_bounds, _real),
    (clamp_min_tensor, _real),
    (complex_mul, _complex),
    (complex_exp_then_add, _complex),
]


@pytest.mark.parametrize(("program", "draw"), CASES, ids=[p.__name__ for p, _ in CASES])
def test_the_write_lands_in_the_input_and_the_result(program: Program, draw: Callable) -> None:
    compiled = plait.compile(program, backend="stax", options={"cache": False})
    for seed in range(3):
        x, other = draw(seed)
        mine, theirs = x.clone(), x.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: opaque nodes, said
            got = compiled(mine, other)
        want = program(theirs, other)
        # NOTE: a complex64 value is two float32 components: float32's budget
        tol = contract_tol("pointwise", torch.float32)
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(mine, theirs, **tol)
    assert not any(s.fallback_reason for s in compiled.specializations)


def test_complex_write_through_a_view_is_eager_and_said() -> None:
    """The write-back of a complex view is not captured: the call runs eagerly, warned."""
    compiled = plait.compile(complex_zero_through_view, backend="stax", options={"cache": False})
    for seed in range(3):
        z, w = _complex(seed)
        mine, theirs = z.clone(), z.clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = compiled(mine, w)
        want = complex_zero_through_view(theirs, w)
        torch.testing.assert_close(got, want, **contract_tol("pointwise", torch.float32))
        torch.testing.assert_close(mine, theirs, **contract_tol("pointwise", torch.float32))
        if seed == 0:
            assert any(issubclass(c.category, CaptureFallbackWarning) for c in caught)
    assert all("zero_" in str(s.fallback_reason) for s in compiled.specializations)


def test_module_clamping_to_a_buffer_under_grad_matches_eager() -> None:
    class Floor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(5, 5)
            self.register_buffer("floor", torch.randn(5) * 0.3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            y.clamp_(min=self.floor)
            return y.tanh()

    model = Floor().eval()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    for seed in range(3):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(x)
        torch.testing.assert_close(got, model(x), **contract_tol("matmul", torch.float32))
