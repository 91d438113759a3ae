"""ATen runtime checks (``_linalg_check_errors`` after ``linalg_cholesky_ex``/``linalg_inv_ex``,
``_assert_async``) inside a call with no capture rule are ``aten_check`` nodes: PyTorch's own
check, run in program order and never dropped as dead code, so a bad input (a singular or
non-positive-definite matrix) raises the exception class eager raises, through the compiled
program, and a regular one gives eager's values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from tests.capture.helpers import assert_same


def _spd(seed: int, n: int = 4) -> torch.Tensor:
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


def _singular(seed: int, n: int = 4) -> torch.Tensor:
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    a[-1] = 0.0  # NOTE: a zero row: exactly singular (a zero pivot)
    return a


def _indefinite(seed: int, n: int = 4) -> torch.Tensor:
    return -_spd(seed, n)


# name: (program, a regular input, a bad input)
CHECKED: dict[str, tuple[Callable[[torch.Tensor], Any], Callable[[int], Any], Callable[[int], Any]]]
CHECKED = {
    "linalg.cholesky": (torch.linalg.cholesky, _spd, _indefinite),
    "linalg.inv": (torch.linalg.inv, _spd, _singular),
    "linalg.tensorinv": (
        lambda x: torch.linalg.tensorinv(x.reshape(4, 2, 2), ind=1),
        _spd,
        _singular,
    ),
    "linalg.solve": (lambda x: torch.linalg.solve(x, x[:, :2] + 1), _spd, _singular),
}


def _checks(compiled: Any) -> list[Any]:
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None and spec.opaque_counts == {}
    assert spec.manifest.fallbacks == []
    return [n for n in spec.graph.nodes if n.op == "aten_check"]


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_a_bad_input_raises_eagers_error_and_a_good_one_gives_eagers_values(name: str) -> None:
    fn, good, bad = CHECKED[name]
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1, 2):  # NOTE: the capture draw, then fresh ones
        x = good(seed)
        assert_same(compiled(x), fn(x), f"{name} seed {seed}")
    for seed in (3, 4):
        x = bad(seed)
        with pytest.raises(Exception) as want:
            fn(x)
        with pytest.raises(type(want.value)):
            compiled(x)
    assert _checks(compiled), "the check should be an aten_check node"


def test_check_runs_in_program_order_after_an_earlier_draw() -> None:
    """Eager draws, then raises: the compiled program too, leaving the generator where eager
    leaves it."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        noise = torch.rand_like(x)
        return torch.linalg.cholesky(x) + noise

    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1):
        torch.manual_seed(seed)
        got = compiled(_spd(seed))
        torch.manual_seed(seed)
        assert_same(got, fn(_spd(seed)), f"seed {seed}")
    torch.manual_seed(9)
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(_indefinite(1))
    after_compiled = torch.rand(4)
    torch.manual_seed(9)
    with pytest.raises(torch.linalg.LinAlgError):
        fn(_indefinite(1))
    assert_same(after_compiled, torch.rand(4), "the generator after the failed call")


def test_an_assert_async_alone_is_kept() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch._assert_async(x.sum() > 0)
        return x * 2

    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1):
        x = torch.rand(5, generator=torch.Generator().manual_seed(seed)) + 0.5
        assert_same(compiled(x), fn(x), f"seed {seed}")
    with pytest.raises(RuntimeError, match="nonzero"):
        fn(-torch.ones(5))
    with pytest.raises(RuntimeError, match="nonzero"):
        compiled(-torch.ones(5))
    assert [n.attrs["name"] for n in _checks(compiled)] == ["_assert_async"]
