"""Semantic hash: invariant under renaming and under the choice of topological order; changed by
any single mutation of an op, attribute, type, edge or input kind. The verifier rejects the
mutations that break the IR, and any graph it accepts runs with the types it declares."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.ir import (
    Graph,
    GraphBuilder,
    InterpretError,
    TensorType,
    Value,
    VerificationError,
    from_text,
    get_op,
    interpret,
    semantic_hash,
    to_text,
    verify,
    weights_hash,
)
from tests.ir.graphs import UNARY, graphs, resnet_block


def copy(g: Graph) -> Graph:
    return from_text(to_text(g))


def reorder_and_rename(g: Graph, rng: random.Random) -> Graph:
    """Another valid topological order (random ops keep their relative order), new names."""
    g = copy(g)
    placed: set[int] = {id(v) for v in g.inputs}
    remaining = list(g.nodes)
    order = []
    random_nodes = [n for n in g.nodes if get_op(n.op).is_random(n.attrs)]
    while remaining:
        ready = [
            n
            for n in remaining
            if all(id(v) in placed for v in n.input_values())
            and (n not in random_nodes or random_nodes.index(n) == 0)
        ]
        node = rng.choice(ready)
        if node in random_nodes:
            random_nodes.remove(node)
        remaining.remove(node)
        order.append(node)
        placed.update(id(v) for v in node.outputs)
    g.nodes = order
    for i, v in enumerate([*g.inputs, *(o for n in g.nodes for o in n.outputs)]):
        if v.kind in (None, "user"):
            v.name = f"r{rng.randrange(10**6)}_{i}"
    verify(g)
    return g


@settings(max_examples=200)
@given(graphs(), st.integers(0, 2**32 - 1))
def test_hash_invariant_under_renaming_and_order(g: Graph, seed: int) -> None:
    assert semantic_hash(reorder_and_rename(g, random.Random(seed))) == semantic_hash(g)


def _float_nodes(g: Graph) -> list[Any]:
    return [n for n in g.nodes if n.op in UNARY]


def mutate(g: Graph, rng: random.Random) -> tuple[Graph, str] | None:
    """One random single mutation; None when the graph offers no site for the drawn kind."""
    g = copy(g)
    kind = rng.choice(["op", "literal", "attr", "edge", "input_kind", "output_type", "input_type"])
    if kind == "op":
        nodes = _float_nodes(g)
        if not nodes:
            return None
        node = rng.choice(nodes)
        node.op = rng.choice([u for u in UNARY if u != node.op])
    elif kind == "literal":
        nodes = [n for n in g.nodes if any(not isinstance(o, Value) for o in n.inputs)]
        if not nodes:
            return None
        node = rng.choice(nodes)
        node.inputs = tuple(o if isinstance(o, Value) else o + 1 for o in node.inputs)
    elif kind == "attr":
        nodes = [n for n in g.nodes if n.attrs]
        if not nodes:
            return None
        node = rng.choice(nodes)
        key = rng.choice(sorted(node.attrs))
        value = node.attrs[key]
        node.attrs[key] = (
            torch.float64
            if value is None
            else not value
            if isinstance(value, bool)
            else value / 2
            if isinstance(value, float)
            else (0,)
            if isinstance(value, tuple)
            else value - 1
        )
    elif kind == "edge":
        defined = list(g.inputs)
        sites = []
        for n in g.nodes:
            for i, o in enumerate(n.inputs):
                others = [v for v in defined if v is not o]
                if isinstance(o, Value) and others:
                    sites.append((n, i, others))
            defined.extend(n.outputs)
        if not sites:
            return None
        node, i, others = rng.choice(sites)
        inputs = list(node.inputs)
        inputs[i] = rng.choice(others)
        node.inputs = tuple(inputs)
    elif kind == "input_kind":
        v = rng.choice(g.inputs)
        v.kind = rng.choice([k for k in ("user", "param", "buffer", "const") if k != v.kind])
        if v.kind != "user" and not v.name.startswith("m."):
            v.name = "m." + v.name
    elif kind == "output_type":
        node = rng.choice(g.nodes)
        t = node.outputs[0].type
        assert isinstance(t, TensorType)
        other = torch.float64 if t.dtype != torch.float64 else torch.float32
        node.outputs[0].type = t.with_dtype(other)
    else:
        v = rng.choice(g.inputs)
        assert isinstance(v.type, TensorType)
        v.type = v.type.with_shape((*v.type.shape, 1))
    return g, kind


def _runs_as_declared(g: Graph) -> bool:
    inputs = []
    for v in g.inputs:
        assert isinstance(v.type, TensorType)
        inputs.append(
            torch.randn(tuple(int(d) for d in v.type.shape), dtype=torch.float64).to(v.type.dtype)
            + 0.5
        )
    try:
        interpret(g, inputs, check_types=True)
    except (InterpretError, RuntimeError):
        return False
    return True


@settings(max_examples=300)
@given(graphs(), st.integers(0, 2**32 - 1))
def test_single_mutation_changes_hash_and_invalid_ones_are_rejected(g: Graph, seed: int) -> None:
    before = semantic_hash(g)
    result = mutate(g, random.Random(seed))
    if result is None:
        return
    mutated, kind = result
    assert semantic_hash(mutated) != before, kind
    try:
        verify(mutated)
    except VerificationError:
        return
    # accepted by the verifier: it must really be a valid program of the declared types
    assert kind != "output_type", "a wrong output type was accepted"
    assert _runs_as_declared(mutated), f"verifier accepted an invalid graph after {kind} mutation"


def test_random_ops_keep_their_order_in_the_hash() -> None:
    g = from_text("""graph(
  user %x: f32[4]
  user %y: f32[4]
) {
  %a = dropout(%x) : f32[4]
  %b = dropout(%y) : f32[4]
  return %a, %b
}""")
    swapped = copy(g)
    swapped.nodes = swapped.nodes[::-1]
    verify(swapped)
    assert semantic_hash(swapped) != semantic_hash(g)


def test_identical_duplicates_do_not_break_invariance() -> None:
    text = """graph(
  user %x: f32[4]
) {
  %a = relu(%x) : f32[4]
  %b = relu(%x) : f32[4]
  %c = exp(%a) : f32[4]
  %d = exp(%b) : f32[4]
  %e = sub(%c, %d) : f32[4]
  return %e
}"""
    g = from_text(text)
    other = from_text(
        text.replace("%c = exp(%a)", "%c = exp(%b)")
        .replace("%d = exp(%b)", "%d = exp(%a)")
        .replace("sub(%c, %d)", "sub(%d, %c)")
    )
    assert semantic_hash(g) == semantic_hash(other)


def test_param_names_are_part_of_the_program() -> None:
    g = resnet_block()
    renamed = copy(g)
    renamed.input("conv1.weight").name = "conv9.weight"
    assert semantic_hash(renamed) != semantic_hash(g)


@pytest.mark.parametrize("change", ["value", "dtype", "name", "shape"])
def test_weights_hash(change: str) -> None:
    w = {"a": torch.randn(3, 4), "b": torch.randn(2).to(torch.bfloat16)}
    base = weights_hash(w)
    assert weights_hash({"b": w["b"], "a": w["a"].clone()}) == base
    w2 = dict(w)
    if change == "value":
        w2["a"] = w["a"].clone()
        w2["a"][1, 2] += 1
    elif change == "dtype":
        w2["a"] = w["a"].double()
    elif change == "name":
        w2["c"] = w2.pop("a")
    else:
        w2["a"] = w["a"].reshape(4, 3)
    assert weights_hash(w2) != base


def test_hash_does_not_depend_on_memory_addresses() -> None:
    """Identical computations read by different users: the hash is one value, every time."""
    hashes, keep = set(), []
    for _ in range(30):
        b = GraphBuilder()
        x = b.input("x", TensorType((4, 4), torch.float32))
        t1 = b.call("transpose", x, dim0=0, dim1=1)
        t2 = b.call("transpose", x, dim0=0, dim1=1)
        b.output(b.call("add", b.call("matmul", x, t1), b.call("exp", t2)))
        g = b.build()
        keep.append(g)  # NOTE: keep them alive, so new graphs get new addresses
        hashes.add(semantic_hash(g))
        hashes.add(semantic_hash(from_text(to_text(g))))
    assert len(hashes) == 1


def test_weights_hash_is_pinned_and_names_its_algorithm() -> None:
    """A golden value: the same weights give the same text in every process, on every machine
    (little-endian, as the bytes are hashed as stored), equal to the definition spelled out:
    per tensor in name order, its header and the chunked XXH3-128 of its bytes."""
    import xxhash

    from plait.ir.chunked_hash import CHUNK

    w = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.tensor([1, 2])}
    expected = "xxh3-128t:8949c1fc67cf67bd7db10064f743e43a"
    assert weights_hash(w) == expected
    # NOTE: the definition, spelled out: XXH3-128 of each CHUNK of a tensor's bytes, then of
    # their length and those digests; over all, the headers and those tensor digests
    gen = torch.Generator().manual_seed(0)
    big = {"w": torch.randn(3 * CHUNK // 4 + 5, generator=gen), "s": torch.randn(3, generator=gen)}
    top = xxhash.xxh3_128()
    for name in sorted(big):
        data = big[name].numpy().tobytes()
        inner = xxhash.xxh3_128(len(data).to_bytes(8, "little"))
        for at in range(0, len(data), CHUNK):
            inner.update(xxhash.xxh3_128(data[at : at + CHUNK]).digest())
        top.update(f"{name}\x1f{torch.float32}\x1f{tuple(big[name].shape)}\x1e".encode())
        top.update(inner.digest())
    assert weights_hash(big) == "xxh3-128t:" + top.hexdigest()
    assert weights_hash({}) != weights_hash({"e": torch.empty(0)})
