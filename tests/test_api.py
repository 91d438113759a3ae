"""The public API: plait.capture, plait.compile (functions, modules, decorator forms), nested
inputs and outputs, clear errors for bad calls and bad options."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple
from typing import Any

import pytest
import torch

import plait
from plait.errors import CompiledInputError, GraphCaptureError
from plait.ir import semantic_hash
from tests.capture.helpers import assert_same


def test_public_names() -> None:
    assert {"capture", "compile", "Captured", "GraphCaptureError"} <= set(plait.__all__)
    assert plait.GraphCaptureError is GraphCaptureError


def test_capture_returns_graph_guards_and_hash() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    c = plait.capture(model, (torch.randn(2, 4),))
    assert isinstance(c, plait.Captured)
    assert [(v.kind, v.name) for v in c.graph.inputs] == [
        ("user", "input"),
        ("param", "0.weight"),
        ("param", "0.bias"),
    ]
    assert c.semantic_hash == semantic_hash(c.graph)
    # NOTE: the hash names the program, not the sample values or the weights.
    again = plait.capture(
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), torch.randn(2, 4)
    )
    assert again.semantic_hash == c.semantic_hash
    assert "self.training == True" in str(c.guards)


def test_compile_as_decorator_both_forms() -> None:
    @plait.compile
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @plait.compile(backend="eager", fullgraph=True, dynamic=True)
    def g(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    x = torch.randn(3)
    assert torch.equal(f(x), x * 2) and torch.equal(g(x), x + 1)
    assert f.__name__ == "f" and g.__wrapped__.__name__ == "g"
    assert len(f.specializations) == 1 and f.specializations[0].semantic_hash is not None


def test_compiled_module_behaves_as_the_module() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5)
    )
    cm = plait.compile(model, backend="eager")
    assert isinstance(cm, torch.nn.Module)
    assert list(cm.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(cm.parameters(), model.parameters()))
    assert cm[0] is model[0] and cm.training
    cm.eval()
    assert not model.training and not model[2].training
    cm.train()
    assert model[1].training
    new = {k: v * 2 for k, v in model.state_dict().items()}
    cm.load_state_dict(new)
    assert torch.equal(model[0].weight, new["0.weight"])
    cm.extra = 3
    assert model.extra == 3 and cm.extra == 3
    x = torch.randn(5, 4)
    cm.eval()
    assert torch.equal(cm(x), model(x))
    assert "CompiledModule[Sequential]" in repr(cm)


def test_parameters_are_shared_not_copied() -> None:
    model = torch.nn.Linear(3, 2)
    cm = plait.compile(model, backend="eager")
    x = torch.randn(1, 3)
    cm(x)
    with torch.no_grad():
        model.weight.mul_(-1)
    assert torch.equal(cm(x), model(x))
    assert len(cm.specializations) == 1


def test_backward_through_eager_backend_matches() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    cm = plait.compile(model, backend="eager")
    x = torch.randn(5, 3)
    cm(x).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for a, b in zip(got, (p.grad for p in model.parameters())):
        assert torch.equal(a, b)


Pair = namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    aux: dict[str, Any]
    n: int


def _nested(batch: dict[str, Any], pair: Pair, scale: float = 1.0) -> Output:
    h = batch["x"] * scale + pair.a
    outs = [h.sum(), (h.relu(), pair.b)]
    return Output(
        logits=h,
        aux={"outs": outs, "shape": h.shape, "none": None},
        n=h.shape[0] + len(batch["ys"]),
    )


def test_nested_inputs_and_outputs() -> None:
    f = plait.compile(_nested, backend="eager", fullgraph=True)

    def args() -> tuple:
        return (
            {"x": torch.randn(2, 3), "ys": [torch.ones(1), torch.zeros(1)]},
            Pair(torch.randn(3), torch.randn(1)),
        )

    for _ in range(2):
        a = args()
        got, want = f(*a, scale=2.0), _nested(*a, scale=2.0)
        assert type(got) is Output
        assert_same(got.logits, want.logits)
        assert_same(got.aux["outs"], want.aux["outs"])
        assert got.aux["shape"] == want.aux["shape"] and isinstance(got.aux["shape"], torch.Size)
        assert got.aux["none"] is None and got.n == want.n == 4
    assert len(f.specializations) == 1
    text = str(f.specializations[0].guards)
    assert "batch['x']: f32[2, 3]" in text and "scale == 2.0" in text


def test_ordered_dict_output_keeps_its_type() -> None:
    f = plait.compile(lambda x: OrderedDict(y=x + 1, z=[x, 2]), backend="eager")
    out = f(torch.ones(2))
    assert type(out) is OrderedDict and out["z"][1] == 2


def test_wrong_number_of_inputs_is_a_clear_error() -> None:
    f = plait.compile(lambda x, y: x + y, backend="eager")
    with pytest.raises(CompiledInputError, match="missing a required argument: 'y'"):
        f(torch.randn(2))
    cm = plait.compile(torch.nn.Linear(2, 2), backend="eager")
    with pytest.raises(CompiledInputError, match="too many positional arguments"):
        cm(torch.randn(1, 2), torch.randn(1, 2))


def test_non_tensor_where_a_tensor_was_captured_is_a_clear_error() -> None:
    f = plait.compile(lambda x, y: x * y, backend="eager")
    f(torch.randn(2), torch.randn(2))
    with pytest.raises(
        CompiledInputError,
        match="argument 'y' was a Tensor when the program was captured; got float",
    ):
        f(torch.randn(2), 3.0)
    with pytest.raises(CompiledInputError, match="argument 'x' was a Tensor"):
        f(3, torch.randn(2))


def test_optional_tensor_argument_may_become_none() -> None:
    def f(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return x if mask is None else x * mask

    cf = plait.compile(f, backend="eager")
    x = torch.randn(3)
    assert torch.equal(cf(x, torch.ones(3)), x)
    assert torch.equal(cf(x), x)
    assert len(cf.specializations) == 2


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        plait.compile(lambda x: x, backend="nope")
    with pytest.raises(ValueError, match="mode 'reduce-overhead' is not available"):
        plait.compile(lambda x: x, mode="reduce-overhead", backend="eager")
    with pytest.raises(ValueError, match=r"unknown options \['fast'\]"):
        plait.compile(lambda x: x, options={"fast": True}, backend="eager")
    with pytest.raises(TypeError, match=r"expects an nn\.Module or a function"):
        plait.compile(3)


def test_forward_hooks_of_the_module_are_captured() -> None:
    model = torch.nn.Linear(2, 2)
    model.register_forward_hook(lambda m, args, out: out * 10)
    cm = plait.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(1, 2)
    assert torch.equal(cm(x), model(x))


def test_max_autotune_mode_turns_on_triton_autotuning() -> None:
    """The mode sets StaxOptions.triton_autotune (what it means: a Triton kernel's launch shapes
    timed on the device); an explicit stax option wins over the mode."""
    x = torch.randn(8, 8)
    tuned = plait.compile(lambda t: t * 2 + 1, mode="max-autotune", options={"cache": False})
    assert torch.equal(tuned(x), x * 2 + 1)
    (spec,) = tuned.specializations
    assert spec.compiled.program.options.triton_autotune is True
    explicit = {"cache": False, "stax": {"triton_autotune": False}}
    kept = plait.compile(lambda t: t * 2 + 1, mode="max-autotune", options=explicit)
    kept(x)
    assert kept.specializations[0].compiled.program.options.triton_autotune is False
    default = plait.compile(lambda t: t * 2 + 1, options={"cache": False})
    default(x)
    assert default.specializations[0].compiled.program.options.triton_autotune is False
