"""Helpers for the Stax tests: graphs from op-database samples, fresh input factories, the
float64 anchor, the op classes the contract judges each op by, a shared kernel cache, and one
batched build for the graphs that several test modules compile by the thousand."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from plait.ir import Graph, GraphBuilder, TensorType
from plait.ir.graph import Value
from plait.ir.ops import get_op
from plait.runtime import StaxOptions, StaxProgram, compile_graphs
from tests.ir.opdb import Sample

# NOTE: ops whose CPU candidate is plait's Triton kernel (interpreted) standing in for CUDA's:
# its algebra is CUDA eager's, ``(x - mean) * (rstd * w) + b``, whose NaN positions differ from
# ATen's CPU kernel (``x * alpha + beta``) at an infinite weight, and so is its batch mean of an
# infinity (NaN unless CUDA's Welford thread reads it last; CPU's is ``sum / n``, +-inf): no
# special-values draw (tests/codegen/test_cuda_batch_norm_special_values.py judges them)
TRITON_STAND_INS = frozenset({"batch_norm_relu", "batch_norm_relu_backward"})

# NOTE: test data, not compiler code: which contract row judges each op when compiled alone.
NORMALIZATION = {"softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "logsumexp",
                 "batch_norm_relu", "batch_norm_relu_backward"}  # fmt: skip
REDUCTION = {"sum", "mean", "amax", "amin", "var", "batch_norm_train", "avg_pool2d", "cumsum",
             "adaptive_avg_pool2d", "all", "any", "count_nonzero", "nansum", "prod"}  # fmt: skip
MATMUL = {"linear", "matmul", "bmm"}


def op_class(op: str) -> str:
    if op in NORMALIZATION:
        return "normalization"
    if op in REDUCTION:
        return "reduction"
    if op in MATMUL:
        return "matmul"
    if op == "conv2d":
        return "conv"
    if op == "scaled_dot_product_attention":
        return "attention"
    category = get_op(op).category.value
    return "pointwise" if category == "pointwise" else "data_movement"


def graph_of(sample: Sample) -> tuple[Graph, list[torch.Tensor]]:
    """A one-node graph computing ``sample`` and the tensors to feed it (in input order)."""
    gb = GraphBuilder()
    tensors: list[torch.Tensor] = []

    def arg(a: Any, name: str) -> Any:
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            return gb.input(name, TensorType.of(a))
        return a

    args: list[Any] = []
    for i, a in enumerate(sample.args):
        if isinstance(a, list):
            args.append([arg(t, f"x{i}_{j}") for j, t in enumerate(a)])
        else:
            args.append(arg(a, f"x{i}"))
    out = gb.call(sample.op, *args, **sample.attrs)
    gb.output(*(out if isinstance(out, tuple) else (out,)))
    return gb.build(), tensors


def redraw(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A fresh tensor like ``t``: shape, dtype, layout, value range and sign."""
    shape = tuple(t.shape)
    if t.dtype == torch.bool:
        out = torch.rand(shape, generator=gen) > 0.5
    elif not t.dtype.is_floating_point:
        lo = int(t.min()) if t.numel() else 0
        hi = int(t.max()) if t.numel() else 1
        out = torch.randint(lo, hi + 1, shape, generator=gen).to(t.dtype)
    else:
        finite = t.double()[t.double().isfinite()] if t.numel() else t.double()
        lo = float(finite.min()) if finite.numel() else -1.0
        hi = float(finite.max()) if finite.numel() else 1.0
        if hi - lo < 1e-3:
            lo, hi = (lo, lo + 1.0) if lo > 0 else (lo - 1.0, hi + 1.0)
        u = torch.rand(shape, generator=gen, dtype=torch.float64)
        out = (lo + (hi - lo) * u).to(t.dtype)
    if (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    ):
        return out.contiguous(memory_format=torch.channels_last)
    return out


def factory(tensors: Sequence[torch.Tensor]) -> Callable[[int], tuple[torch.Tensor, ...]]:
    def make(seed: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        return tuple(redraw(t, gen) for t in tensors)

    return make


def evaluate64(graph: Graph) -> Callable[..., list[Any]]:
    """The graph evaluated by each op's reference implementation on float64 copies of the float
    inputs (the gate's anchor); no type checks, so wider dtypes flow through."""

    def run(*inputs: Any) -> list[Any]:
        env: dict[int, Any] = {}
        for v, x in zip(graph.inputs, inputs):
            env[id(v)] = x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for node in graph.nodes:
            args = [env[id(o)] if isinstance(o, Value) else o for o in node.inputs]
            attrs = dict(node.attrs)
            if isinstance(attrs.get("dtype"), torch.dtype) and attrs["dtype"].is_floating_point:
                attrs["dtype"] = torch.float64
            for v, r in zip(node.outputs, get_op(node.op).run(args, attrs)):
                env[id(v)] = r
        return [env[id(o)] if isinstance(o, Value) else o for o in graph.outputs]

    return run


def has_4d_float(tensors: Sequence[torch.Tensor]) -> bool:
    return any(t.dim() == 4 and t.is_floating_point() for t in tensors)


@pytest.fixture(scope="session")
def stax_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One kernel cache for the session (shared by xdist workers), never the user's."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "stax-kernels"
    path.mkdir(exist_ok=True)
    old = os.environ.get("PLAIT_CACHE_DIR")
    os.environ["PLAIT_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("PLAIT_CACHE_DIR", None)
    else:
        os.environ["PLAIT_CACHE_DIR"] = old


# NOTE: the op database's samples (tests/codegen/test_opdb.py) and their special-value variants
# (test_special_values.py) are the same one-node graphs for the most part: built in one
# compile_graphs call, a kernel two lists share is compiled once (each list alone built about
# 2000 kernels the other list also builds). The tests that read the batch share an xdist group.
BATCH_GROUP = "stax-opdb-batch"
_BATCH: dict[str, Callable[[], list[tuple[Graph, Any]]]] = {}

Batch = dict[str, list[tuple[Any, Graph, StaxProgram]]]


def compile_in_batch(name: str, items: Callable[[], list[tuple[Graph, Any]]]) -> None:
    """Add the list ``items()`` (graphs, each with what its tests need) to the session's batched
    build under ``name``; :func:`stax_batch` builds every list added by the test modules
    collected, together, on first use."""
    _BATCH[name] = items


@pytest.fixture(scope="session")
def stax_batch(stax_cache: Path) -> Batch:
    """Per name given to :func:`compile_in_batch`: (payload, graph, program) per item."""
    lists = {name: make() for name, make in _BATCH.items()}
    graphs = [g for items in lists.values() for g, _ in items]
    programs = iter(compile_graphs(graphs, options=StaxOptions(kernels_per_unit=400)))
    return {
        name: [(payload, g, next(programs)) for g, payload in items]
        for name, items in lists.items()
    }
