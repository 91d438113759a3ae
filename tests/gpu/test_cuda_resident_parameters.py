"""A training step's CUDA graphs read the module's parameters where they live
(``plait.runtime.cuda_graph``, ``resident``): no static copy of a parameter is made or filled,
the optimizer's in-place updates are what the next replay reads, and a parameter given new
storage runs the step kernel by kernel instead of reading the old storage. Judged against eager
and against the same program run kernel by kernel (``cuda_graphs=False``). Skipped without
CUDA."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TOL = contract_tol("matmul", torch.float32)
Optimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
OPTIMIZERS: dict[str, Optimizer] = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
}


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, 10),
    ).cuda().train()  # fmt: skip


def _batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(7)
    return [torch.randn(32, 64, device="cuda", generator=gen) for _ in range(n)]


def _train(
    m: nn.Module,
    opt: torch.optim.Optimizer,
    xs: list[torch.Tensor],
    hook: Callable[[int], None] | None = None,
) -> None:
    for step, x in enumerate(xs):
        if hook is not None:
            hook(step)
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()


def _same_parameters(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def _records(compiled: nn.Module) -> tuple[dict, dict]:
    (spec,) = compiled._plait.specializations
    program = spec.compiled.program
    return program.forward.cuda_graph, program.backward.cuda_graph


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_parameters_read_where_they_live(optimizer: str) -> None:
    eager, graphed, plain = _model(0), _model(0), _model(0)
    compiled = plait.compile(graphed, backend="stax")
    unrolled = {"stax": {"cuda_graphs": False}}
    kernel_by_kernel = plait.compile(plain, backend="stax", options=unrolled)
    xs = _batches(6)
    for m, run in ((eager, eager), (graphed, compiled), (plain, kernel_by_kernel)):
        _train(run, OPTIMIZERS[optimizer](list(m.parameters())), xs)
    _same_parameters(graphed, eager)
    _same_parameters(graphed, plain)
    forward, backward = _records(compiled)
    assert forward["used"] and backward["used"], (forward, backward)
    n_params = len(list(graphed.parameters()))
    assert forward["resident"] == {"inputs": n_params, "moved": 0}, forward
    assert backward["resident"]["moved"] == 0 and backward["resident"]["inputs"] > 0, backward


def test_a_parameter_given_new_storage_is_read_from_it() -> None:
    eager, graphed = _model(1), _model(1)
    compiled = plait.compile(graphed, backend="stax")

    def moved(m: nn.Module) -> Callable[[int], None]:
        def hook(step: int) -> None:
            if step == 2:  # NOTE: new storage for a weight, its values unchanged
                with torch.no_grad():
                    m[3].weight.data = m[3].weight.data.clone()

        return hook

    xs = _batches(5)
    _train(eager, torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9), xs, moved(eager))
    opt = torch.optim.SGD(graphed.parameters(), lr=0.05, momentum=0.9)
    _train(compiled, opt, xs, moved(graphed))
    _same_parameters(graphed, eager)
    forward, _ = _records(compiled)
    assert forward["resident"]["moved"] == 3, forward
