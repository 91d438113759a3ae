"""A new compile keys the frozen weights by their values as they are now, even where a write
bypassed PyTorch's version counter (``weight.data.mul_``, a write through a NumPy view): such a
write changes the key, so the cache never serves an entry folded from the old values."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)).eval()


def _bn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()


def _scale_through_data(m: nn.Module) -> None:
    m[0].weight.data.mul_(2.0)


def _scale_through_numpy(m: nn.Module) -> None:
    m[0].weight.detach().numpy()[:] *= 3.0


def _stats_through_data(m: nn.Module) -> None:
    m[1].running_var.data.fill_(4.0)
    m[1].running_mean.data.fill_(1.0)


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], None], tuple[int, ...]]] = {
    "weight.data in place": (_mlp, _scale_through_data, (4, 8)),
    "weight through numpy": (_mlp, _scale_through_numpy, (4, 8)),
    "running stats.data": (_bn, _stats_through_data, (2, 3, 6, 6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_new_compile_sees_weights_written_without_a_version_bump(
    tmp_path: Path, case: str
) -> None:
    make, write, shape = CASES[case]
    model = make()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        plait.compile(model, options={"cache": str(tmp_path)})(torch.randn(shape, generator=gen))
    version = model[0].weight._version
    write(model)
    assert model[0].weight._version == version  # NOTE: PyTorch did not see the write
    compiled = plait.compile(model, options={"cache": str(tmp_path)})
    x = torch.randn(shape, generator=gen)
    with torch.no_grad():
        out, expected = compiled(x), model(x)
    status = compiled.specializations[-1].manifest.cache.get("status")
    torch.testing.assert_close(
        out,
        expected,
        **contract_tol("model", torch.float32),
        msg=lambda m: f"{case} (cache {status}): {m}",
    )
    assert status == "miss"
