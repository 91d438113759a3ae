"""``torch.compile(model, backend="plait")``: Dynamo's FX graphs compiled by ``plait.compile``.

Every check runs the compiled program on fresh inputs against eager PyTorch under the numerical
contract (``plait.conformance.check``, the contract's "model" row), and reaches each FX graph's
plait manifest through the backend (``PlaitBackend.graphs``, ``plait.explain``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.mlp import MLP
from benchmarks.models.resnet import resnet18
from plait.dynamo_backend import DynamoGraph, PlaitBackend, plait_backend
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = [pytest.mark.xdist_group("dynamo"), pytest.mark.filterwarnings(
    # NOTE: plait announces opaque nodes and fallbacks (CaptureFallbackWarning); the tests read
    # the same facts from the manifest
    "ignore::plait.errors.CaptureFallbackWarning"
)]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _floats(*shape: int) -> Callable[[int], tuple[torch.Tensor]]:
    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

    return make


def _tokens(*shape: int, vocab: int) -> Callable[[int], tuple[torch.Tensor]]:
    def make(seed: int) -> tuple[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, vocab, shape, generator=g),)

    return make


def _judge(
    model: nn.Module, candidate: Callable[..., Any], inputs: Any, **kwargs: Any
) -> plait.conformance.Report:
    report = plait.conformance.check(
        model, candidate, inputs, candidate_module=model, op_class="model", draws=2, **kwargs
    )
    assert report.ok, str(report)
    return report


def _specializations(backend: PlaitBackend) -> list[Any]:
    return [s for g in backend.graphs for s in g.compiled.specializations]


def _counts(spec: Any) -> dict[str, int]:
    return dict(spec.manifest.executor["evidence"]["counts"])


# --- registration ---------------------------------------------------------------------------
def test_pyproject_registers_the_backend_for_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry point in pyproject.toml names the backend object, and Dynamo's registry, given
    that entry point (as an installed distribution would provide it), resolves "plait" to it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    value = project["entry-points"]["torch_dynamo_backends"]["plait"]
    entry = EntryPoint(name="plait", value=value, group="torch_dynamo_backends")
    assert entry.load() is plait_backend

    from torch._dynamo.backends import registry

    registry._lazy_import()
    monkeypatch.setitem(registry._BACKENDS, "plait", entry)
    monkeypatch.delitem(registry._COMPILER_FNS, "plait", raising=False)
    try:
        assert registry.lookup_backend("plait") is plait_backend
        f = torch.compile(lambda x: (x * 3).relu(), backend="plait")
        x = torch.randn(5)
        assert torch.equal(f(x), (x * 3).relu())  # exact ops: the same bits
        assert any(g.compiled.specializations for g in plait_backend.graphs)
    finally:
        registry._COMPILER_FNS.pop("plait", None)


# --- models under the contract ----------------------------------------------------------------
@pytest.mark.slow
def test_resnet18_one_graph_frozen_and_within_contract() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge(model, lambda x: compiled(x), _floats(2, 3, 32, 32))
    (graph,) = backend.graphs
    # Dynamo lifted the weights into inputs; plait sees them as the module's state again
    assert "layer1.0.conv1.weight" in graph.state_paths
    (spec,) = graph.compiled.specializations
    fired = {p["name"]: p["rewrites"] for p in spec.manifest.to_json()["passes"]}
    assert fired["freeze"] and fired["fold-bn"], fired
    assert _counts(spec)["fallback"] == 0 and _counts(spec)["native"] > 0
    text = str(plait.explain(graph.compiled))
    assert "fold-bn" in text and "frozen tensor" in text


@pytest.mark.parametrize("which", ["mlp", "gpt2"])
def test_benchmark_models_within_contract(which: str) -> None:
    torch.manual_seed(0)
    if which == "mlp":
        model: nn.Module = MLP(16, 32, 8).eval()
        inputs = _floats(4, 16)
    else:
        cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32)
        model, inputs = GPT2(cfg).eval(), _tokens(2, 16, vocab=64)
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge(model, lambda x: compiled(x), inputs)
    specs = _specializations(backend)
    assert specs and all(s.graph is not None and _counts(s)["fallback"] == 0 for s in specs)


def test_gradients_and_training_state_within_contract() -> None:
    """Grad mode on: plait keeps Dynamo's parameters unfrozen and compiles the backward too
    (Stax programs for both halves); BatchNorm's running stats (buffers the FX graph writes)
    are updated once per call, as eager does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 5)).train()  # fmt: skip
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    _judge(model, lambda x: compiled(x), _floats(2, 3, 8, 8), grads=True)
    specs = _specializations(backend)
    assert specs and all(s.graph is not None for s in specs)
    for spec in specs:
        assert not spec.manifest.fallbacks, spec.manifest.fallbacks
        assert spec.manifest.autograd["wrt"], "the backward was not compiled"
        assert spec.manifest.executor["backward"]["evidence"]["counts"]["fallback"] == 0


class _WritesItsBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.linear.bias.add_(1.0)
        return self.linear(x)


def test_a_graph_that_writes_a_parameter_falls_back_loudly() -> None:
    """Parameters are module state to plait, which never writes one inside a program: the FX
    graph runs eagerly (warned, recorded), and the model's parameters move as eager's do."""
    torch.manual_seed(0)
    model = _WritesItsBias().eval()
    reference = copy.deepcopy(model)
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 4)
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning, match="in-place update"):
        for _ in range(2):
            assert_bitwise(compiled(x), reference(x), "output")  # eager runs the graph
    assert_bitwise(model.linear.bias, reference.linear.bias, "bias")
    (spec,) = _specializations(backend)
    assert spec.fallback_reason is not None and "linear.bias" in spec.fallback_reason


# --- graph breaks -------------------------------------------------------------------------
class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x).relu()
        print("a graph break")  # NOTE: Dynamo splits the program here
        return self.second(y).sigmoid()


def test_graph_break_compiles_two_plait_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = _Broken().eval()
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge(model, lambda x: compiled(x), _floats(3, 8))
    assert "a graph break" in capsys.readouterr().out
    graphs = backend.graphs
    assert len(graphs) == 2
    assert [g.state_paths for g in graphs] == [
        ["first.weight", "first.bias"],
        ["second.weight", "second.bias"],
    ]
    for g in graphs:
        (spec,) = g.compiled.specializations
        assert spec.graph is not None and spec.fallback_reason is None
        assert plait.explain(g.compiled).specializations[0].manifest is spec.manifest


# --- guards -------------------------------------------------------------------------------
def test_changed_weights_are_a_plait_recompile_never_stale() -> None:
    """Dynamo passes parameters as inputs and does not guard their values; plait froze them,
    so its own guards (identity, version) must catch an in-place update and a replacement."""
    torch.manual_seed(0)
    model = MLP(8, 16, 4).eval()
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    first = next(model.parameters())
    with torch.no_grad():
        _judge(model, lambda x: compiled(x), _floats(3, 8))
        first.mul_(-2.0)
        _judge(model, lambda x: compiled(x), _floats(3, 8))
        name, module, attr = _first_parameter_slot(model)
        setattr(module, attr, nn.Parameter(torch.randn_like(first)))
        _judge(model, lambda x: compiled(x), _floats(3, 8))
    (graph,) = backend.graphs
    reasons = graph.compiled.recompile_reasons
    assert len(reasons) == 2 and all(name in r and "frozen" in r for r in reasons), reasons


def _first_parameter_slot(model: nn.Module) -> tuple[str, nn.Module, str]:
    name = next(n for n, _ in model.named_parameters())
    *path, attr = name.split(".")
    return name, model.get_submodule(".".join(path)), attr


def test_plait_guards_hold_where_dynamo_does_not_guard() -> None:
    """Whether oneDNN is enabled is read by Stax's compile; Dynamo does not guard it, plait
    does (one FX graph, two plait specializations)."""
    torch.manual_seed(0)
    model = MLP(8, 16, 4).eval()
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge(model, lambda x: compiled(x), _floats(3, 8))
        with torch.backends.mkldnn.flags(enabled=False):
            _judge(model, lambda x: compiled(x), _floats(3, 8))
    (graph,) = backend.graphs
    (reason,) = graph.compiled.recompile_reasons
    assert reason.startswith("torch.backends.mkldnn.enabled == True"), reason


def _dynamic_program(x: torch.Tensor) -> torch.Tensor:
    return (x.reshape(x.shape[0], -1) * 2.0).tanh()


def _judge_sizes(compiled: Callable[..., Any], batches: tuple[int, ...]) -> None:
    for batch in batches:
        report = plait.conformance.check(
            _dynamic_program, compiled, _floats(batch, 2, 4), op_class="model", draws=2
        )
        assert report.ok, str(report)


def test_a_graph_dynamo_made_dynamic_is_specialized_per_size_by_default() -> None:
    """After a second batch size Dynamo compiles a graph with a symbolic batch; plait compiles
    each size natively (Stax), behind its own shape guards, and past its recompile limit runs
    the graph eagerly, warned and recorded (as torch.compile does on its own limit)."""
    backend = PlaitBackend(options={"recompile_limit": 2})
    compiled = torch.compile(_dynamic_program, backend=backend)
    with pytest.warns(CaptureFallbackWarning, match="recompile limit"):
        _judge_sizes(compiled, (3, 5, 7, 9))
    static, dynamic = backend.graphs
    assert not static.symbolic and dynamic.symbolic and not dynamic.dynamic
    specs = dynamic.compiled.specializations
    assert len(specs) == 2 and all(s.manifest.options["backend"] == "stax" for s in specs)
    assert "f32[7, 2, 4]" in dynamic.compiled.recompile_reasons[0]
    limit = plait.explain(dynamic.compiled).limit_fallback
    assert limit is not None and limit["calls"] > 0


def test_dynamic_sizes_come_from_the_tensors() -> None:
    """With options={"dynamic": True}, Dynamo's size argument is read from the tensor inside
    the program (plait's symbol), so one specialization serves every batch size."""
    backend = PlaitBackend(options={"dynamic": True})
    compiled = torch.compile(_dynamic_program, backend=backend)
    _judge_sizes(compiled, (3, 5, 7, 9))
    _, dynamic = backend.graphs
    assert [s.kind for s in dynamic.slots] == ["size", "user"]
    (spec,) = dynamic.compiled.specializations
    assert spec.manifest.options["dynamic"] and spec.graph is not None
    assert any(not isinstance(d, int) for d in spec.graph.inputs[0].type.shape)


def test_options_reach_plait_compile() -> None:
    backend = PlaitBackend(options={"backend": "eager"})
    compiled = torch.compile(lambda x: x.exp() - 1.0, backend=backend, options={"cache": False})
    x = torch.randn(4)
    assert torch.equal(compiled(x), x.exp() - 1.0)  # the interpreter runs PyTorch's own ops
    (spec,) = _specializations(backend)
    assert spec.manifest.options["backend"] == "eager"
    assert spec.manifest.cache == {}  # options={"cache": False}: no store was consulted
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="unknown options"):
        torch.compile(lambda x: x + 1, backend=backend, options={"nope": 1})(x)


def test_repr_and_explain_name_each_graph() -> None:
    backend = PlaitBackend()
    compiled = torch.compile(_Broken().eval(), backend=backend)
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    text = backend.explain()
    assert text.count("DynamoGraph(#") == 2 and text.count("1 specialization") == 2
    assert all(isinstance(g, DynamoGraph) for g in backend.graphs)
    backend.reset()
    assert backend.graphs == []


# --- Hugging Face models (random weights from a config; nothing downloaded) ----------------
def _hf_gpt2() -> nn.Module:
    import transformers

    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    return transformers.GPT2Model(cfg).eval()


def _last_hidden(model: Callable[..., Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda ids: model(input_ids=ids).last_hidden_state


@pytest.mark.slow
def test_hf_gpt2_captured_within_contract() -> None:
    """GPT2Model's FX graph (its ``torch.arange(n, device=...)`` included) is one plait graph;
    ``torch.addmm`` (HF's Conv1D) is captured as ``linear``, no opaque node. The reference
    interpreter runs it (Stax: the next test)."""
    torch.manual_seed(0)
    model = _hf_gpt2()
    backend = PlaitBackend(options={"backend": "eager"})
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge_fn(model, compiled)
    (spec,) = _specializations(backend)
    assert spec.graph is not None and spec.fallback_reason is None
    assert spec.opaque_counts == {}
    assert sum(n.op == "linear" for n in spec.graph.nodes) >= 4
    assert spec.manifest.fallbacks == []


def _judge_fn(model: nn.Module, compiled: Callable[..., Any]) -> None:
    report = plait.conformance.check(
        _last_hidden(model), _last_hidden(compiled), _tokens(2, 16, vocab=64),
        reference_module=model, candidate_module=model, op_class="model", draws=2,
    )  # fmt: skip
    assert report.ok, str(report)


@pytest.mark.slow
def test_hf_gpt2_with_stax_within_contract() -> None:
    """The same graph on Stax."""
    torch.manual_seed(0)
    model = _hf_gpt2()
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge_fn(model, compiled)
    (spec,) = _specializations(backend)
    assert spec.graph is not None and spec.fallback_reason is None


def _hf_bert() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32)  # fmt: skip
    return transformers.BertModel(cfg).eval()


@pytest.mark.slow
def test_hf_bert_compiles_with_its_gather_captured() -> None:
    """BertModel calls ``torch.gather(..., index=tensor)`` with the index as a keyword: it is
    captured (an index_select of row-major positions), so the graph is plait's (run here by
    plait's interpreter), correct under the contract, with no opaque node."""
    model = _hf_bert()
    backend = PlaitBackend({"backend": "eager"})
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge_fn(model, compiled)
    specs = _specializations(backend)
    assert specs and all(s.graph is not None and s.fallback_reason is None for s in specs)
    assert all(s.opaque_counts == {} for s in specs)
    assert sum(n.op == "index_select" for s in specs for n in s.graph.nodes) > 0


@pytest.mark.slow
def test_hf_bert_with_stax() -> None:
    """On Stax, the ``aten.gather`` extern's result reaches attention's layout dry run."""
    model = _hf_bert()
    backend = PlaitBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        _judge_fn(model, compiled)
    specs = _specializations(backend)
    assert specs and all(s.graph is not None and s.fallback_reason is None for s in specs)


def test_fake_example_inputs_are_never_captured() -> None:
    """Dynamo may hand a backend fake example inputs: the backend keeps them only until the
    first call, which rebinds the real arguments before plait captures."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    torch.manual_seed(0)
    model = MLP(8, 16, 4).eval()
    made: list[DynamoGraph] = []

    def with_fakes(gm: Any, example_inputs: list[Any]) -> Any:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
        made.append(PlaitBackend()(gm, fakes))
        return made[-1]

    compiled = torch.compile(model, backend=with_fakes)
    with torch.no_grad():
        _judge(model, lambda x: compiled(x), _floats(2, 8))
    (graph,) = made
    tensors = [*graph.program.parameters(), *graph.program.buffers()]
    assert len(tensors) == len(graph.state_paths) > 0
    assert not any(isinstance(t, FakeTensor) for t in tensors)
    (spec,) = graph.compiled.specializations
    assert spec.graph is not None and _counts(spec)["fallback"] == 0


def test_an_unknown_mode_is_refused() -> None:
    compiled = torch.compile(MLP(8, 16, 4).eval(), backend=PlaitBackend(),
                             mode="reduce-overhead")  # fmt: skip
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="mode 'reduce-overhead'"):
        compiled(torch.randn(2, 8))


def test_state_is_rebound_from_dynamo_arguments() -> None:
    """The module plait compiles holds exactly the tensors Dynamo passed on the last call."""
    model = MLP(8, 16, 4).eval()
    backend = PlaitBackend()
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    (graph,) = backend.graphs
    held = dict(graph.program.named_parameters())
    live = dict(compiled._orig_mod.named_parameters())
    assert held.keys() == live.keys() and all(held[k] is live[k] for k in held)


def _writes_its_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x.add_(1.0)
    return x.sin() * 2, x.t()


def test_an_input_written_in_place_and_a_returned_view_match_eager() -> None:
    """Dynamo functionalizes the write to a graph input: the caller's tensor is written as in
    eager, and the returned view is of the caller's tensor."""
    compiled = torch.compile(_writes_its_input, backend=PlaitBackend(options={"cache": False}))
    for seed in range(3):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))
        mine = x.clone()
        want = _writes_its_input(x)
        got = compiled(mine)
        torch.testing.assert_close(mine, x, **contract_tol("model", torch.float32))
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
        assert got[1].data_ptr() == mine.data_ptr()


def _writes_through_data(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x * 2
    w.data.mul_(0.5)  # NOTE: Dynamo spells it torch._C._autograd._get_data_attr(w)
    return y + w.sum()


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_write_through_data_writes_the_caller_s_tensor(requires_grad: bool) -> None:
    """``w.data`` shares ``w``'s memory: a write through it is a write of ``w``, done once per
    call as eager does (a parameter's is the loud eager fallback of plait.compile)."""
    compiled = torch.compile(_writes_through_data, backend=PlaitBackend(options={"cache": False}))
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(3, generator=g), torch.randn(4, generator=g)
        mine = w.clone().requires_grad_(requires_grad)
        theirs = w.clone().requires_grad_(requires_grad)
        want = _writes_through_data(x, theirs)
        got = compiled(x, mine)
        torch.testing.assert_close(mine, theirs, **contract_tol("model", torch.float32))
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))


def test_a_compiled_bound_method_s_weights_are_module_state() -> None:
    """``torch.compile(model.forward)``: Dynamo reaches the weights through the bound method
    (``L['fn'].__self__._modules[...]``); they are module state to plait (frozen behind its
    guards), as for ``torch.compile(model)``, and a weight changed in place is never stale."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU()).eval()
    backend = PlaitBackend()
    compiled = torch.compile(model.forward, backend=backend)
    with torch.no_grad():
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("model", torch.float32))
        model[0].weight.mul_(-1)
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("model", torch.float32))
    (graph,) = backend.graphs
    assert graph.state_paths[:2] == ["0.weight", "0.bias"], graph.state_paths
