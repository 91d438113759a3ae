"""Partitioner properties on random graphs: the backward reads only saved values and cotangents,
min-cut never saves more bytes than save-all, and both give eager's gradients."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import plait.contract
from plait.autograd import CompiledAutograd, Partition, build_joint, partition
from plait.autograd.joint import Joint
from plait.ir import Graph, GraphBuilder, TensorType, interpret

F64 = torch.float64
UNARY = ("exp", "sin", "relu")
BINARY = ("add", "mul", "sub")
SHAPE = (3, 4)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    b = GraphBuilder()
    values = [b.input("x", TensorType(SHAPE, F64)), b.param("w", TensorType(SHAPE, F64))]
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY))
            values.append(b.call(op, draw(st.sampled_from(values))))
        else:
            op = draw(st.sampled_from(BINARY))
            a, c = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            values.append(b.call(op, a, c))
    computed = values[2:]
    picks = draw(st.lists(st.sampled_from(computed), min_size=1, max_size=3, unique_by=id))
    b.output(*picks)
    return b.build()


@settings(max_examples=60, deadline=None)
@given(graphs(), st.integers(0, 2**31 - 1))
def test_partitions_of_random_graphs(g: Graph, seed: int) -> None:
    joint = build_joint(g, ["x", "w"])
    gen = torch.Generator().manual_seed(seed)
    x, w = (torch.randn(SHAPE, generator=gen, dtype=F64) for _ in range(2))
    cots = [torch.randn(SHAPE, generator=gen, dtype=F64) for _ in joint.cotangents]
    expected = interpret(joint.graph, [x, w, *cots])[joint.n_outputs :]
    tol = plait.contract.load().gradcheck
    bytes_saved = {}
    for name in ("save-all", "min-cut"):
        p = partition(joint, name)
        saved_names = [v.name for v in p.saved]
        cot_names = [v.name for v in joint.graph.inputs[joint.n_inputs :]]
        assert [v.name for v in p.backward.inputs] == saved_names + cot_names
        assert len(p.forward.outputs) == joint.n_outputs + len(p.saved)
        bytes_saved[name] = p.saved_bytes
        _recomputed_just_in_time(p)
        run = CompiledAutograd.interpreted(
            p,
            n_inputs=2,
            n_outputs=joint.n_outputs,
            cotangents=joint.cotangents,
            grads=joint.grads,
        )
        leaves = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
        outs = run(leaves)
        live = [(outs[i], c) for i, c in zip(joint.cotangents, cots)]
        got = torch.autograd.grad(
            [o for o, _ in live], leaves, [c for _, c in live], allow_unused=True
        )
        for k, e in zip(joint.grads, expected):
            # NOTE: a chain that overflows (exp of exp, then sin) has NaN gradients, eager's
            # too: NaN must be exactly where the reference has it
            torch.testing.assert_close(got[k], e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        assert all(got[k] is None for k in range(2) if k not in joint.grads)
    assert bytes_saved["min-cut"] <= bytes_saved["save-all"]


def _recomputed_just_in_time(p: Partition) -> None:
    """Each node the backward recomputes comes just before its first reader: only other
    recomputed nodes between them (each recomputed value live from there, not from the
    backward's start)."""
    nodes = p.backward.nodes
    late = set(p.recomputed)
    for i, n in enumerate(nodes):
        if n.id not in late:
            continue
        outs = {id(v) for v in n.outputs}
        readers = [j for j in range(i + 1, len(nodes))
                   if outs & {id(u) for u in nodes[j].input_values()}]  # fmt: skip
        if readers:
            assert all(m.id in late for m in nodes[i + 1 : readers[0]]), (n, nodes[readers[0]])


def test_min_cut_recomputes_each_value_just_before_its_first_reader() -> None:
    """Three layers ``gelu(h @ w)`` on a GPU, whose GELUs min-cut recomputes: the backward,
    last layer first, takes each GELU again where its weight's gradient reads it, not all
    three at its start (they would all be live at once: the bytes they were not saved for)."""
    b = GraphBuilder()
    h = b.input("x", TensorType((4, 6), F64, "cuda:0"))
    names = []
    for i in range(3):
        w = b.param(f"w{i}", TensorType((6, 6), F64, "cuda:0"))
        h = b.call("gelu", b.call("matmul", h, w))
        names.append(h.name)
    b.output(b.call("matmul", h, b.param("w3", TensorType((6, 2), F64, "cuda:0"))))
    joint = build_joint(b.build(), ["x", "w0", "w1", "w2", "w3"])
    p = partition(joint, "min-cut")
    ops = [n.op for n in p.backward.nodes]
    assert ops.count("gelu") == 3 and not set(names) & {v.name for v in p.saved}
    _recomputed_just_in_time(p)
    gelus = [i for i, op in enumerate(ops) if op == "gelu"]
    assert gelus[0] > 0 and gelus[1] > gelus[0] + 1 and gelus[2] > gelus[1] + 1


def test_min_cut_saves_a_projection_rather_than_its_views() -> None:
    """q, k and v split from one projection and transposed (attention's inputs): saving the
    projection costs the bytes its three views would, and no copy; min-cut saves it, and the
    backward takes the views again."""
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 6), F64))
    w = b.param("w", TensorType((6, 12), F64))
    h = b.call("matmul", x, w)
    q, k, v = b.call("split", h, sizes=(4, 4, 4), dim=1)
    s = b.call("matmul", q, b.call("permute", k, dims=(1, 0)))
    b.output(b.call("matmul", b.call("permute", s, dims=(1, 0)), v))
    joint = build_joint(b.build(), ["x", "w"])
    p = partition(joint, "min-cut")
    saved = {v.name for v in p.saved}
    assert h.name in saved and not {q.name, k.name, v.name} & saved
    assert "split" in [n.op for n in p.backward.nodes]  # NOTE: the views, taken again
    assert p.saved_bytes <= partition(joint, "save-all").saved_bytes


def _gelu_then_product(device: str) -> tuple[Joint, str, str]:
    """``gelu(x @ w1) @ w2``: the backward needs the GELU's input (its derivative) and its
    output (``w2``'s gradient)."""
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 6), F64, device))
    w1 = b.param("w1", TensorType((6, 8), F64, device))
    w2 = b.param("w2", TensorType((8, 3), F64, device))
    h = b.call("matmul", x, w1)
    g = b.call("gelu", h)
    b.output(b.call("matmul", g, w2))
    return build_joint(b.build(), ["x", "w1", "w2"]), h.name, g.name


def test_min_cut_saves_a_cpu_gelu_and_recomputes_a_cuda_one() -> None:
    """A CPU backward that recomputed the GELU paid what the forward paid (COSTLY_ON_CPU); a
    GPU's backward kernel computes it where it reads the input, so there it is recomputed."""
    joint, h, g = _gelu_then_product("cpu")
    p = partition(joint, "min-cut")
    assert {h, g} <= {v.name for v in p.saved}
    assert "gelu" not in [n.op for n in p.backward.nodes]
    joint, h, g = _gelu_then_product("cuda:0")
    p = partition(joint, "min-cut")
    assert h in {v.name for v in p.saved} and g not in {v.name for v in p.saved}
    assert "gelu" in [n.op for n in p.backward.nodes]
