"""A training batch norm's normalized result recomputed in the backward
(:mod:`plait.autograd.renormalize`): on the Triton target the min-cut saves the batch norm's
input and statistics (the batch-norm backward reads them) and no longer the ReLU's result
after it, the next convolution's input; the forward graph stays as it was; gradients match
eager's on fresh inputs (Triton's interpreter on CPU tensors runs plait's batch-norm kernels, as
on CUDA); the partition's properties hold; the CPU target keeps saving the ReLU's result."""

from __future__ import annotations

import copy
import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

from typing import Any

import torch
from torch import nn

import plait
from plait.autograd import CompiledAutograd, build_joint, partition
from plait.autograd.joint import Joint, prepare_for_autograd
from plait.autograd.partition import value_bytes
from plait.frontend import capture_program
from plait.ir.interpret import interpret
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.util import contract_tol

TRITON = {"stax": {"target": "triton"}, "cache": False}


class _Chain(nn.Module):
    """conv -> BatchNorm2d -> ReLU -> conv: the second convolution's weight gradient reads the
    ReLU's result."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))))


class _Residual(nn.Module):
    """A ResNet basic block after a stem: batch norms before a ReLU and before a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        y = torch.relu(self.bn1(self.conv1(h)))
        h = torch.relu(self.bn2(self.conv2(y)) + h)
        return self.head(h.mean((2, 3)))


def _draw(seed: int) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, 3, 9, 7, generator=g) * 2 + 0.5,)


def _joint(model: nn.Module) -> Joint:
    graph = capture_program(model.train(), _draw(0)).graph
    assert graph is not None
    wrt = [v.name for v in graph.inputs if v.kind == "param"]
    # NOTE: the model's output takes a cotangent, the running statistics' updates none
    return build_joint(prepare_for_autograd(graph, set(wrt)), wrt, differentiable_outputs=[0])


def _relu_results(joint: Joint) -> set[str]:
    return {n.outputs[0].name for n in joint.graph.nodes if n.op == "relu"}


def test_min_cut_no_longer_saves_the_relu_after_a_batch_norm() -> None:
    torch.manual_seed(0)
    joint = _joint(_Chain())
    (relu,) = _relu_results(joint)
    before = partition(joint, "min-cut")
    after = partition(joint, "min-cut", renormalize=True)
    assert relu in {v.name for v in before.saved}
    assert relu not in {v.name for v in after.saved}
    relu_bytes = next(value_bytes(v) for v in before.saved if v.name == relu)
    # NOTE: the bias is saved now (8 floats); the ReLU's result no longer
    assert after.saved_bytes <= before.saved_bytes - relu_bytes + 8 * 4
    assert after.saved_bytes < partition(joint, "save-all").saved_bytes
    assert len(after.renormalized) == 1 and not before.renormalized
    # NOTE: the forward computes what it computed: its batch norm's own result, no chain
    assert [n.op for n in after.forward.nodes] == [n.op for n in before.forward.nodes]


def test_partition_properties_hold_with_recomputed_batch_norms() -> None:
    """The backward reads only saved values and cotangents; min-cut saves no more than
    save-all; the interpreted halves' gradients match the joint graph's on fresh inputs."""
    torch.manual_seed(0)
    model = _Residual()
    joint = _joint(model)
    part = partition(joint, "min-cut", renormalize=True)
    assert len(part.renormalized) == 3
    assert not _relu_results(joint) & {v.name for v in part.saved}
    cots = [v.name for v in joint.graph.inputs[joint.n_inputs :]]
    assert [v.name for v in part.backward.inputs] == [v.name for v in part.saved] + cots
    assert part.saved_bytes <= partition(joint, "save-all").saved_bytes
    run = CompiledAutograd.interpreted(
        part,
        n_inputs=joint.n_inputs,
        n_outputs=joint.n_outputs,
        cotangents=joint.cotangents,
        grads=joint.grads,
    )
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    for seed in (1, 2):
        (x,) = _draw(seed)
        inputs = joint.graph.inputs[: joint.n_inputs]
        values = [x if v.name not in state else state[v.name].detach() for v in inputs]
        gen = torch.Generator().manual_seed(seed)
        shape = joint.graph.outputs[0].type.shape  # type: ignore[union-attr]
        cots_in = [torch.randn(shape, generator=gen) for _ in joint.cotangents]
        expected = interpret(joint.graph, [*values, *cots_in])[joint.n_outputs :]
        leaves = [v.clone().requires_grad_(i in joint.grads) for i, v in enumerate(values)]
        outs = run(leaves)
        live = [(outs[i], c) for i, c in zip(joint.cotangents, cots_in)]
        wanted = [leaves[i] for i in joint.grads]
        got = torch.autograd.grad([o for o, _ in live], wanted, [c for _, c in live])
        for a, e in zip(got, expected, strict=True):
            torch.testing.assert_close(a, e, **contract_tol("normalization", e.dtype))


def _manifest(compiled: Any) -> Any:
    (spec,) = compiled.specializations
    return spec.compiled.manifest


def test_gradients_match_eager_with_the_relu_recomputed_on_the_triton_target() -> None:
    torch.manual_seed(0)
    model = _Residual().train()
    compiled = plait.compile(copy.deepcopy(model), backend="stax", options=TRITON)
    report = plait.conformance.check(model, compiled, _draw, grads=True, draws=3)
    report.raise_if_failed()
    m = _manifest(compiled)
    assert len(m.autograd["renormalized_batch_norms"]) == 3
    assert not {n["name"] for n in m.autograd["saved"]} & _relu_results(_joint(model))
    fired = {
        half: [r["rule"] for p in m.autograd["passes"][half] for r in p["rewrites"]]
        for half in ("forward", "backward")
    }
    # NOTE: the forward's batch norm still applies its ReLU as it stores (plait's kernels); the
    # backward masks the gradient by the recomputed ReLU result
    assert fired["forward"].count("fuse-bn-relu.forward") == 2, fired
    assert fired["backward"].count("fuse-bn-relu.backward") == 2, fired


def test_bfloat16_autocast_passes_the_gate_with_the_relu_recomputed() -> None:
    torch.manual_seed(0)
    model = _Chain().train()
    compiled = plait.compile(copy.deepcopy(model), backend="stax", options=TRITON)
    gate_bf16_training(model, compiled, _draw)
    m = _manifest(compiled)
    assert len(m.autograd["renormalized_batch_norms"]) == 1


def test_the_cpu_target_saves_the_relu_result() -> None:
    """On the CPU, ATen's kernel computes the forward's batch norm (another rounding than the
    chain's) and a recomputation costs what the forward paid: the partition is unchanged."""
    torch.manual_seed(0)
    model = _Chain().train()
    compiled = plait.compile(copy.deepcopy(model), backend="stax", options={"cache": False})
    compiled(*_draw(1)).sum().backward()
    m = _manifest(compiled)
    assert m.autograd["renormalized_batch_norms"] == []
    assert _relu_results(_joint(model)) <= {n["name"] for n in m.autograd["saved"]}
