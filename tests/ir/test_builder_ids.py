"""Node ids from :class:`plait.ir.GraphBuilder`: fresh after any change to the graph's node list
(the builder keeps the next id only while the list is what it left)."""

from __future__ import annotations

import torch

from plait.ir import GraphBuilder, TensorType
from plait.ir.verify import verify


def test_ids_stay_unique_when_another_hand_changes_the_node_list() -> None:
    b = GraphBuilder()
    x = b.input("x", TensorType((3,), torch.float32))
    y = b.call("relu", x)
    g = b.graph
    other = GraphBuilder.extend(g)  # NOTE: a second builder appends to the same graph
    z = other.call("neg", y, names=["z"])
    w = b.call("exp", z)
    g.nodes.pop()  # NOTE: the last node removed (w's): its id may be given again
    v = b.call("abs", z)
    u = other.call("sin", v, names=["u"])
    b.output(u)
    verify(g)  # NOTE: fails on an id used twice
    assert [n.op for n in g.nodes] == ["relu", "neg", "abs", "sin"]
    assert w.producer is not None and w.producer not in g.nodes
