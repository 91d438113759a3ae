"""The PassManager: pipelines by name, records, semantic drift, carried identity."""

from __future__ import annotations

import pytest
import torch

from plait.errors import SemanticDriftError
from plait.ir import Graph, TensorType, from_text, semantic_hash
from plait.passes import PassContext, parse_pipeline, register_pass, run_pipeline
from plait.passes.manager import _PASSES, EXACT
from tests.ir.graphs import resnet_block

TEXT = (
    "graph(\n  user %x: f32[4]\n) {\n  %0 = exp(%x) : f32[4]\n  %1 = relu(%x) : f32[4]\n"
    "  return %1\n}"
)


def test_pipeline_text_and_unknown_pass() -> None:
    assert parse_pipeline(" cse, dce ,") == ["cse", "dce"]
    with pytest.raises(KeyError, match="unknown pass 'fuse-everything'; known passes"):
        parse_pipeline("cse,fuse-everything")


def test_records_and_carried_hash() -> None:
    g = from_text(TEXT)
    h = semantic_hash(g)
    result = run_pipeline(g, ["cse", "dce"], source_hash=h)
    assert result.source_hash == h
    assert [r.name for r in result.records] == ["cse", "dce"]
    assert not result.records[0].changed and result.records[1].changed
    assert result.records[1].rewrites[0].replaced == [0]
    assert set(result.timings()) == {"0:cse", "1:dce"}
    # the input graph is untouched: passes run on copies
    assert len(g.nodes) == 2


def test_broken_pass_is_semantic_drift() -> None:
    @register_pass("test-break-types", EXACT)
    def breaker(graph: Graph, ctx: PassContext) -> Graph:
        node = graph.nodes[0]
        node.outputs[0].type = TensorType((5,), torch.float32)
        return graph

    try:
        with pytest.raises(SemanticDriftError) as info:
            run_pipeline(from_text(TEXT), "dce,test-break-types")
        assert info.value.pass_name == "test-break-types"
        assert info.value.node_id == 1
        assert "type rule gives f32[4]" in str(info.value)
        # with checks off the broken graph goes through (the caller asked for it)
        run_pipeline(from_text(TEXT), "test-break-types", checks=False)
    finally:
        del _PASSES["test-break-types"]


def test_inference_pipeline_on_resnet_block() -> None:
    from plait.passes import INFERENCE_PIPELINE
    from tests.passes.test_rules import params_for

    g = resnet_block()
    result = run_pipeline(g, INFERENCE_PIPELINE, params=params_for(g))
    ops = [n.op for n in result.graph.nodes]
    assert ops == ["conv2d", "relu", "conv2d", "add", "relu"]
    # only the folded weights stay as constants
    assert sorted(result.graph.constants) == sorted(
        v.name for v in result.graph.inputs if v.kind == "const"
    )
