"""The verifier names the node, the rule broken and the offending values."""

from __future__ import annotations

import pytest
import torch

from plait.ir import (
    Graph,
    GraphBuilder,
    InterpretError,
    Node,
    TensorType,
    Value,
    VerificationError,
    from_text,
    interpret,
    to_text,
    verify,
)
from plait.ir.ops import AttrError, TypeRuleError, get_op
from tests.ir.graphs import resnet_block
from tests.util import assert_bitwise

F32 = torch.float32


def small() -> Graph:
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 3), F32))
    y = b.call("relu", x)
    b.output(b.call("sum", y, dims=(1,)))
    return b.build()


def test_valid_graph_passes() -> None:
    verify(small())
    verify(resnet_block())


def test_wrong_output_type_names_node_and_types() -> None:
    g = small()
    g.nodes[1].outputs[0].type = TensorType((3,), F32)
    with pytest.raises(VerificationError) as info:
        verify(g)
    assert info.value.rule == "type" and info.value.node is g.nodes[1]
    assert "f32[3]" in str(info.value) and "f32[2]" in str(info.value)


def test_use_before_definition() -> None:
    g = small()
    g.nodes.reverse()
    with pytest.raises(VerificationError, match=r"\[ssa\].*not defined before its use"):
        verify(g)


def test_duplicate_names() -> None:
    g = small()
    g.nodes[1].outputs[0].name = "x"
    with pytest.raises(VerificationError, match=r"\[ssa\] .*%x is defined twice"):
        verify(g)


def test_dangling_output_and_foreign_value() -> None:
    g = small()
    g.outputs.append(Value("ghost", TensorType((1,), F32)))
    with pytest.raises(VerificationError, match=r"graph output 1 .*ghost.* not defined"):
        verify(g)


def test_bad_attributes() -> None:
    g = small()
    g.nodes[1].attrs["keepdim"] = 1
    with pytest.raises(VerificationError, match=r"\[attrs\].*keepdim.*bool"):
        verify(g)
    g = small()
    del g.nodes[1].attrs["dtype"]
    with pytest.raises(VerificationError, match=r"\[attrs\].*canonical"):
        verify(g)
    g = small()
    g.nodes[1].attrs["dims"] = (5,)
    with pytest.raises(VerificationError, match=r"\[type-rule\].*dim 5 out of range"):
        verify(g)


def test_unknown_op_and_input_kind() -> None:
    g = small()
    g.nodes[0].op = "relu6"
    with pytest.raises(VerificationError, match=r"\[op\].*unknown op 'relu6'"):
        verify(g)
    g = small()
    g.inputs[0].kind = "weight"
    with pytest.raises(VerificationError, match=r"\[input-kind\]"):
        verify(g)


def test_operand_kinds_are_checked() -> None:
    g = small()
    g.nodes[0].inputs = (2.0,)
    with pytest.raises(VerificationError, match="operand 'x' must be tensor"):
        verify(g)


def test_builder_errors_are_clear() -> None:
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 3), F32))
    with pytest.raises(AttrError, match="missing required attribute 'dim'"):
        b.call("softmax", x)
    with pytest.raises(AttrError, match="unknown attribute"):
        b.call("relu", x, inplace=True)
    with pytest.raises(TypeRuleError, match="do not broadcast"):
        b.call("add", x, b.input("y", TensorType((4,), F32)))
    with pytest.raises(TypeRuleError, match="takes 1 operand"):
        b.call("relu", x, x)
    with pytest.raises(KeyError, match="registry is closed"):
        get_op("frobnicate")
    with pytest.raises(ValueError, match="already defined"):
        b.input("x", TensorType((1,), F32))


def test_interpreter_checks_inputs() -> None:
    g = small()
    with pytest.raises(InterpretError, match="takes 1 inputs"):
        interpret(g, [])
    with pytest.raises(InterpretError, match="expected f32\\[2, 3\\]"):
        interpret(g, [torch.randn(2, 3, dtype=torch.float64)])
    with pytest.raises(InterpretError, match="dim 1 is 4"):
        interpret(g, [torch.randn(2, 4)])
    with pytest.raises(InterpretError, match="expected a tensor"):
        interpret(g, [[1.0]])


def test_interpreter_matches_eager_on_resnet_block() -> None:
    g = resnet_block()
    gen = torch.Generator().manual_seed(11)
    values = {}
    for v in g.inputs:
        assert isinstance(v.type, TensorType)
        t = torch.randn(tuple(int(d) for d in v.type.shape), generator=gen)
        values[v.name] = t.abs() + 0.5 if "running_var" in v.name else t
    (out,) = interpret(g, values)
    F = torch.nn.functional

    def bn(h: torch.Tensor, i: int) -> torch.Tensor:
        return F.batch_norm(
            h,
            values[f"bn{i}.running_mean"],
            values[f"bn{i}.running_var"],
            values[f"bn{i}.weight"],
            values[f"bn{i}.bias"],
            False,
            0.1,
            1e-5,
        )

    h = F.relu(bn(F.conv2d(values["x"], values["conv1.weight"], padding=1), 1))
    h = bn(F.conv2d(h, values["conv2.weight"], padding=1), 2)
    assert_bitwise(out, F.relu(h + values["x"]), "resnet block")


def test_node_ids_are_unique() -> None:
    g = small()
    g.nodes[1].id = g.nodes[0].id
    with pytest.raises(VerificationError, match="node id"):
        verify(g)


def test_multi_output_nodes_point_back() -> None:
    g = from_text(to_text(small()))
    node: Node = g.nodes[0]
    node.outputs[0].index = 3
    with pytest.raises(VerificationError, match="point back"):
        verify(g)
