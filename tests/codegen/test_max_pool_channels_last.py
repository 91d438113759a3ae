"""A row-major CPU max pool runs through a channels_last copy of its input
(``plait.codegen.pool_layout``): values and indices bitwise eager's, for every window
argument, dtype, tie and special value; compiled programs (inference and training) likewise."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import plait
from plait.codegen.pool_layout import by_channels_last, channels_last_pool
from tests.util import assert_bitwise, contract_tol

aten = torch.ops.aten
WINDOWS = [
    ([3, 3], [2, 2], [1, 1], [1, 1], False),
    ([2, 2], [2, 2], [0, 0], [1, 1], False),
    ([3, 3], [2, 2], [1, 1], [1, 1], True),
    ([3, 2], [1, 2], [1, 0], [2, 1], True),
    ([5, 5], [3, 3], [2, 2], [1, 1], False),
]


def _draw(seed: int, shape: tuple[int, ...], dtype: torch.dtype, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":  # NOTE: few distinct values: windows with several maxima
        x = torch.randint(0, 3, shape, generator=g).to(dtype)
    else:
        x = torch.randn(shape, generator=g).to(dtype)
    if kind == "special":
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (64,), generator=g)
        vals = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]).to(dtype)
        flat[picks] = vals[torch.arange(64) % 4]
    return x


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
def test_pool_through_channels_last_is_eagers(window, dtype, kind) -> None:
    pool = channels_last_pool(aten.max_pool2d_with_indices)
    for seed in range(2):
        x = _draw(seed, (2, 16, 48, 50), dtype, kind)
        assert by_channels_last(x)
        got, want = pool(x, *window), aten.max_pool2d_with_indices(x, *window)
        for g, w in zip(got, want):
            assert g.is_contiguous()
            assert_bitwise(g, w, f"{window} {dtype} {kind}")
        plain = channels_last_pool(torch.max_pool2d)(x, *window)
        assert_bitwise(plain, torch.max_pool2d(x, *window), "max_pool2d")


def test_small_and_channels_last_inputs_keep_the_direct_call() -> None:
    assert not by_channels_last(torch.randn(1, 3, 224, 224))  # NOTE: three channels
    assert not by_channels_last(torch.randn(2, 16, 8, 8))  # NOTE: few elements
    # NOTE: bfloat16's channels_last kernel gives a NaN maximum other bits
    assert not by_channels_last(torch.randn(2, 16, 64, 64, dtype=torch.bfloat16))
    x = torch.randn(2, 16, 64, 64).contiguous(memory_format=torch.channels_last)
    assert not by_channels_last(x)


class _ConvPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2, 1)
        return y.mean((2, 3))


def test_compiled_inference_pool_is_eagers() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.max_pool2d(x, 3, 2, 1) * 2

    compiled = plait.compile(fn, options={"cache": False})
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randn(2, 16, 48, 48, generator=gen)
        assert_bitwise(compiled(x), fn(x), "compiled max_pool2d")


def test_compiled_training_pool_matches_eager() -> None:
    torch.manual_seed(0)
    model = _ConvPool().train()
    twin = _ConvPool().train()
    twin.load_state_dict(model.state_dict())
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(4)
    tol = contract_tol("model", torch.float32)
    for _ in range(2):
        x = torch.randn(4, 3, 64, 64, generator=gen)
        out, ref = compiled(x), twin(x)
        torch.testing.assert_close(out, ref, **tol)
        g = torch.randn(out.shape, generator=gen)
        out.backward(g)
        ref.backward(g)
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
            p.grad, q.grad = None, None
    manifest = compiled.specializations[-1].compiled.manifest
    assert manifest.autograd, "the backward was compiled"
