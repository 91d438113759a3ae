"""A compiled call's inputs that reach only outputs the loss leaves unused get no gradient
(None), as in eager: never zeros, which an optimizer with weight decay or momentum steps on."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import plait
from tests.conformance.models import randn, seeded
from tests.util import contract_tol


class TwoHeads(nn.Module):
    """A shared body and two heads; a third layer the forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.first = nn.Linear(8, 3)
        self.second = nn.Linear(8, 2)
        self.spare = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.tanh(self.body(x))
        return self.first(z), self.second(z)


def _compiled(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a backward that fell back to eager warns
        return plait.compile(copy.deepcopy(model), backend="stax")


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: p.grad for name, p in model.named_parameters()}


def test_parameters_of_an_unused_head_keep_no_gradient() -> None:
    model = seeded(11, TwoHeads)
    compiled = _compiled(model)
    for seed in (1, 2, 3):
        x = randn(5, 6, seed=seed)
        for m in (model, compiled):
            m.zero_grad(set_to_none=True)
            m(x)[0].square().sum().backward()
        want, got = _grads(model), _grads(compiled)
        for name, g in want.items():
            if g is None:
                assert got[name] is None, f"{name}: eager has no gradient, plait {got[name]}"
            else:
                assert got[name] is not None, name
                torch.testing.assert_close(got[name], g, **contract_tol("matmul", torch.float32))
    assert want["second.weight"] is None and want["first.weight"] is not None
    assert not compiled.specializations[-1].compiled.manifest.fallbacks


def test_adamw_with_weight_decay_leaves_an_unused_head_as_eager_does() -> None:
    model = seeded(12, TwoHeads)
    compiled = _compiled(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (model, compiled)]
    for step in range(4):
        x = randn(5, 6, seed=20 + step)
        for m, opt in zip((model, compiled), opts):
            opt.zero_grad(set_to_none=True)
            first, second = m(x)
            # NOTE: the second head joins the loss on odd steps only
            loss = first.square().mean() + (second.sum() if step % 2 else 0.0)
            loss.backward()
            opt.step()
    tol = plait.contract.load().tolerance("model", "float32")
    for (name, p), q in zip(model.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(
            q, p, rtol=tol.rtol, atol=tol.atol, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_autograd_grad_allow_unused_gives_none_for_an_input_of_an_unused_output() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.sin(x) * y, torch.cos(z)

    compiled = plait.compile(fn, backend="stax")
    for seed in (4, 5):
        inputs = [randn(3, 4, seed=seed + 10 * k) for k in range(3)]
        results = []
        for f in (fn, compiled):
            leaves = [t.clone().requires_grad_(True) for t in inputs]
            used, _unused = f(*leaves)
            results.append(torch.autograd.grad(used.sum(), leaves, allow_unused=True))
        want, got = results
        assert want[2] is None and got[2] is None, got[2]
        for a, b in zip(got[:2], want[:2]):
            torch.testing.assert_close(a, b, **contract_tol("pointwise", torch.float32))


def test_an_input_reaching_a_used_output_through_a_zero_derivative_gets_zeros() -> None:
    """sign's derivative is zero, but its result is in eager's graph: eager gives zeros."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sign(x), torch.exp(x)

    compiled = plait.compile(fn, backend="stax")
    for seed in (6, 7):
        x = randn(5, seed=seed)
        grads = []
        for f in (fn, compiled):
            leaf = x.clone().requires_grad_(True)
            f(leaf)[0].sum().backward()
            grads.append(leaf.grad)
        assert grads[1] is not None
        assert torch.equal(grads[1], grads[0])
