"""A compiled backward whose shapes hold a size symbol that none of its inputs has as a dim: the
gradient of ``x.transpose(0, 1).reshape(-1, n).sum(0)`` takes one cotangent of ``n`` elements and
rebuilds ``x``'s shape ``[s0, s1, n]``; a flattened product ``x.reshape(-1, c) @ w`` leaves
``s0`` and ``s1`` only inside ``s0*s1``; the backward of a ``cat`` of ``x[1:]`` sees ``s0`` only
inside ``s0 - 1``. Before, Stax refused such a backward ("symbols [...] are no input's dim") and
the whole program ran in the reference interpreter. Now the forward saves a symbol carrier, an
empty ``zeros([s0, s1, 0])`` whose dims are that call's own sizes
(``plait.autograd.partition.carry_symbols``), and the backward binds the symbols from it. Judged
by the gate, results and gradients, at several sizes from one specialization, and with two
calls at two sizes differentiated by one backward (each backward reads its own call's sizes)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.conformance
from plait.autograd import build_joint, partition
from plait.autograd.partition import CARRIER_NAME
from plait.errors import CaptureFallbackWarning
from plait.ir import GraphBuilder, TensorType
from plait.symbolic import symbol


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _summed_rows(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).reshape(-1, x.shape[2]).sum(0)


def _flattened_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.reshape(-1, x.shape[-1]) @ w).tanh()


def _shifted_cat(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[1:] * 2, x[:-1].tanh()], 0)


CASES: dict[str, tuple[Callable[..., torch.Tensor], Callable[[int, int], tuple[Any, ...]]]] = {
    "summed-rows": (_summed_rows, lambda seed, n: (_randn(n, n + 1, 5, seed=seed),)),
    "flattened-product": (
        _flattened_product,
        lambda seed, n: (_randn(n, n + 1, 9, seed=seed), _randn(9, n + 2, seed=seed + 1)),
    ),
    "shifted-cat": (_shifted_cat, lambda seed, n: (_randn(n, 3, seed=seed),)),
}


def _in_stax(compiled: Any) -> None:
    (spec,) = plait.explain(compiled).specializations
    manifest = spec.manifest
    assert manifest.executor["backend"] == "stax", manifest.options.get("backend_choice")
    assert manifest.fallbacks == [] and "dynamic_refused" not in manifest.options
    assert manifest.executor["backward"]["backend"] == "stax"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_backward_binds_symbols_none_of_its_inputs_has(name: str) -> None:
    fn, inputs = CASES[name]
    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for n in (2, 3, 6):
            report = plait.conformance.check(
                fn, compiled, lambda seed, n=n: inputs(n * 1000 + seed, n), grads=True, draws=2
            )
            assert report.ok, f"size {n}: {report}"
    _in_stax(compiled)
    saved = plait.explain(compiled).specializations[0].manifest.autograd["saved"]
    carriers = [s for s in saved if s["name"].startswith(CARRIER_NAME)]
    assert len(carriers) == 1 and carriers[0]["bytes"] == 0, saved


def test_two_calls_at_two_sizes_take_one_backward() -> None:
    """Both calls' carriers are alive at once: each backward must bind its own call's sizes."""
    compiled = plait.compile(_summed_rows, dynamic=True, options={"cache": False})

    def twice(f: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        return lambda x, y: torch.cat([f(x) * 3, f(y)])

    def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _randn(2, 3, 5, seed=seed), _randn(4, 7, 5, seed=seed + 1)

    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        report = plait.conformance.check(
            twice(_summed_rows), twice(compiled), inputs, grads=True, draws=2
        )
    assert report.ok, report
    _in_stax(compiled)


def test_a_carrier_is_saved_only_for_symbols_the_backward_cannot_read() -> None:
    s0, s1 = symbol("s0"), symbol("s1")
    b = GraphBuilder()
    x = b.input("x", TensorType((s0, s1), torch.float32))
    b.output(b.call("sum", b.call("mul", x, x), dims=[0]))
    part = partition(build_joint(b.build(), wrt=["x"]))
    assert CARRIER_NAME not in [v.name for v in part.saved]  # NOTE: the saved x binds both

    b = GraphBuilder()
    x = b.input("x", TensorType((s0, s1), torch.float32))
    b.output(b.call("sum", x, dims=[0]))
    part = partition(build_joint(b.build(), wrt=["x"]))
    assert [v.name for v in part.saved] == [CARRIER_NAME]
    (carrier,) = part.saved
    assert carrier.type == TensorType((s0, 0), torch.float32)
    assert part.backward.inputs[0].name == CARRIER_NAME  # NOTE: saved values, then cotangents
    assert part.forward.outputs[-1] is carrier
