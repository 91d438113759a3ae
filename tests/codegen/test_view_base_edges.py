"""A reshape of an inline pointwise value that an extern reads (``plait.codegen.view_base``):
the value is materialized in the open kernel and the reshape read as a contiguous view of it.

The edges: a kernel member before it that already computed the value inline (a graph output of
the same shape, a flipped read), non-contiguous inputs to the pointwise chain (transposed,
permuted, expanded, sliced with a step), the reshape itself a graph output, two reshapes of one
value feeding two externs, an integer index reshaped for an embedding, symbolic sizes, and
training (a GPT-2 style ``Conv1D``: ``addmm`` of a reshaped input). Each is judged against eager
by the gate on fresh draws, on the C++ target and, where noted, on Triton (interpreted on CPU
tensors) and in bfloat16.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
import plait.conformance
from plait.codegen import plan_graph
from plait.codegen.plan import KernelStep, Plan
from plait.ir import GraphBuilder, TensorType
from plait.ir.graph import Value
from tests.conformance.models import randn, seeded

Program = Callable[..., Any]


# --- a kernel member that computed the value inline before the reshape materializes it -------


def _shared_output(a: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a + 1`` is cheap (inlined into ``m``, a graph output of its shape) and then reshaped
    for a matmul: materialized after ``m`` joined the open kernel."""
    x = a + 1.0
    return x * 2.0, x.reshape(-1, a.shape[-1]) @ w


def _flipped_member(a: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As above, the earlier member reading the value at another index (flipped)."""
    x = a + 1.0
    return x.flip(0) * 2.0, x.reshape(-1, a.shape[-1]) @ w


def _costly_member(a: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = a + 1.0
    return torch.exp(x) * 2.0, x.reshape(-1, a.shape[-1]) @ w


READ_BEFORE = {"shared_output": _shared_output, "flipped_member": _flipped_member,
               "costly_member": _costly_member}  # fmt: skip


def _graph(member: str) -> tuple[GraphBuilder, Value]:
    gb = GraphBuilder()
    a = gb.input("a", TensorType((2, 16, 8), torch.float32))
    w = gb.input("w", TensorType((8, 4), torch.float32))
    x = gb.call("add", a, 1.0)
    if member == "flipped_member":
        m = gb.call("mul", gb.call("flip", x, dims=(0,)), 2.0)
    elif member == "costly_member":
        m = gb.call("mul", gb.call("exp", x), 2.0)
    else:
        m = gb.call("mul", x, 2.0)
    flat = gb.call("reshape", x, shape=(32, 8))
    gb.output(m, gb.call("matmul", flat, w))
    return gb, flat


def _kernels_reading_their_own_stores(plan: Plan) -> list[str]:
    """Kernels that load a buffer they also store: within one loop nest a load before the
    store reads what the buffer held before the kernel ran."""
    found = []
    for step in plan.steps:
        if not isinstance(step, KernelStep):
            continue
        kernel = step.lowered.kernel
        pairs = list(zip(step.lowered.bindings, kernel.buffers))
        written = {id(v) for v, b in pairs if b.output}
        found += [
            f"{kernel.name} reads %{v.name}" for v, b in pairs if not b.output and id(v) in written
        ]
    return found


@pytest.mark.parametrize("member", sorted(READ_BEFORE))
def test_no_kernel_reads_the_buffer_it_writes(member: str) -> None:
    gb, flat = _graph(member)
    plan = plan_graph(gb.build())
    assert _kernels_reading_their_own_stores(plan) == []
    loc = plan.locs[flat]
    assert (loc.kind, loc.offset, loc.strides) == ("view", 0, (8, 1)), loc


@pytest.mark.parametrize(
    "view,attrs",
    [("select", {"dim": 0, "index": 0}), ("slice", {"dim": 0, "start": 0, "end": 1}),
     ("chunk", {"chunks": 4, "dim": 0})],
)  # fmt: skip
def test_a_view_of_part_of_a_value_computes_that_part_only(
    view: str, attrs: dict[str, Any]
) -> None:
    """``tanh(a)[0] @ w``: the view is contiguous at offset 0 but holds a 64th of ``tanh(a)``;
    materializing its base would compute all of it for the matmul's one row block."""
    gb = GraphBuilder()
    a = gb.input("a", TensorType((64, 16, 8), torch.float32))
    w = gb.input("w", TensorType((8, 4), torch.float32))
    part = gb.call(view, gb.call("tanh", a), **attrs)
    if isinstance(part, tuple):
        part = part[0]
    gb.output(gb.call("matmul", part, w))
    plan = plan_graph(gb.build())
    stored = [_numel(v) for s in plan.steps if isinstance(s, KernelStep) for v in s.outputs]
    assert stored == [_numel(part)], stored


def _numel(v: Value) -> object:
    assert isinstance(v.type, TensorType)
    return v.type.numel


def _inputs(dtype: torch.dtype, *shapes: tuple[int, ...]) -> Callable[[int], tuple[Any, ...]]:
    def make(seed: int) -> tuple[Any, ...]:
        return tuple(randn(*s, seed=seed * 10 + i).to(dtype) for i, s in enumerate(shapes))

    return make


def _check(fn: Program, inputs: Callable[[int], tuple[Any, ...]], target: str = "cpu",
           **compile_options: Any) -> plait.conformance.Report:  # fmt: skip
    options = {"cache": False, "stax": {"target": target}}
    compiled = plait.compile(fn, backend="stax", options=options, **compile_options)
    compiled(*inputs(1000))  # NOTE: a user call: the gate judges the specialization it made
    return plait.conformance.check(fn, compiled, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("target", ["cpu", "triton"])
@pytest.mark.parametrize("name", sorted(READ_BEFORE))
def test_a_value_read_before_its_reshape_matches_eager(
    name: str, target: str, dtype: torch.dtype
) -> None:
    report = _check(READ_BEFORE[name], _inputs(dtype, (2, 16, 8), (8, 4)), target)
    assert report.ok, str(report)


def test_a_value_read_before_its_reshape_matches_eager_with_symbolic_sizes() -> None:
    report = _check(_shared_output, _inputs(torch.float32, (3, 16, 8), (8, 4)), dynamic=True)
    assert report.ok, str(report)


# --- edges that hold ---------------------------------------------------------------------------

_E = randn(40, 6, seed=7)

HOLDING: dict[str, tuple[Program, tuple[tuple[int, ...], ...]]] = {
    "transposed_input": (lambda a, w: (a.transpose(0, 1) * 3.0 + 1).reshape(-1, 8) @ w,
                         ((16, 2, 8), (8, 4))),
    "permuted_input": (lambda a, w: torch.tanh(a.permute(2, 0, 1)).reshape(8, -1).T @ w,
                       ((2, 4, 8), (8, 4))),
    "expanded_input": (lambda a, w: torch.sigmoid(a.expand(3, 16, 8)).reshape(-1, 8) @ w,
                       ((1, 16, 8), (8, 4))),
    "step_sliced_input": (lambda a, w: torch.exp(a[:, ::2]).reshape(-1, 8) @ w,
                          ((4, 16, 8), (8, 4))),
    "reshape_is_an_output": (lambda a, w: (torch.tanh(a).reshape(-1, 8),
                                           torch.tanh(a).reshape(-1, 8) @ w), ((2, 16, 8), (8, 4))),
    "two_reshapes_two_externs": (lambda a, w: (torch.tanh(a).reshape(-1, 8) @ w,
                                               torch.tanh(a).flatten(1) @ w.repeat(16, 1)),
                                 ((2, 16, 8), (8, 4))),
    "also_reduced": (lambda a, w: (torch.tanh(a) * a).reshape(-1, 8) @ w
                     + (torch.tanh(a) * a).sum(), ((2, 16, 8), (8, 4))),
    "read_after_by_a_kernel": (lambda a, w: ((a * 2 + 1).reshape(-1, 8) @ w,
                                             ((a * 2 + 1) * (a * 2 + 1)).sum(-1)),
                               ((2, 16, 8), (8, 4))),
    "unflatten_bmm": (lambda a, w: torch.bmm(torch.relu(a).unflatten(0, (2, 16)),
                                             w.expand(2, 8, 4)), ((32, 8), (8, 4))),
    "reshaped_for_a_conv": (lambda a, w: F.conv2d(torch.relu(a).reshape(2, 3, 8, 8),
                                                  w.reshape(4, 3, 3, 3)), ((2, 192), (4, 27))),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOLDING))
def test_non_contiguous_and_shared_reshapes_match_eager(name: str) -> None:
    fn, shapes = HOLDING[name]
    report = _check(fn, _inputs(torch.float32, *shapes))
    assert report.ok, str(report)


def test_an_integer_index_reshaped_for_an_embedding_matches_eager() -> None:
    def fn(i: torch.Tensor) -> torch.Tensor:
        return F.embedding((i * 3 + 1).reshape(-1), _E)

    def inputs(seed: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(seed)),)

    report = _check(fn, inputs)
    assert report.ok, str(report)


class _Conv1D(nn.Module):
    """GPT-2's Conv1D: ``addmm`` of the input reshaped to a matrix."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], self.weight.shape[-1])


class _GPTMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc, self.c_proj = _Conv1D(32, 8), _Conv1D(8, 32)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.gelu(self.c_fc(x.transpose(0, 1)), approximate="tanh")
        return self.c_proj(h), h * 0.5


@pytest.mark.parametrize("target", ["cpu", "triton"])
def test_training_through_a_reshaped_activation_matches_eager(target: str) -> None:
    model = seeded(1, _GPTMLP)
    options = {"cache": False, "stax": {"target": target}}
    compiled = plait.compile(copy.deepcopy(model), backend="stax", options=options)
    report = plait.conformance.check(
        model, compiled, lambda s: randn(6, 2, 8, seed=s), grads=True, draws=2
    )
    assert report.ok, str(report)
