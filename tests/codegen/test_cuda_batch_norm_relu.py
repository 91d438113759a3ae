"""A training batch norm fused with its ReLU (``plait.passes.fuse_bn_relu``), run on the Triton
target through Triton's interpreter on CPU tensors (plait's batch-norm kernels, as on CUDA):
a conv -> BatchNorm2d -> ReLU block's output, gradients and running statistics against eager's
on fresh inputs, within the contract's normalization row; the manifest records both rewrites
and no ReLU or mask kernel is left; NaN and infinity behave as in eager; a batch norm whose
result has another reader is not fused; calls the kernels do not take (float64, a
channels_last input) run ATen's kernel with the ReLU and its mask."""

from __future__ import annotations

import copy
import json
import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

from typing import Any

import torch
from torch import nn

import plait
from plait.codegen import cuda_batch_norm as cbn
from plait.ir import GraphBuilder, TensorType
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.util import assert_bitwise, contract_tol

aten = torch.ops.aten
TRITON = {"stax": {"target": "triton"}, "cache": False}
MOMENTUM, EPS = 0.1, 1e-5


class _Block(nn.Module):
    """conv -> BatchNorm2d -> ReLU -> conv, as in a ResNet: the backward reads the ReLU's
    result (the second convolution's input) for the mask. (Where nothing else reads it, the
    partition saves the comparison ``le(y, 0)`` instead, a boolean mask: not fused.)"""

    def __init__(self, shared: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)  # NOTE: as before a batch norm
        self.bn = nn.BatchNorm2d(6)
        self.head = nn.Conv2d(6, 5, 1)
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        # NOTE: shared: the normalized result has a reader besides the relu
        return self.head(torch.relu(y) + y if self.shared else torch.relu(y))


def _draw(seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, 9, 7, generator=g).to(dtype), torch.randn(4, 5, 9, 7, generator=g)


def _step(model: nn.Module, x: torch.Tensor, gy: torch.Tensor) -> list[torch.Tensor]:
    """One training step's output, input gradient and parameter gradients."""
    x = x.clone().requires_grad_()
    out = model(x)
    out.backward(gy.to(out.dtype))
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    assert x.grad is not None
    return [out.detach(), x.grad, *grads]


def _close(got: torch.Tensor, want: torch.Tensor, nonfinite: bool = False) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if nonfinite:
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(
        got, want, **contract_tol("normalization", want.dtype), equal_nan=True
    )


def _trained(shared: bool = False, dtype: torch.dtype = torch.float32) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = _Block(shared).train().to(dtype)
    reference = copy.deepcopy(model)
    return model, plait.compile(model, backend="stax", options=TRITON), reference


def _manifest(compiled: Any) -> Any:
    (spec,) = compiled.specializations
    return spec.compiled.manifest


def _fired(m: Any, half: str) -> list[dict[str, Any]]:
    return [
        r for p in m.autograd["passes"][half] if p["name"] == "fuse-bn-relu" for r in p["rewrites"]
    ]


def _evidence(m: Any, half: str) -> list[dict[str, Any]]:
    ex = m.executor if half == "forward" else m.executor["backward"]
    return list(ex["evidence"]["nodes"])


def _steps_match_eager(model: Any, compiled: Any, reference: Any, seeds: tuple[int, ...]) -> None:
    for seed in seeds:
        x, gy = _draw(seed, next(model.parameters()).dtype)
        for got, want in zip(_step(compiled, x, gy), _step(reference, x, gy), strict=True):
            _close(got, want)
    for name, want in reference.state_dict().items():
        got = model.state_dict()[name]
        if name.endswith("num_batches_tracked"):
            assert torch.equal(got, want), name
        else:
            _close(got, want)


def test_a_fused_block_trains_as_eager() -> None:
    model, compiled, reference = _trained()
    _steps_match_eager(model, compiled, reference, (1, 2, 3))
    m = _manifest(compiled)
    (forward,) = _fired(m, "forward")
    (backward,) = _fired(m, "backward")
    assert forward["rule"] == "fuse-bn-relu.forward" and len(forward["replaced"]) == 2
    assert backward["rule"] == "fuse-bn-relu.backward" and len(backward["replaced"]) == 3
    fwd, bwd = _evidence(m, "forward"), _evidence(m, "backward")
    # NOTE: no relu, no mask (le, where) left: the batch-norm kernels apply them
    assert not [n for n in fwd if n["op"] == "relu"], fwd
    assert not [n for n in bwd if n["op"] in ("le", "where")], bwd
    (f,) = [n["detail"] for n in fwd if n["op"] == "batch_norm_relu"]
    (b,) = [n["detail"] for n in bwd if n["op"] == "batch_norm_relu_backward"]
    assert f.startswith("plait Triton batch norm (forward with the ReLU fused"), f
    assert b.startswith("plait Triton batch norm (backward with the ReLU's mask fused"), b
    assert m.executor["evidence"]["counts"]["fallback"] == 0


def test_a_bfloat16_autocast_block_passes_the_gate() -> None:
    """Under bfloat16 autocast (a 16-bit input, float32 weights and statistics: ATen's batch
    norm, fused): the gate on outputs and gradients, anchored on a float64 copy."""
    _, compiled, reference = _trained()

    def draw(seed: int) -> tuple[torch.Tensor]:
        return (_draw(seed)[0],)

    gate_bf16_training(reference, compiled, draw, "cpu")
    m = _manifest(compiled)
    assert _fired(m, "forward") and _fired(m, "backward")


def test_nan_and_infinity_behave_as_in_eager() -> None:
    _, compiled, reference = _trained()
    x, gy = _draw(6)
    x[1, 0, 2, 3] = float("nan")  # NOTE: reaches every channel through the convolution
    for got, want in zip(_step(compiled, x, gy), _step(reference, x, gy), strict=True):
        _close(got, want, nonfinite=True)
    x, gy = _draw(7)
    gy[0, 2, 1, 1], gy[3, 4, 0, 0] = float("inf"), float("nan")
    for got, want in zip(_step(compiled, x, gy), _step(reference, x, gy), strict=True):
        _close(got, want, nonfinite=True)


def test_the_kernels_keep_nan_and_mask_as_eager() -> None:
    """The ReLU keeps NaN (an infinite bias makes its channel infinite, a NaN weight NaN), and
    the mask passes the gradient where the ReLU's result is NaN, zeroes it at 0, -0.0 and below."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 4, 5, 5, generator=g)
    w, b, rm, rv = (
        torch.randn(4, generator=g),
        torch.randn(4, generator=g),
        torch.zeros(4),
        torch.ones(4),
    )
    w[1], b[2], b[3] = float("nan"), float("inf"), float("-inf")
    want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
    got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS, relu=True)
    _close(got[0], torch.relu(want[0]), nonfinite=True)
    for a, e in zip(got[1:], want[1:], strict=True):
        _close(a, e)
    gy, y = torch.randn(6, 4, 5, 5, generator=g), torch.randn(6, 4, 5, 5, generator=g)
    flat = y.view(-1)
    flat[::7], flat[1::7], flat[2::11] = float("nan"), 0.0, -0.0
    w = torch.randn(4, generator=g)
    mean, rstd = want[1], want[2]
    masked = torch.where(torch.le(y, 0), 0.0, gy)
    grads = aten.native_batch_norm_backward(
        masked, x, w, None, None, mean, rstd, True, EPS, [True, True, True]
    )
    for a, e in zip(cbn.backward(gy, x, w, mean, rstd, [True] * 3, relu_out=y), grads, strict=True):
        assert a is not None
        _close(a, e)


def test_a_batch_norm_with_another_reader_is_not_fused() -> None:
    model, compiled, reference = _trained(shared=True)
    _steps_match_eager(model, compiled, reference, (9, 10))
    m = _manifest(compiled)
    assert not _fired(m, "forward") and not _fired(m, "backward")
    fwd = _evidence(m, "forward")
    assert [n for n in fwd if n["op"] == "aten"], fwd


def test_float64_runs_atens_kernel_with_the_relu() -> None:
    """A float64 call the kernels do not take: fused all the same, ATen's kernel then the ReLU
    (and the mask before ATen's backward): eager's bits."""
    _, compiled, reference = _trained(dtype=torch.float64)
    for seed in (11, 12):
        x, gy = _draw(seed, torch.float64)
        for got, want in zip(_step(compiled, x, gy), _step(reference, x, gy), strict=True):
            assert_bitwise(got, want)
    m = _manifest(compiled)
    assert _fired(m, "forward") and _fired(m, "backward")
    (f,) = [n["detail"] for n in _evidence(m, "forward") if n["op"] == "batch_norm_relu"]
    assert f.startswith("aten._native_batch_norm_legit_functional.default (forward with"), f


def _fused_node(x: torch.Tensor) -> Any:
    gb = GraphBuilder()
    tensors = [gb.input(f"t{i}", TensorType(tuple(t.shape), t.dtype)) for i, t in enumerate(x)]
    literals = [*({"t": i} for i in range(5)), True, MOMENTUM, EPS]
    out = gb.call(
        "batch_norm_relu", tensors, name="_native_batch_norm_legit_functional",
        literals=json.dumps(literals),
    )  # fmt: skip
    gb.output(*out)
    (node,) = gb.build().nodes
    return node


def test_a_channels_last_input_runs_atens_kernel_with_the_relu() -> None:
    """Decided per call: a non-contiguous input (channels_last) is ATen's, then the ReLU."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(4, 3, 5, 5, generator=g).contiguous(memory_format=torch.channels_last)
    w, b, rm = (torch.randn(3, generator=g) for _ in range(3))
    rv = torch.rand(3, generator=g) + 0.5
    call = cbn.batch_norm_call(_fused_node([x, w, b, rm, rv]))
    assert call is not None and call.detail.startswith("plait Triton batch norm (forward with")
    got = call.fn([x, w, b, rm, rv])
    want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
    assert_bitwise(got[0], torch.relu(want[0]))
    for a, e in zip(got[1:], want[1:], strict=True):
        assert_bitwise(a, e)


def test_a_channels_last_block_trains_as_eager() -> None:
    _, compiled, reference = _trained()
    for seed in (14, 15):
        x, gy = _draw(seed)
        x = x.contiguous(memory_format=torch.channels_last)
        for got, want in zip(_step(compiled, x, gy), _step(reference, x, gy), strict=True):
            _close(got, want)
