"""A compiled backward split at bucket boundaries (one process, no DDP): the same gradients bit
for bit as the whole backward, released bucket by bucket, with autograd's semantics kept."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.distributed import ReleasedBackward, bucket_plan
from plait.distributed.buckets import release_order
from plait.runtime.training import TrainingProgram
from tests.util import assert_bitwise


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(),
        nn.Linear(64, 8),
    ).train()  # fmt: skip


def _compiled() -> tuple[Any, TrainingProgram]:
    compiled = plait.compile(_model(), backend="stax", options={"cache": False})
    compiled(torch.randn(8, 16)).sum().backward()
    training = compiled.specializations[0].compiled.program
    assert isinstance(training, TrainingProgram)
    return compiled, training


def _split(compiled: Any, training: TrainingProgram, cap: int = 1024) -> ReleasedBackward:
    """Buckets of ``cap`` bytes over the program's parameters; the released backward."""
    names = [training.graph.inputs[i].name for i in training.run.grads]
    tensors = dict(compiled.named_parameters())
    plan = bucket_plan(training.graph, names, tensors, caps=(cap, cap))
    return ReleasedBackward.of(training, plan)


def _grads(compiled: Any, x: torch.Tensor) -> dict[str, torch.Tensor]:
    compiled.zero_grad(set_to_none=True)
    compiled(x).square().sum().backward()
    return {n: p.grad.clone() for n, p in compiled.named_parameters()}


def test_split_gradients_are_the_whole_backwards_bit_for_bit() -> None:
    compiled, training = _compiled()
    x = torch.randn(8, 16)
    whole = _grads(compiled, x)
    released = _split(compiled, training)
    assert len(released.segments) >= 3
    training.run = released
    split = _grads(compiled, x)
    for name in whole:
        assert_bitwise(split[name], whole[name], name)


def test_gradients_arrive_bucket_by_bucket() -> None:
    compiled, training = _compiled()
    released = _split(compiled, training)
    training.run = released
    arrived: list[str] = []
    for name, p in compiled.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _, n=name: arrived.append(n))
    compiled(torch.randn(8, 16)).sum().backward()
    buckets = [set(s.grads) for s in released.segments]
    position = {n: k for k, b in enumerate(buckets) for n in b}
    assert sorted(arrived) == sorted(position)
    assert [position[n] for n in arrived] == sorted(position[n] for n in arrived)


def test_autograd_semantics_are_kept() -> None:
    compiled, training = _compiled()
    training.run = _split(compiled, training)
    x = torch.randn(8, 16)
    whole = _grads(compiled, x)
    compiled.zero_grad(set_to_none=True)
    loss = compiled(x).square().sum()
    loss.backward(retain_graph=True)
    loss.backward()  # NOTE: a second backward of the same graph accumulates the same again
    for name, p in compiled.named_parameters():
        assert_bitwise(p.grad, 2 * whole[name], name)
    last = compiled[0].weight  # NOTE: released by the last segment
    (only,) = torch.autograd.grad(compiled(x).square().sum(), [last])
    assert_bitwise(only, whole["0.weight"], "0.weight")
    out = compiled(x).square().sum()
    with torch.no_grad():
        compiled[5].weight.add_(1.0)  # NOTE: a saved value written before the backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_release_order_is_latest_first_use_first() -> None:
    _, training = _compiled()
    names = [training.graph.inputs[i].name for i in training.run.grads]
    order = release_order(training.graph, names)
    assert order[:2] == ["5.bias", "5.weight"]  # NOTE: one node reads both: smaller first
    assert order[-2:] == ["0.bias", "0.weight"]
