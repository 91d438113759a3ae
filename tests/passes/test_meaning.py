"""Every pass keeps meaning on a corpus of graphs.

Passes that keep the order of arithmetic must give bitwise-equal results under the reference
interpreter; ``value-equal`` passes equal IEEE values; passes that change arithmetic (folding,
decomposition) are judged by plait.conformance under the numerical contract, anchored on a float64
run of the original graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings

import plait.conformance
from plait.ir import Graph, TensorType, from_text, interpret, to_text
from plait.passes import CONTRACT, EXACT, VALUE_EQUAL, all_passes, run_pipeline
from tests.ir.graphs import causal_attention, graphs, multi_output, resnet_block
from tests.passes.cases import CUDA_TYPED, FIRES, UNVERIFIED
from tests.passes.test_rules import params_for
from tests.util import assert_bitwise

# NOTE: plait's own passes: a test elsewhere registers user passes (some wrong on purpose)
PASSES = sorted(n for n, info in all_passes().items() if info.fn.__module__.startswith("plait."))
SIZES = {"s0": 5}


def _shape(t: TensorType) -> tuple[int, ...]:
    return tuple(
        int(d) if isinstance(d, int) else int(d.subs({s: SIZES[str(s)] for s in d.free_symbols}))
        for d in t.shape
    )


def user_inputs(g: Graph, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for v in g.inputs:
        if v.kind != "user":
            continue
        assert isinstance(v.type, TensorType)
        shape = _shape(v.type)
        if v.type.dtype == torch.bool:
            t = torch.rand(shape, generator=gen) > 0.3
            if t.dim() == 2 and t.shape[0] == t.shape[1]:
                t |= torch.eye(t.shape[0], dtype=torch.bool)  # no fully masked attention row
            out[v.name] = t
        elif v.type.dtype.is_floating_point:
            out[v.name] = torch.randn(shape, generator=gen, dtype=torch.float64).to(v.type.dtype)
        else:  # integer inputs are token ids here: keep them valid indices
            out[v.name] = torch.randint(0, 16, shape, generator=gen).to(v.type.dtype)
    return out


def captured_models() -> list[tuple[str, Graph, dict[str, torch.Tensor]]]:
    """The benchmark models (small sizes), captured in eval mode with their real weights."""
    import plait
    from benchmarks.models.gpt2 import GPT2, GPT2Config
    from benchmarks.models.mlp import MLP
    from benchmarks.models.resnet import resnet18

    torch.manual_seed(0)
    gpt = GPT2Config(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32)
    explicit = GPT2Config(**{**gpt.__dict__, "attention": "explicit"})
    models = [
        ("mlp", MLP(8, 32, 4), (torch.randn(5, 8),)),
        ("resnet18", resnet18(num_classes=10), (torch.randn(2, 3, 32, 32),)),
        ("gpt2-sdpa", GPT2(gpt), (torch.randint(0, 64, (2, 8)),)),
        ("gpt2-explicit", GPT2(explicit), (torch.randint(0, 64, (2, 8)),)),
    ]
    out = []
    for name, model, args in models:
        model.eval()
        with torch.no_grad():
            graph = plait.capture(model, args).graph
        state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        out.append((name, graph, {k: v.detach() for k, v in state.items()}))
    return out


Entry = tuple[str, Graph, "dict[str, torch.Tensor] | None"]


def corpus() -> list[Entry]:
    named: list[Entry] = [
        ("resnet_block", resnet_block(), None),
        ("causal_attention", causal_attention(), None),
        ("multi_output", multi_output(), None),
    ]
    named += [
        (f"case:{rule}", from_text(FIRES[rule][0]), None)
        for rule in sorted(FIRES)
        if rule not in UNVERIFIED and rule not in CUDA_TYPED
    ]
    return named + list(captured_models())


CORPUS = corpus()


def pipeline_for(name: str) -> str:
    return f"freeze,{name}" if name in ("const-fold", "fold-bn", "dce") else name


def runner(g: Graph, params: dict[str, torch.Tensor], seed: int = 0) -> Callable[..., Any]:
    names = [v.name for v in g.inputs if v.kind == "user"]

    def run(*args: torch.Tensor) -> list[Any]:
        torch.manual_seed(seed)
        outs = interpret(g, {**params, **dict(zip(names, args))})
        # NOTE: a graph may return an input or a weight as such; hand out copies, so the gate's
        # poisoning of returned buffers cannot reach the weights of the next call.
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in outs]

    return run


def as_float64(g: Graph, params: dict[str, torch.Tensor]) -> tuple[Graph, dict[str, Any]]:
    text = re.sub(r"\b(f32|bf16|f16)\b", "f64", to_text(g))
    g64 = from_text(text)
    cast = {k: v.double() if v.is_floating_point() else v for k, v in params.items()}
    return g64, cast


def _compare(kind: str, before: Graph, after: Graph, params: dict[str, Any], label: str) -> None:
    if kind == CONTRACT:
        names = [v.name for v in before.inputs if v.kind == "user"]
        g64, p64 = as_float64(before, params)

        def factory(seed: int) -> tuple[torch.Tensor, ...]:
            values = user_inputs(before, 1000 + seed)
            return tuple(values[n] for n in names)

        def ref64(*args: torch.Tensor) -> list[Any]:
            return runner(g64, p64)(*(a.double() if a.is_floating_point() else a for a in args))

        report = plait.conformance.check(
            runner(before, params), runner(after, params), factory, reference64=ref64, stress=None
        )
        assert report.ok, f"{label}\n{report}"
        return
    for seed in (1, 2):
        values = user_inputs(before, seed)
        args = [values[v.name] for v in before.inputs if v.kind == "user"]
        expected = runner(before, params)(*args)
        got = runner(after, params)(*args)
        for e, a in zip(expected, got):
            if kind == EXACT:
                assert_bitwise(a, e, label)
            else:
                assert kind == VALUE_EQUAL
                assert torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(e, nan=7.0)), (
                    label
                )


@pytest.mark.parametrize("pass_name", PASSES)
@pytest.mark.parametrize(("label", "graph", "weights"), CORPUS, ids=[c[0] for c in CORPUS])
def test_pass_keeps_meaning(
    pass_name: str, label: str, graph: Graph, weights: dict[str, torch.Tensor] | None
) -> None:
    params = weights if weights is not None else params_for(graph)
    kind = all_passes()[pass_name].semantics
    if pass_name == "shape-prop":
        kind = EXACT
    after = run_pipeline(graph, pipeline_for(pass_name), params=params).graph
    _compare(kind, graph, after, params, f"{pass_name} on {label}")


@settings(max_examples=40)
@given(graphs())
def test_order_keeping_passes_on_random_graphs(g: Graph) -> None:
    params = params_for(g)
    for name in PASSES:
        kind = all_passes()[name].semantics
        if kind == CONTRACT:
            continue
        after = run_pipeline(g, pipeline_for(name), params=params).graph
        _compare(EXACT if name == "shape-prop" else kind, g, after, params, name)


@settings(max_examples=15)
@given(graphs(allow_random=False))
def test_contract_passes_on_random_graphs(g: Graph) -> None:
    params = params_for(g)
    for name in PASSES:
        if all_passes()[name].semantics == CONTRACT:
            after = run_pipeline(g, pipeline_for(name), params=params).graph
            _compare(CONTRACT, g, after, params, name)
