"""Random valid graphs for property tests, and hand-built graphs for golden tests."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from plait.ir import Graph, GraphBuilder, TensorType, Value
from plait.symbolic import symbol

UNARY = ["relu", "exp", "tanh", "sigmoid", "neg", "abs"]
BINARY = ["add", "mul", "sub", "maximum"]


@st.composite
def graphs(draw: st.DrawFn, allow_random: bool = True) -> Graph:
    """A random valid graph: every shape broadcasts to (a, b); no two nodes compute the same
    expression (duplicates are CSE's business and would make structural checks ambiguous)."""
    a, b = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    shapes = [(a, b), (b,), (a, 1)]
    builder = GraphBuilder()
    values: list[Value] = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["user", "user", "param", "buffer"]))
        name = f"x{i}" if kind == "user" else f"m.w{i}"
        values.append(builder.input(name, TensorType(draw(st.sampled_from(shapes)), dtype), kind))
    seen: set[Any] = set()
    for _ in range(draw(st.integers(1, 8))):
        choice = draw(
            st.sampled_from(
                ["unary", "binary", "scalar", "reduce", "softmax", "dropout"]
                if allow_random
                else ["unary", "binary", "scalar", "reduce", "softmax"]
            )
        )
        x = draw(st.sampled_from(values))
        if choice == "unary":
            op, args, attrs = draw(st.sampled_from(UNARY)), (x,), {}
        elif choice == "binary":
            op, args, attrs = draw(st.sampled_from(BINARY)), (x, draw(st.sampled_from(values))), {}
        elif choice == "scalar":
            op = draw(st.sampled_from(["add", "mul"]))
            args, attrs = (x, draw(st.sampled_from([0.5, 2.0, -1.0, 3]))), {}
        elif choice == "reduce":
            op, args = draw(st.sampled_from(["sum", "amax", "mean"])), (x,)
            attrs = {"dims": (-1,), "keepdim": True}
        elif choice == "softmax":
            op, args, attrs = "softmax", (x,), {"dim": -1}
        else:
            op, args, attrs = "dropout", (x,), {"p": 0.5, "train": True}
        key = (
            op,
            tuple(id(v) if isinstance(v, Value) else repr(v) for v in args),
            tuple(sorted(attrs.items())),
        )
        if key in seen and op != "dropout":
            continue
        seen.add(key)
        values.append(builder.call(op, *args, **attrs))
    n_out = draw(st.integers(1, min(2, len(values))))
    builder.output(*values[-n_out:])
    return builder.build()


def resnet_block() -> Graph:
    """conv-bn-relu-conv-bn + identity, relu: the shape of a ResNet basic block (inference)."""
    b = GraphBuilder()
    f32 = torch.float32
    x = b.input("x", TensorType((2, 8, 16, 16), f32))
    params = {}
    for i in (1, 2):
        params[f"conv{i}.weight"] = b.param(f"conv{i}.weight", TensorType((8, 8, 3, 3), f32))
        for n in ("weight", "bias"):
            params[f"bn{i}.{n}"] = b.param(f"bn{i}.{n}", TensorType((8,), f32))
        for n in ("running_mean", "running_var"):
            params[f"bn{i}.{n}"] = b.buffer(f"bn{i}.{n}", TensorType((8,), f32))
    h: Any = x
    for i in (1, 2):
        h = b.call("conv2d", h, params[f"conv{i}.weight"], None, padding=(1, 1))
        h = b.call(
            "batch_norm",
            h,
            *(params[f"bn{i}.{n}"] for n in ("weight", "bias", "running_mean", "running_var")),
        )
        if i == 1:
            h = b.call("relu", h)
    b.output(b.call("relu", b.call("add", h, x)))
    return b.build()


def causal_attention() -> Graph:
    """Explicit causal attention with a symbolic sequence length."""
    b = GraphBuilder()
    t = symbol("s0")
    q = b.input("q", TensorType((1, 4, t, 16), torch.float32))
    k = b.input("k", TensorType((1, 4, t, 16), torch.float32))
    v = b.input("v", TensorType((1, 4, t, 16), torch.float32))
    mask = b.input("mask", TensorType((t, t), torch.bool))
    scores = b.call("mul", b.call("matmul", q, b.call("transpose", k, dim0=-2, dim1=-1)), 0.25)
    scores = b.call("where", mask, scores, float("-inf"))
    probs = b.call("softmax", scores, dim=-1)
    out = b.call("matmul", probs, v)
    b.output(b.call("reshape", b.call("permute", out, dims=(0, 2, 1, 3)), shape=(1, t, 64)))
    return b.build()


def multi_output() -> Graph:
    b = GraphBuilder()
    x = b.input("x", TensorType((6, 4), torch.bfloat16))
    parts = b.call("split", x, sizes=(2, 4), dim=0)
    first = b.call("to_dtype", parts[0], dtype=torch.float32)
    b.output(
        b.call("cat", [first, b.call("to_dtype", parts[1], dtype=torch.float32)], dim=0),
        b.call("var", first, dims=(1,), correction=0),
    )
    return b.build()


GOLDEN = {
    "resnet_block": resnet_block,
    "causal_attention": causal_attention,
    "multi_output": multi_output,
}
