"""The mutant catalogue: deliberately wrong candidates the gate must catch, each a realistic
miscompile written as plain PyTorch (not compiler output, so the gate is tested before the
compiler exists).

Each mutant names the issue item it covers, where the gate must report it (a substring of the
failure's ``where``/``case``) and, where it matters, by which check.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tests.conformance.models import (
    MLP,
    ConvBN,
    ConvPool,
    HalfLinear,
    LastToken,
    LogRelu,
    SoftmaxHead,
    SquareMLP,
    batch_norm_by_hand,
    center,
    randn,
    seeded,
)


@dataclass
class Setup:
    """Arguments for ``plait.conformance.check``: reference, candidate, inputs and options."""

    reference: Callable[..., Any]
    candidate: Callable[..., Any]
    inputs: Any
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mutant:
    name: str
    covers: str
    build: Callable[[], Setup]
    where: str
    check: str | None = None


def _mlp_setup(candidate: Callable[[MLP, torch.Tensor], torch.Tensor], **options: Any) -> Setup:
    model = seeded(1, MLP)
    return Setup(
        model,
        lambda x: candidate(model, x),
        (randn(8, 16, seed=11),),
        {"candidate_module": model, **options},
    )


def _conv_bn(candidate: Callable[[ConvBN, torch.Tensor], torch.Tensor]) -> Setup:
    model = seeded(2, ConvBN)
    return Setup(
        model,
        lambda x: candidate(model, x),
        (randn(4, 3, 8, 8, seed=12),),
        {"candidate_module": model},
    )


def _bn_candidate(eps_scale: float, updates: int = 1):
    def run(m: ConvBN, x: torch.Tensor) -> torch.Tensor:
        h = batch_norm_by_hand(m.bn, m.conv(x), eps=m.bn.eps * eps_scale, updates=updates)
        return m.fc(torch.relu(h).mean(dim=(2, 3)))

    return run


def wrong_reduction_axis() -> Setup:
    return Setup(center, lambda x: x - x.mean(dim=0, keepdim=True), (randn(8, 8, seed=13),))


def transposed_weight() -> Setup:
    model = seeded(3, SquareMLP)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ model.fc1.weight + model.fc1.bias)  # NOTE: should be weight.T
        return model.fc2(h)

    return Setup(model, candidate, (randn(8, 16, seed=14),), {"candidate_module": model})


def leaky_relu() -> Setup:
    return _mlp_setup(lambda m, x: m.fc2(F.leaky_relu(m.fc1(x), negative_slope=1e-5)))


def off_by_one_slice() -> Setup:
    model = seeded(4, LastToken)
    cand = lambda x: model.proj(torch.tanh(x)[:, -2])  # NOTE: the step before the last.
    return Setup(model, cand, (randn(4, 7, 12, seed=15),), {"candidate_module": model})


def float16_accumulation() -> Setup:
    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        h = (x.half() @ m.fc1.weight.half().T).float() + m.fc1.bias
        return m.fc2(torch.relu(h))

    return _mlp_setup(candidate)


def float16_split_k_accumulation() -> Setup:
    model = seeded(5, HalfLinear)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        w = model.fc.weight
        acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float16)
        for k in range(0, x.shape[1], 8):  # NOTE: partial sums rounded to float16 every 8 terms.
            acc = acc + x[:, k : k + 8] @ w[:, k : k + 8].T
        return acc + model.fc.bias

    inputs = (randn(8, 1024, seed=16, dtype=torch.float16),)
    return Setup(model, candidate, inputs, {"candidate_module": model})


def cached_first_call() -> Setup:
    cache: list[torch.Tensor] = []

    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        if not cache:
            cache.append(m(x).detach())
        return cache[0].clone()

    return _mlp_setup(candidate)


def baked_capture_sample() -> Setup:
    example = randn(8, 8, seed=17)
    baked = example.mean(dim=-1, keepdim=True)  # NOTE: constant-folded from the capture sample.
    return Setup(center, lambda x: x - baked, (example,))


def wrong_parameter_gradient() -> Setup:
    class LinearBadBias(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            return x @ w.T + b

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x, w = ctx.saved_tensors
            return g @ w, g.T @ x, g.mean(0)  # NOTE: the bias gradient is a sum, not a mean.

    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        return LinearBadBias.apply(torch.relu(m.fc1(x)), m.fc2.weight, m.fc2.bias)

    return _mlp_setup(candidate, grads=True)


def missing_running_stat_update() -> Setup:
    return _conv_bn(_bn_candidate(1.0, updates=0))


def running_stat_updated_twice() -> Setup:
    return _conv_bn(_bn_candidate(1.0, updates=2))


def bn_epsilon_dropped() -> Setup:
    return _conv_bn(_bn_candidate(0.0))


def bn_epsilon_doubled() -> Setup:
    return _conv_bn(_bn_candidate(2.0))


def channels_last_layout_bug() -> Setup:
    model = seeded(6, ConvPool)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(model.conv(x))
        n, c, hh, ww = h.shape
        # NOTE: reads the storage as if it were NCHW, whatever the strides say.
        flat = h.as_strided((n, c, hh * ww), (c * hh * ww, hh * ww, 1))
        return flat.mean(-1)

    inputs = (randn(2, 3, 6, 6, seed=18),)
    options = {"candidate_module": model, "layouts": ("contiguous", "channels_last")}
    return Setup(model, candidate, inputs, options)


def softmax_without_max() -> Setup:
    model = seeded(7, SoftmaxHead)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(model.fc(x))  # NOTE: no max subtraction: overflows for large logits.
        return e / e.sum(dim=-1, keepdim=True)

    return Setup(model, candidate, (randn(8, 16, seed=19),), {"candidate_module": model})


def race_nondeterminism() -> Setup:
    calls = [0]

    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(m.fc1(x))
        w = m.fc2.weight
        chunks = [h[:, k : k + 8] @ w[:, k : k + 8].T for k in range(0, h.shape[1], 8)]
        calls[0] += 1
        if calls[0] % 2:  # NOTE: like atomics, the order of the partial sums changes per call.
            chunks.reverse()
        out = chunks[0]
        for part in chunks[1:]:
            out = out + part
        return out + m.fc2.bias

    return _mlp_setup(candidate)


def nan_swallowed() -> Setup:
    model = seeded(8, LogRelu)
    cand = lambda x: torch.fmax(torch.log(x), torch.zeros(())) * model.w  # NOTE: fmax drops NaN
    return Setup(model, cand, (randn(6, 10, seed=20),), {"candidate_module": model})


def output_buffer_reused() -> Setup:
    store: dict[str, torch.Tensor] = {}

    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        out = m(x)
        if "buf" not in store:
            store["buf"] = torch.empty_like(out)
        with torch.no_grad():
            store["buf"].copy_(out)  # NOTE: a static memory plan that hands out its own buffer.
        return store["buf"]

    return _mlp_setup(candidate)


def input_mutated() -> Setup:
    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        h = m.fc1(x)
        x.mul_(0.5)  # NOTE: an in-place reuse of the input buffer as scratch.
        return m.fc2(torch.relu(h))

    return _mlp_setup(candidate)


def detached_output() -> Setup:
    def candidate(m: MLP, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # NOTE: the compiled forward forgot autograd.
            return m(x)

    return _mlp_setup(candidate, grads=True)


def upcast_output() -> Setup:
    return _mlp_setup(lambda m, x: copy.deepcopy(m).double()(x.double()))


def running_stat_on_wrong_module() -> Setup:
    model = seeded(9, ConvBN)
    shadow = copy.deepcopy(model)  # NOTE: state written to a copy: the caller's buffers never move.

    def candidate(x: torch.Tensor) -> torch.Tensor:
        return shadow(x)

    return Setup(model, candidate, (randn(4, 3, 8, 8, seed=21),), {"candidate_module": model})


MUTANTS: tuple[Mutant, ...] = (
    Mutant("wrong_reduction_axis", "wrong reduction axis", wrong_reduction_axis, "output"),
    Mutant("bn_epsilon_dropped", "dropped BatchNorm epsilon", bn_epsilon_dropped, "output"),
    Mutant("bn_epsilon_doubled", "doubled BatchNorm epsilon", bn_epsilon_doubled, "output"),
    Mutant("leaky_relu", "relu turned into leaky_relu for tiny negatives", leaky_relu, "output"),
    Mutant("transposed_weight", "a transposed weight", transposed_weight, "output"),
    Mutant("off_by_one_slice", "an off-by-one slice", off_by_one_slice, "output"),
    Mutant("float16_accumulation", "accumulation in float16", float16_accumulation, "output"),
    Mutant(
        "float16_split_k", "accumulation in float16", float16_split_k_accumulation, "output",
        "anchored",
    ),
    Mutant("cached_first_call", "a result cached from the first call", cached_first_call, "draw"),
    Mutant(
        "baked_capture_sample", "a value baked in from the capture sample", baked_capture_sample,
        "draw",
    ),
    Mutant(
        "wrong_parameter_gradient", "a wrong gradient for one parameter",
        wrong_parameter_gradient, "grad[fc2.bias]",
    ),
    Mutant(
        "missing_running_stat_update", "a missing running-stat update",
        missing_running_stat_update, "buffer[bn.running_mean]",
    ),
    Mutant(
        "running_stat_updated_twice", "a running stat updated twice",
        running_stat_updated_twice, "buffer[bn.running_mean]",
    ),
    Mutant(
        "channels_last_layout_bug", "a layout bug that shows only with channels_last inputs",
        channels_last_layout_bug, "layout channels_last",
    ),
    Mutant(
        "softmax_without_max", "a fused softmax without max subtraction", softmax_without_max,
        "stress draw", "nonfinite",
    ),
    Mutant(
        "race_nondeterminism", "a race-like nondeterministic result", race_nondeterminism,
        "output", "nondeterminism",
    ),
    Mutant("nan_swallowed", "a NaN swallowed", nan_swallowed, "output", "nonfinite"),
    Mutant("output_buffer_reused", "results overwritten by the next call", output_buffer_reused,
           "output", "alias"),
    Mutant("input_mutated", "an input clobbered in place", input_mutated, "input[0] after call"),
    Mutant("detached_output", "a forward that lost autograd", detached_output, "output", "grad"),
    Mutant("upcast_output", "an output in the wrong dtype", upcast_output, "output", "dtype"),
    Mutant(
        "state_on_wrong_module", "buffers written to a copy of the module",
        running_stat_on_wrong_module, "buffer[bn.running_mean]",
    ),
)  # fmt: skip

# The fifteen miscompiles the gate was specified to catch; the catalogue must cover each.
REQUIRED = (
    "wrong reduction axis",
    "dropped BatchNorm epsilon",
    "doubled BatchNorm epsilon",
    "relu turned into leaky_relu for tiny negatives",
    "a transposed weight",
    "an off-by-one slice",
    "accumulation in float16",
    "a result cached from the first call",
    "a value baked in from the capture sample",
    "a wrong gradient for one parameter",
    "a missing running-stat update",
    "a running stat updated twice",
    "a layout bug that shows only with channels_last inputs",
    "a fused softmax without max subtraction",
    "a race-like nondeterministic result",
    "a NaN swallowed",
)
