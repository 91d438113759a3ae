"""Guards: each change the program depends on causes exactly one recompile whose reason names the
guard (with expected and actual value); an unchanged call never recompiles."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import plait
from plait.errors import RecompileLimitError
from tests.util import assert_bitwise


def seed(x: torch.Tensor) -> torch.Tensor:
    return x.relu() if x.shape[0] > 2 else x.sigmoid()


def _ops(compiled: Any, i: int) -> list[str]:
    return [n.op for n in compiled.specializations[i].graph.nodes]


def test_seed_example_static() -> None:
    f = plait.compile(seed, backend="eager")
    x = torch.randn(4, 8)
    assert torch.equal(f(x), x.relu())
    assert _ops(f, 0) == ["relu"]
    assert "x.shape[0] > 2" in str(f.specializations[0].guards)
    f(torch.randn(4, 8))
    f(torch.randn(3, 8))  # NOTE: static dims: another size is another specialization
    assert len(f.specializations) == 2
    assert f.recompile_reasons[0].startswith("x: f32[4, 8]: expected f32[4, 8] on cpu")
    x1 = torch.randn(1, 8)
    assert torch.equal(f(x1), x1.sigmoid())
    assert _ops(f, 2) == ["sigmoid"]
    assert len(f.recompile_reasons) == 2
    reason = f.recompile_reasons[1]
    assert reason.startswith("x.shape[0] > 2: expected True, got False (x.shape[0] = 1)"), reason
    f(torch.randn(1, 8))
    f(torch.randn(4, 8))
    assert len(f.specializations) == 3


def test_seed_example_dynamic() -> None:
    f = plait.compile(seed, backend="eager", dynamic=True)
    for n in (4, 3, 7):
        x = torch.randn(n, 5)
        assert torch.equal(f(x), x.relu())
    assert len(f.specializations) == 1
    graph = f.specializations[0].graph
    assert str(graph.inputs[0].type) == "f32[s0, s1]"
    x = torch.randn(1, 5)
    assert torch.equal(f(x), x.sigmoid())
    assert len(f.specializations) == 2
    assert f.recompile_reasons[0].startswith("x.shape[0] > 2: expected True, got False")


def test_captured_guards_are_printable_data() -> None:
    c = plait.capture(seed, (torch.randn(4, 8),))
    dims = [g for g in c.guards if g.kind == "dim"]
    assert [(g.source, g.text, g.expected) for g in dims] == [
        ("x.shape[0]", "x.shape[0] > 2", True)
    ]
    text = str(c.guards)
    assert "x: f32[4, 8]" in text and "torch.is_grad_enabled() == True" in text
    assert all(set(g.to_dict()) == {"kind", "source", "text", "expected"} for g in c.guards)


def _one_recompile(f: Any, first: tuple, second: tuple, needle: str) -> str:
    f(*first)
    f(*first)
    assert len(f.specializations) == 1
    f(*second)
    f(*second)
    assert len(f.specializations) == 2, f.recompile_reasons
    assert len(f.recompile_reasons) == 1
    reason = f.recompile_reasons[0]
    assert needle in reason, reason
    return reason


def test_dtype_change_recompiles_once() -> None:
    f = plait.compile(lambda x: x * 2, backend="eager")
    reason = _one_recompile(
        f, (torch.randn(3),), (torch.randn(3, dtype=torch.float64),), "x: f32[3]"
    )
    assert "expected f32[3] on cpu, got f64[3] on cpu" in reason


def test_device_change_recompiles_once() -> None:
    f = plait.compile(lambda x: x + 1, backend="eager")
    reason = _one_recompile(f, (torch.randn(3),), (torch.randn(3, device="meta"),), "x: f32[3]")
    assert "got f32[3] on meta" in reason
    assert f(torch.randn(3, device="meta")).device.type == "meta"


def test_requires_grad_change_recompiles_once() -> None:
    f = plait.compile(lambda x: x.exp(), backend="eager")
    reason = _one_recompile(
        f, (torch.randn(3),), (torch.randn(3, requires_grad=True),), "x.requires_grad == False"
    )
    assert reason.startswith("x.requires_grad == False: expected False, got True")


def test_program_reading_requires_grad_specializes() -> None:
    f = plait.compile(lambda x: x * 2 if x.requires_grad else x * 3, backend="eager")
    x = torch.randn(3)
    assert torch.equal(f(x), x * 3)
    xg = torch.randn(3, requires_grad=True)
    assert torch.equal(f(xg), xg * 2)


def test_train_eval_switch_recompiles_once() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    compiled = plait.compile(model, backend="eager")
    x = torch.randn(2, 4)
    compiled(x)
    compiled(x)
    compiled.eval()
    assert not model.training and not model[1].training
    y = compiled(x)
    compiled(x)
    assert torch.equal(y, model(x))
    assert len(compiled.specializations) == 2
    assert compiled.recompile_reasons == [
        "self.training == True (and all 2 submodules): expected True, got False "
        "(self.training is False, self.0.training is False, self.1.training is False)"
    ]
    compiled.train()
    compiled(x)
    assert len(compiled.specializations) == 2  # the train specialization is still there


def test_python_scalar_change_recompiles_once() -> None:
    def f(x: torch.Tensor, scale: float, use_relu: bool = True) -> torch.Tensor:
        y = x * scale
        return y.relu() if use_relu else y

    cf = plait.compile(f, backend="eager")
    x = torch.randn(4)
    reason = _one_recompile(cf, (x, 2.0), (x, 3.0), "scale == 2.0")
    assert reason == "scale == 2.0: expected 2.0 (float), got 3.0 (float)"
    assert torch.equal(cf(x, 3.0), (x * 3.0).relu())
    cf(x, 3.0, use_relu=False)
    assert "use_relu == True" in cf.recompile_reasons[1]


def test_grad_mode_is_guarded() -> None:
    f = plait.compile(lambda x: x + 1, backend="eager")
    f(torch.randn(2))
    with torch.no_grad():
        f(torch.randn(2))
    assert f.recompile_reasons[0].startswith("torch.is_grad_enabled() == True")


def test_unchanged_calls_never_recompile() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = plait.compile(model, backend="eager")
    for _ in range(5):
        compiled(torch.randn(3, 4))
    first = model[0]
    assert isinstance(first, torch.nn.Linear)
    with torch.no_grad():
        first.weight.add_(1.0)  # values may change: parameters are read live
    compiled(torch.randn(3, 4))
    assert len(compiled.specializations) == 1 and compiled.recompile_reasons == []


def test_recompile_limit() -> None:
    # NOTE: dynamic=False: automatic dynamic (the default) would serve sizes 2 and 3 with one
    # symbolic specialization
    f = plait.compile(
        lambda x: x + 1, options={"recompile_limit": 2}, backend="eager", dynamic=False
    )
    f(torch.randn(1))
    f(torch.randn(2))
    with pytest.raises(RecompileLimitError, match=r"recompile limit \(2 specializations\)"):
        f(torch.randn(3))


def test_replaced_parameter_shape_recompiles() -> None:
    model = torch.nn.Linear(4, 2)
    compiled = plait.compile(model, backend="eager")
    compiled(torch.randn(1, 4))
    model.weight = torch.nn.Parameter(torch.randn(3, 4))
    model.bias = torch.nn.Parameter(torch.randn(3))
    x = torch.randn(1, 4)
    assert torch.equal(compiled(x), model(x))
    assert "parameters and buffers keep" in compiled.recompile_reasons[0]
    assert "changed: weight, bias" in compiled.recompile_reasons[0]


def test_replaced_submodule_recompiles() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    compiled = plait.compile(model, backend="eager")
    compiled(torch.randn(1, 4))
    model[0] = torch.nn.Linear(4, 3)
    x = torch.randn(1, 4)
    assert torch.equal(compiled(x), model(x))
    assert compiled.recompile_reasons[0].startswith("self has the captured submodules")


class _Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))


class _Tied(torch.nn.Module):
    """Two submodules holding one parameter; the program reads it through the second."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Scale(), _Scale()
        self.b.w = self.a.w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.b.w * getattr(self.b.w, "scale", 1.0)


@pytest.mark.parametrize("untie", ["first slot", "second slot", "both, tied again"])
def test_tied_weights_set_apart_recompile(untie: str) -> None:
    """Tied weights are one input, read from the first slot: a parameter set in one slot
    only (or a new one in both) was not seen, and the program kept multiplying by the old
    one (or read the new one through the wrong slot)."""
    model = _Tied()
    compiled = plait.compile(model)
    with torch.no_grad():
        x = torch.randn(4)
        assert_bitwise(compiled(x), model(x), "tied")
        new = torch.nn.Parameter(torch.randn(4))
        new.scale = 3.0  # type: ignore[attr-defined]
        if untie != "second slot":
            model.a.w = new
        if untie != "first slot":
            model.b.w = new
        for _ in range(2):
            x = torch.randn(4)
            assert_bitwise(compiled(x), model(x), untie)
    assert len(compiled.specializations) == 2
    assert compiled.recompile_reasons[0].startswith("self has the captured submodules")


def test_dynamic_batch_serves_every_size_bitwise() -> None:
    from benchmarks.models.gpt2 import GPT2, GPT2Config
    from benchmarks.models.mlp import MLP

    torch.manual_seed(0)
    mlp = MLP(8, 16, 4).eval()
    cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=1, n_head=2, d_model=16)
    gpt = GPT2(cfg).eval()
    for model, make in (
        (mlp, lambda b: torch.randn(b, 8)),
        (gpt, lambda b: torch.randint(0, 64, (b, 10))),
    ):
        compiled = plait.compile(model, backend="eager", dynamic=True, fullgraph=True)
        for b in (3, 5, 2):
            x = make(b)
            assert torch.equal(compiled(x), model(x))
        assert len(compiled.specializations) == 1, compiled.recompile_reasons
        first = compiled.specializations[0].graph.inputs[0]
        assert str(first.type).split("[")[1].startswith("s0")  # the batch dim is a symbol
