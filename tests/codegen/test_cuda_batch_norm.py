"""Training-mode batch norm's Triton kernels (codegen.cuda_batch_norm), run through Triton's
interpreter on CPU tensors against ATen's functional batch norm and its backward on fresh random
inputs: the normalized input, the batch statistics, the running statistics and the three
gradients within the contract's normalization row, splits over the batch included; NaN reaches
its channel as in eager."""

from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import pytest
import torch

from plait.codegen import cuda_batch_norm as cbn
from plait.ir import GraphBuilder, TensorType
from plait.ir.graph import Node
from tests.codegen.cuda_batch_norm_eager import cuda_forward
from tests.util import contract_tol

aten = torch.ops.aten
MOMENTUM, EPS = 0.1, 1e-5
# NOTE: (N, C, spatial...): one split per channel, several (16 rows of 1024 in 2 splits), rank 2
SHAPES = [(5, 3, 7, 9), (16, 4, 32, 32), (9, 6), (3, 5, 2, 3, 4)]


def _draw(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    # NOTE: a mean far from zero per channel, so that a cancelling variance would show
    x = (
        torch.randn(shape, generator=g) * 2
        + torch.randn(c, generator=g).view(1, c, *[1] * (len(shape) - 2)) * 5
    )
    w, b, rm = (torch.randn(c, generator=g) for _ in range(3))
    rv = torch.rand(c, generator=g) + 0.5
    gy = torch.randn(shape, generator=g)
    return x.to(dtype), w, b, rm, rv, gy.to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(
        got, want, **contract_tol("normalization", want.dtype), equal_nan=True
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_backward_match_aten(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    for seed in (1, 2):
        x, w, b, rm, rv, gy = _draw(seed, shape, dtype)
        want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
        got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS)
        assert len(got) == 5
        for g, v in zip(got, want):
            _close(g, v)
        mask = [True, True, True]
        want_grads = aten.native_batch_norm_backward(
            gy, x, w, None, None, want[1], want[2], True, EPS, mask
        )
        for g, v in zip(cbn.backward(gy, x, w, want[1], want[2], mask), want_grads):
            assert g is not None
            _close(g, v)


def test_without_affine_or_running_statistics() -> None:
    x, *_, gy = _draw(3, (6, 3, 5, 5), torch.float32)
    want = aten._native_batch_norm_legit.no_stats(x, None, None, True, MOMENTUM, EPS)
    got = cbn.forward(x, None, None, None, None, MOMENTUM, EPS)
    assert len(got) == 3
    for g, v in zip(got, want):
        _close(g, v)
    mask = [True, False, False]
    (want_dx, *_) = aten.native_batch_norm_backward(
        gy, x, None, None, None, want[1], want[2], True, EPS, mask
    )
    dx, dw, db = cbn.backward(gy, x, None, want[1], want[2], mask)
    assert dx is not None and dw is None and db is None
    _close(dx, want_dx)


def test_nan_reaches_its_channel_as_in_eager() -> None:
    x, w, b, rm, rv, _ = _draw(4, (16, 3, 32, 32), torch.float32)
    x[9, 1, 3, 4] = float("nan")  # NOTE: in the second split of channel 1
    want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
    got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS)
    for g, v in zip(got, want):
        assert torch.equal(g.isnan(), v.isnan())
        _close(g, v)


def test_an_infinite_value_gives_eagers_cuda_mean() -> None:
    """+-inf where eager's CUDA thread reads the infinity last, else NaN (its Welford update:
    tests.codegen.cuda_batch_norm_eager), through plait's splits and their shifts."""
    x, w, b, rm, rv, _ = _draw(5, (16, 4, 32, 32), torch.float32)
    x[15, 0, 31, 31] = float("inf")  # NOTE: the last value of channel 0, in its last split: +inf
    x[9, 1, 3, 4] = float("inf")  # NOTE: the second split of channel 1: NaN
    x[0, 2, 0, 0] = float("-inf")  # NOTE: the first tile of channel 2 (the split's shift): NaN
    x[1, 3, 2, 2], x[12, 3, 5, 5] = float("inf"), float("-inf")  # NOTE: both signs: NaN
    want = cuda_forward(x, w, b, rm, rv)
    got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS)
    assert want[1][0] == float("inf") and want[1][1:].isnan().all()
    for g, v in zip(got, want):
        assert torch.equal(g.isnan(), v.isnan()) and torch.equal(g.isinf(), v.isinf())
        assert torch.equal(g[g.isinf()], v[v.isinf()])
        finite = g.isfinite()
        _close(g[finite], v[finite])


def test_splits_fill_the_gpu_and_cover_the_batch() -> None:
    for n, c, length in [(64, 64, 12544), (64, 2048, 49), (7, 3, 5000), (1, 8, 100_000)]:
        s, rows = cbn.splits(n, c, length)
        assert 1 <= s <= n and (s - 1) * rows < n <= s * rows
    assert cbn.splits(64, 64, 12544)[0] * 64 >= 1024


def test_only_aten_batch_norm_nodes_get_the_kernels() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 3, 5, 5), torch.float32))
    gb.output(gb.call("relu", x))
    (relu,) = gb.build().nodes
    assert cbn.batch_norm_call(relu) is None
    assert not cbn._takes(torch.zeros(4, 3, 5, 5).to(memory_format=torch.channels_last))
    assert not cbn._takes(torch.zeros(1, 3, 1, 1))  # NOTE: one value per channel: ATen's error
    assert not cbn._takes(torch.zeros(4, 3, 5, 5, dtype=torch.float64))


def _aten_node(name: str, overload: str, inputs: list[TensorType], literals: list) -> Node:
    gb = GraphBuilder()
    values = [gb.input(f"t{i}", t) for i, t in enumerate(inputs)]
    out = gb.call("aten", values, name=name, overload=overload, literals=json.dumps(literals))
    gb.output(*(out if isinstance(out, tuple) else (out,)))
    (node,) = gb.build().nodes
    return node


def test_the_calls_bind_atens_arguments() -> None:
    """The extern calls of the nodes a training program holds (``plait.autograd.joint``'s
    functional batch norm, the batch-norm rule's backward) run the kernels with the node's
    arguments: ATen's results, within the contract."""
    x, w, b, rm, rv, gy = _draw(7, (6, 4, 5, 5), torch.bfloat16)
    types = [TensorType(tuple(t.shape), t.dtype) for t in (x, w, b, rm, rv)]
    refs = [{"t": i} for i in range(5)]
    node = _aten_node(
        "_native_batch_norm_legit_functional", "default", types,
        [*refs, True, MOMENTUM, EPS],
    )  # fmt: skip
    call = cbn.batch_norm_call(node)
    assert call is not None and call.detail.startswith("plait Triton batch norm (forward")
    got = call.fn([x, w, b, rm, rv])
    want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
    for g, v in zip(got, want):
        _close(g, v)
    mean, rstd = want[1], want[2]
    types = [TensorType(tuple(t.shape), t.dtype) for t in (gy, x, w, mean, rstd)]
    mask = [True, False, True]
    literals = [{"t": 0}, {"t": 1}, {"t": 2}, None, None, {"t": 3}, {"t": 4}, True, EPS, mask]
    node = _aten_node("native_batch_norm_backward", "default", types, literals)
    call = cbn.batch_norm_call(node)
    assert call is not None and call.detail.startswith("plait Triton batch norm (backward")
    dx, db = call.fn([gy, x, w, mean, rstd])
    want_dx, _, want_db = aten.native_batch_norm_backward(
        gy, x, w, None, None, mean, rstd, True, EPS, mask
    )
    _close(dx, want_dx)
    _close(db, want_db)
