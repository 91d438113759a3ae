"""Fused chains compiled by Stax and judged by the conformance gate (op class "model": a chain is
a whole program; the gate's float64-anchored rule applies to 16-bit chains).

Chains mix pointwise ops, broadcasting, views inside kernels (permute, reshape, slice, expand,
select, cat), reductions with inlined producers, integers that wrap, size-0 and size-1 dims,
and 4-D inputs checked in channels_last as well.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import plait.conformance
from plait.ir import Graph, GraphBuilder, TensorType, interpret
from plait.runtime import compile_graphs
from tests.codegen.stax_helpers import evaluate64, has_4d_float

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
Builder = Callable[[torch.dtype], tuple[Graph, tuple[torch.Tensor, ...]]]


def _inputs(gb: GraphBuilder, *specs: tuple[str, tuple[int, ...], torch.dtype]) -> list[Any]:
    return [gb.input(n, TensorType(s, d)) for n, s, d in specs]


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, positive: bool = False) -> Any:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        return (t.abs() + 0.1 if positive else t).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    lo = 1 if positive else -50
    return torch.randint(lo, 50, shape, generator=g).to(dtype)


def unary_binary(dtype: torch.dtype) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    gb = GraphBuilder()
    x, y = _inputs(gb, ("x", (5, 7, 9), dtype), ("y", (7, 1), dtype))
    a = gb.call("mul", gb.call("add", x, y), 1.5)
    b = gb.call("tanh", gb.call("sub", gb.call("exp", gb.call("neg", gb.call("abs", a))), 0.25))
    c = gb.call("where", gb.call("gt", a, y), b, gb.call("sigmoid", a))
    d = gb.call("clamp", gb.call("relu", gb.call("div", c, gb.call("add", y, 3.0))), max=0.6)
    e = gb.call(
        "gelu",
        gb.call(
            "silu",
            gb.call("maximum", d, gb.call("rsqrt", gb.call("add", gb.call("mul", x, x), 1.0))),
        ),
    )
    gb.output(
        gb.call("pow", e, 2),
        gb.call("erf", gb.call("log", gb.call("add", gb.call("sqrt", gb.call("abs", x)), 1.0))),
    )
    return gb.build(), (_rand((5, 7, 9), dtype, 1), _rand((7, 1), dtype, 2))


def views_in_kernels(dtype: torch.dtype) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    gb = GraphBuilder()
    x, y = _inputs(gb, ("x", (4, 6, 5), dtype), ("y", (5, 4), dtype))
    p = gb.call("permute", gb.call("exp", x), dims=(2, 0, 1))  # (5, 4, 6), computed then viewed
    q = gb.call("add", p, gb.call("unsqueeze", y, dim=-1))
    r = gb.call("reshape", q, shape=(20, 6))
    s = gb.call("slice", r, dim=0, start=3, end=17, step=2)  # (7, 6)
    t = gb.call(
        "mul", gb.call("expand", gb.call("select", x, dim=1, index=2), shape=(3, 4, 5)), 0.5
    )
    u = gb.call(
        "cat",
        [
            gb.call("tanh", s),
            gb.call("transpose", gb.call("slice", r, dim=0, end=6), dim0=0, dim1=1),
        ],
        dim=0,
    )
    gb.output(
        s, gb.call("reshape", t, shape=(60,)), u, gb.call("stack", [x, gb.call("neg", x)], dim=1)
    )
    return gb.build(), (_rand((4, 6, 5), dtype, 3), _rand((5, 4), dtype, 4))


def reductions_fused(dtype: torch.dtype) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    gb = GraphBuilder()
    x, r = _inputs(gb, ("x", (3, 8, 33), dtype), ("res", (3, 8, 33), dtype))
    w, b, m = _inputs(gb, ("w", (33,), dtype), ("b", (33,), dtype), ("m", (8, 33), dtype))
    h = gb.call("add", x, r)
    ln = gb.call("layer_norm", h, w, b, normalized_shape=(33,), eps=1e-5)
    sm = gb.call("softmax", gb.call("add", gb.call("mul", h, 0.125), m), dim=-1)
    lsm = gb.call("log_softmax", gb.call("permute", h, dims=(0, 2, 1)), dim=1)
    s = gb.call("sum", gb.call("exp", gb.call("mul", x, 0.5)), dims=(-1,), keepdim=True)
    v = gb.call("var", gb.call("sub", x, 1.0), dims=(0, 2), correction=1)
    mx = gb.call("amax", gb.call("abs", h), dims=(1,))
    e = gb.call("div", gb.call("exp", gb.call("mul", x, 0.5)), s)
    mean = gb.call("mean", gb.call("transpose", x, dim0=0, dim1=2), dims=(0, 1))
    gb.output(h, gb.call("relu", ln), sm, lsm, e, v, mx, mean)
    ins = (_rand((3, 8, 33), dtype, 5), _rand((3, 8, 33), dtype, 6), _rand((33,), dtype, 7),
           _rand((33,), dtype, 8), _rand((8, 33), dtype, 9))  # fmt: skip
    return gb.build(), ins


def conv_epilogue_layout(dtype: torch.dtype) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    """A conv's epilogue (batch norm, residual add, relu) on 4-D tensors, run in both layouts."""
    gb = GraphBuilder()
    x, w, res = _inputs(gb, ("x", (2, 4, 9, 7), dtype), ("w", (6, 4, 3, 3), dtype),
                        ("res", (2, 6, 9, 7), dtype))  # fmt: skip
    g, bb, rm, rv = _inputs(gb, *[(n, (6,), dtype) for n in ("g", "bb", "rm", "rv")])
    y = gb.call("conv2d", x, w, None, padding=(1, 1))
    y = gb.call("batch_norm", y, g, bb, rm, rv, eps=1e-5)
    y = gb.call("relu", gb.call("add", y, res))
    z = gb.call("group_norm", y, g, bb, num_groups=3)
    gb.output(y, gb.call("mean", z, dims=(2, 3)))
    ins = (_rand((2, 4, 9, 7), dtype, 10), _rand((6, 4, 3, 3), dtype, 11),
           _rand((2, 6, 9, 7), dtype, 12), _rand((6,), dtype, 13), _rand((6,), dtype, 14),
           _rand((6,), dtype, 15), _rand((6,), dtype, 16, positive=True))  # fmt: skip
    return gb.build(), ins


def integers(dtype: torch.dtype) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    gb = GraphBuilder()
    x, y = _inputs(gb, ("x", (6, 11), dtype), ("y", (11,), dtype))
    a = gb.call("mul", gb.call("add", x, y), 7)  # wraps in narrow integer types
    b = gb.call(
        "div", a, gb.call("abs", gb.call("add", gb.call("abs", y), 1)), rounding_mode="floor"
    )
    c = gb.call("maximum", gb.call("mul", b, 3), gb.call("sub", x, y))
    f = gb.call("mul", gb.call("to_dtype", c, dtype=torch.float32), 0.5)
    gb.output(c, f, gb.call("sum", c, dims=(0,)), gb.call("amin", a, dims=(1,), keepdim=True),
              gb.call("logical_and", gb.call("gt", a, 0), gb.call("ne", b, 1)))  # fmt: skip
    return gb.build(), (_rand((6, 11), dtype, 17), _rand((11,), dtype, 18))


def edge_sizes(dtype: torch.dtype) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    gb = GraphBuilder()
    x, z, s = _inputs(gb, ("x", (1, 5, 1), dtype), ("z", (0, 5), dtype), ("s", (), dtype))
    a = gb.call("add", gb.call("mul", x, s), 2.0)
    sq = gb.call("squeeze", x, dims=(0, 2))
    total = gb.call("sum", gb.call("add", z, 1.0), dims=(0,))
    gb.output(
        gb.call("exp", a),
        total,
        gb.call("mean", z, dims=(0,)),
        gb.call("softmax", a, dim=0),
        gb.call("add", z, sq),
        gb.call("mul", s, s),
    )
    return gb.build(), (_rand((1, 5, 1), dtype, 19), _rand((0, 5), dtype, 20), _rand((), dtype, 21))


FLOAT_CHAINS: dict[str, Builder] = {
    "unary_binary": unary_binary,
    "views_in_kernels": views_in_kernels,
    "reductions_fused": reductions_fused,
    "conv_epilogue_layout": conv_epilogue_layout,
    "edge_sizes": edge_sizes,
}
CASES = [(n, d) for n in FLOAT_CHAINS for d in FLOATS]
CASES += [("integers", d) for d in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)]
BUILDERS: dict[str, Builder] = {**FLOAT_CHAINS, "integers": integers}


@pytest.fixture(scope="module")
def compiled(stax_cache: Path) -> dict[tuple[str, torch.dtype], Any]:
    built = {case: BUILDERS[case[0]](case[1]) for case in CASES}
    programs = compile_graphs([g for g, _ in built.values()])
    return {case: (g, ins, p) for (case, (g, ins)), p in zip(built.items(), programs)}


@pytest.mark.xdist_group("stax-chains")
@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_chain_conforms(compiled: dict, name: str, dtype: torch.dtype) -> None:
    graph, inputs, program = compiled[(name, dtype)]
    assert program.evidence.counts["fallback"] == 0
    report = plait.conformance.check(
        lambda *xs: interpret(graph, xs),
        program,
        inputs,
        op_class="model",
        reference64=evaluate64(graph),
        layouts=("contiguous", "channels_last") if has_4d_float(inputs) else ("contiguous",),
        draws=2,
    )
    assert report.ok, str(report)


@pytest.mark.xdist_group("stax-chains")
def test_chains_fuse(compiled: dict) -> None:
    """The pointwise chain is one kernel; views of computed values cost no kernel of their own."""
    _, _, program = compiled[("unary_binary", torch.float32)]
    assert len(program.kernels) <= 2  # two outputs of one shape: one loop nest, or two
    covered = {n for k in program.kernels for n in k.nodes}
    assert covered == {n.id for n in program.graph.nodes}


def _spread(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (every other element of a wider buffer)."""
    if t.dim() == 0 or t.numel() == 0:
        return t
    wide = torch.zeros((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype)
    out = wide[..., ::2]
    out.copy_(t)
    return out


@pytest.mark.xdist_group("stax-chains")
@pytest.mark.parametrize(
    ("name", "dtype"), CASES[::3], ids=[f"{n}-{str(d)[6:]}" for n, d in CASES[::3]]
)
def test_chain_noncontiguous_inputs_bitwise(compiled: dict, name: str, dtype: torch.dtype) -> None:
    """Strided and channels_last inputs give the bits their contiguous copies give (externs
    aside, which receive the caller's layout)."""
    from tests.util import assert_bitwise

    _, inputs, program = compiled[(name, dtype)]
    if program.evidence.counts["extern"]:
        pytest.skip("externs compute in the layout they are given")
    want = program(*inputs)
    for layout in (
        _spread,
        lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t,
    ):
        got = program(*[layout(t) for t in inputs])
        for a, b in zip(got, want):
            assert_bitwise(a, b, f"{name} {dtype}")
