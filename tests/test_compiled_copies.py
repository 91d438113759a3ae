"""Copies and pickles of compiled callables: the module or function is copied and compiled
again with the same arguments (the engine, with its locks and native guard evaluators, is never
copied). Each copy computes with its own weights, as an eager copy does."""

from __future__ import annotations

import copy
import io
import pickle

import torch
from torch import nn

import plait
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


@plait.compile
def doubled_plus_one(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()


def _agree(compiled: nn.Module, eager: nn.Module) -> None:
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 8)
            torch.testing.assert_close(compiled(x), eager(x), **TOL)


def test_deepcopy_computes_with_the_copied_weights() -> None:
    model = _model()
    compiled = plait.compile(model, options={"recompile_limit": 3})
    _agree(compiled, model)
    copied = copy.deepcopy(compiled)
    eager_copy = copy.deepcopy(model)
    with torch.no_grad():
        for p, q in zip(copied.parameters(), eager_copy.parameters()):
            noise = torch.randn_like(p)
            p.add_(noise)
            q.add_(noise)
    assert copied._orig_mod is not model
    assert copied._compile_kwargs["options"] == {"recompile_limit": 3}
    _agree(copied, eager_copy)
    _agree(compiled, model)  # NOTE: the original keeps its own weights


def test_pickle_round_trip_of_a_compiled_module() -> None:
    model = _model()
    compiled = plait.compile(model)
    _agree(compiled, model)
    buf = io.BytesIO()
    torch.save(compiled, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded).__name__ == "CompiledModule"
    _agree(loaded, model)


def test_hooks_on_the_wrapper_come_along() -> None:
    model = _model()
    compiled = plait.compile(model)
    shift = torch.randn(4)
    compiled.register_forward_hook(lambda m, args, out: out + shift)
    copied = copy.deepcopy(compiled)
    with torch.no_grad():
        x = torch.randn(3, 8)
        torch.testing.assert_close(copied(x), model(x) + shift, **TOL)


def test_shallow_copy_shares_the_module() -> None:
    model = _model()
    compiled = plait.compile(model)
    shallow = copy.copy(compiled)
    assert shallow._orig_mod is model
    _agree(shallow, model)


def test_decorated_function_pickles_by_reference() -> None:
    assert pickle.loads(pickle.dumps(doubled_plus_one)) is doubled_plus_one
    assert copy.deepcopy(doubled_plus_one) is doubled_plus_one


def test_compiled_function_copies_compile_again() -> None:
    compiled = plait.compile(torch.special.expit)
    x = torch.randn(5)
    compiled(x)
    copied = copy.deepcopy(compiled)
    assert copied is not compiled
    y = torch.randn(5)
    torch.testing.assert_close(
        copied(y), torch.special.expit(y), **contract_tol("pointwise", torch.float32)
    )
