"""Derivative rules of the extern, ATen, random, data-dependent and constant ops against PyTorch
autograd and finite differences."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait.contract
from plait.autograd import CompiledAutograd, JointGraphError, build_joint, partition
from plait.conformance.gradcheck import gradcheck_fd
from plait.ir import Category, GraphBuilder, TensorType, all_ops, get_op
from plait.ir.graph import Graph
from plait.ir.ops.call_autograd import ZERO_GRADIENT_DRAWS
from plait.ir.ops.vjp import NoDerivativeError, is_differentiable
from tests.autograd.vjp_check import OneOp, check_op, differentiable_samples
from tests.ir.opdb import Sample, samples

F64 = torch.float64
FAMILIES = (Category.EXTERN, Category.OPAQUE, Category.RANDOM, Category.CONSTANT)
OPS = sorted(
    n
    for n, o in all_ops().items()
    if o.category in FAMILIES and n != "torch_vjp" and is_differentiable(n)
)
# NOTE: ops whose op-database samples make no sense to differentiate as check_op does; each
# reason is asserted by test_skipped_samples_are_what_the_reason_says, and each op is checked
# by the tests below.
SKIPPED = {
    "aten_datadep": "its sample (nonzero_static) has integer results only",
    "dropout": "its train sample draws: the joint graph first rewrites it into native_dropout",
    "random_call": "its samples draw random numbers (a gradient check would draw others)",
    "batch_norm_relu": "PyTorch's autograd refuses the running statistics its samples pass "
    "(test_batch_norm_relu_vjp checks the sample without them)",
    "batch_norm_relu_backward": "its samples want a derivative with respect to the saved batch "
    "statistics, which PyTorch's batch-norm backward has not: its rule refuses it",
}

# NOTE: a rule's refusal, and the same refusal as the joint graph builder reports it
REFUSED = (NoDerivativeError, JointGraphError)


@pytest.mark.parametrize("op", OPS)
def test_extern_vjp(op: str) -> None:
    if op in SKIPPED:
        pytest.skip(SKIPPED[op])
    assert check_op(op) > 0


def test_skipped_samples_are_what_the_reason_says() -> None:
    assert set(SKIPPED) <= set(OPS)
    for s in differentiable_samples("aten_datadep"):
        outs = get_op(s.op).run(_flat(s.args), get_op(s.op).check_attrs(s.attrs))
        assert not any(o.dtype.is_floating_point for o in outs), s.desc
    train = [s for s in differentiable_samples("dropout") if s.attrs.get("train", True)]
    assert train and all(
        get_op("dropout").is_random(get_op("dropout").check_attrs(s.attrs)) for s in train
    )
    with pytest.raises(REFUSED, match="rewrite it into aten native_dropout"):
        OneOp(train[0], "min-cut")
    assert all(get_op("random_call").is_random(s.attrs) for s in samples("random_call", F64))
    with_stats = [s for s in differentiable_samples("batch_norm_relu") if len(s.args[0]) == 5]
    assert with_stats
    for s in with_stats:
        x, w, b, rm, rv = (t.detach().clone().requires_grad_() for t in s.args[0])
        with pytest.raises(RuntimeError, match="running_mean"):
            torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
    for s in differentiable_samples("batch_norm_relu_backward"):
        with pytest.raises(REFUSED, match="save_mean"):
            OneOp(s, "min-cut")


@pytest.mark.parametrize("partitioner", ["save-all", "min-cut"])
def test_batch_norm_relu_vjp(partitioner: str) -> None:
    """The fused batch norm's rule (the fused backward), on its sample without running
    statistics, through its normalized result (eager differentiates no other): against PyTorch
    autograd of eager's batch norm then relu, and finite differences."""
    (s,) = [s for s in differentiable_samples("batch_norm_relu") if len(s.args[0]) == 3]
    x, w, b = s.args[0]
    gb = GraphBuilder()
    operands = [gb.input(n, TensorType.of(t)) for n, t in zip("xwb", (x, w, b))]
    gb.output(gb.call("batch_norm_relu", operands, **s.attrs)[0])
    joint = build_joint(gb.build(), ["x", "w", "b"])
    run = CompiledAutograd.interpreted(
        partition(joint, partitioner), n_inputs=3, n_outputs=1,
        cotangents=joint.cotangents, grads=joint.grads, name="batch_norm_relu",
    )  # fmt: skip

    def fused(*tensors: torch.Tensor) -> torch.Tensor:
        return run(list(tensors))[0]

    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    refs = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    cot = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    got = torch.autograd.grad(fused(*leaves), leaves, cot)
    eager = torch.relu(F.batch_norm(refs[0], None, None, refs[1], refs[2], True, 0.1, 1e-5))
    tol = plait.contract.load().gradcheck
    for a, e in zip(got, torch.autograd.grad(eager, refs, cot)):
        torch.testing.assert_close(a, e, rtol=tol.rtol, atol=tol.atol)
    gradcheck_fd(fused, tuple(t.detach() for t in (x, w, b))).raise_if_failed()


def test_nondifferentiable_declarations() -> None:
    for op in (
        "aten_factory",
        "aten_check",
        "random_factory",
        "rng_seed",
        "rng_get_state",
        "rng_set_state",
        "full",
        "zeros",
        "ones",
        "arange",
    ):
        assert not is_differentiable(op), op


# --- helpers ---------------------------------------------------------------------------------


def _flat(args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(a if isinstance(a, list) else [a])
    return out


def _check(sample: Sample) -> None:
    """check_op's comparisons on one sample: autograd on the reference, finite differences."""
    tol = plait.contract.load().gradcheck
    for partitioner in ("save-all", "min-cut"):
        one = OneOp(sample, partitioner)
        leaves = [t.detach().clone().requires_grad_(t.dtype == F64) for t in one.inputs()]
        ours = one(*leaves)
        ours = [o for o in (ours if isinstance(ours, tuple) else (ours,)) if o.dtype == F64]
        gen = torch.Generator().manual_seed(1)
        cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in ours]
        wrt = [t for t in leaves if t.requires_grad]
        got = torch.autograd.grad(ours, wrt, cots, allow_unused=True)
        refs = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
        theirs = one.reference(*refs)
        theirs = [o for o in (theirs if isinstance(theirs, tuple) else (theirs,)) if o.dtype == F64]
        want = torch.autograd.grad(
            theirs, [t for t in refs if t.requires_grad], cots, allow_unused=True
        )
        for k, (a, e) in enumerate(zip(got, want)):
            a = torch.zeros_like(wrt[k]) if a is None else a
            e = torch.zeros_like(wrt[k]) if e is None else e
            torch.testing.assert_close(
                a,
                e,
                rtol=tol.rtol,
                atol=tol.atol,
                equal_nan=True,
                msg=f"{sample.desc} {partitioner}: gradient {k} differs from autograd",
            )
        gradcheck_fd(one, tuple(one.inputs())).raise_if_failed()


def _t(*shape: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=F64).to(dtype)


def _graph(op: str, args: list[Any], attrs: dict[str, Any]) -> tuple[Graph, list[torch.Tensor]]:
    """A one-node graph over ``args`` (tensors become inputs a0, a1...; a list is variadic)."""
    b = GraphBuilder()
    tensors: list[torch.Tensor] = []

    def operand(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            return b.input(f"a{len(tensors) - 1}", TensorType.of(a))
        return a

    structured = [[operand(x) for x in a] if isinstance(a, list) else operand(a) for a in args]
    outs = b.call(op, *structured, **attrs)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    return b.build(), tensors


def _compiled(graph: Graph, wrt: list[str], partitioner: str = "min-cut") -> tuple[Any, Any]:
    joint = build_joint(graph, wrt)
    part = partition(joint, partitioner)
    run = CompiledAutograd.interpreted(
        part,
        n_inputs=len(graph.inputs),
        n_outputs=len(graph.outputs),
        cotangents=joint.cotangents,
        grads=joint.grads,
    )
    return run, part


def _grads_match(
    op: str,
    args: list[Any],
    attrs: dict[str, Any],
    eager: Callable[..., Any],
    wrt: list[int],
    seed: int | None = None,
    partitioners: tuple[str, ...] = ("save-all", "min-cut"),
) -> None:
    """The compiled gradients of tensor inputs ``wrt`` equal eager autograd's on ``eager``
    (called with the tensors); with ``seed``, both run after ``torch.manual_seed(seed)``."""
    tol = plait.contract.load().gradcheck
    graph, tensors = _graph(op, args, attrs)
    for partitioner in partitioners:
        run, _ = _compiled(graph, [f"a{i}" for i in wrt], partitioner)
        ours_in = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(tensors)]
        ref_in = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(tensors)]
        if seed is not None:
            torch.manual_seed(seed)
        ours = [o for o in run(ours_in) if o.dtype.is_floating_point]
        if seed is not None:
            torch.manual_seed(seed)
        theirs = eager(*ref_in)
        theirs = [
            o
            for o in (theirs if isinstance(theirs, tuple) else (theirs,))
            if o.dtype.is_floating_point
        ]
        for a, e in zip(ours, theirs):
            torch.testing.assert_close(a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        gen = torch.Generator().manual_seed(5)
        cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in ours]
        got = torch.autograd.grad(ours, [ours_in[i] for i in wrt], cots, allow_unused=True)
        want = torch.autograd.grad(theirs, [ref_in[i] for i in wrt], cots, allow_unused=True)
        for i, a, e in zip(wrt, got, want):
            a = torch.zeros_like(tensors[i]) if a is None else a
            e = torch.zeros_like(tensors[i]) if e is None else e
            torch.testing.assert_close(
                a,
                e,
                rtol=tol.rtol,
                atol=tol.atol,
                equal_nan=True,
                msg=f"{op} {partitioner}: gradient of a{i} differs from eager",
            )


def _aten_nodes(graph: Graph) -> list[str]:
    return [n.attrs["name"] for n in graph.nodes if n.op == "aten"]


# --- conv2d, linear, matmul ------------------------------------------------------------------


def test_conv2d_backward_runs_no_forward_convolution() -> None:
    x, w, b = _t(2, 4, 9, 7), _t(6, 4, 3, 3, seed=1), _t(6, seed=2)
    attrs = {"stride": (2, 1), "padding": (1, 0)}
    graph, _ = _graph("conv2d", [x, w, b], attrs)
    for partitioner in ("save-all", "min-cut"):
        _, part = _compiled(graph, ["a0", "a1", "a2"], partitioner)
        ops = [n.op for n in part.backward.nodes]
        assert "conv2d" not in ops and "torch_vjp" not in ops, ops
        assert _aten_nodes(part.backward) == ["convolution_backward"]
    # NOTE: output_mask asks only for what is wanted: the weight's gradient alone here
    joint = build_joint(graph, ["a1"])
    (node,) = [n for n in joint.graph.nodes if n.op == "aten"]
    assert json.loads(node.attrs["literals"])[-1] == [False, True, False]
    assert len(node.outputs) == 1

    def conv(x: Any, w: Any, b: Any) -> Any:
        return F.conv2d(x, w, b, (2, 1), (1, 0))

    _grads_match("conv2d", [x, w, b], attrs, conv, wrt=[1])
    _grads_match("conv2d", [x, w, b], attrs, conv, wrt=[0, 2])


def test_linear_and_matmul_shapes() -> None:
    w, bias = _t(6, 8, seed=1), _t(6, seed=2)
    _check(Sample("linear", [_t(8), w, bias], {}, lambda: None, "1-D input"))
    _check(Sample("linear", [_t(2, 3, 4, 8), w, None], {}, lambda: None, "4-D input"))
    for sa, sb in (((3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 5)), ((5,), (5, 2)), ((2, 5), (5,))):
        _check(Sample("matmul", [_t(*sa), _t(*sb, seed=1)], {}, lambda: None, f"{sa}@{sb}"))


# --- scaled_dot_product_attention ------------------------------------------------------------


def _sdpa(mask: Any = None, **attrs: Any) -> Callable[..., Any]:
    def run(q: Any, k: Any, v: Any, m: Any = None) -> Any:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=m if mask is None else mask, **attrs
        )

    return run


def test_sdpa_gradient_with_causal_and_float_masks() -> None:
    q, k, v = _t(2, 3, 5, 8), _t(2, 3, 7, 8, seed=1), _t(2, 3, 7, 4, seed=2)
    causal = {"is_causal": True}
    _grads_match(
        "scaled_dot_product_attention",
        [q, k, v, None],
        causal,
        _sdpa(is_causal=True),
        wrt=[0, 1, 2],
    )
    fmask = _t(5, 7, seed=3)
    fmask[1, 2:] = -torch.inf
    attrs = {"scale": 0.3}
    _grads_match(
        "scaled_dot_product_attention", [q, k, v, fmask], attrs, _sdpa(scale=0.3), wrt=[0, 1, 2, 3]
    )
    _check(Sample("scaled_dot_product_attention", [q, k, v, fmask], attrs, lambda: None, "float"))


def test_sdpa_fully_masked_row_and_grouped_heads() -> None:
    q, k, v = _t(2, 4, 5, 8), _t(2, 2, 6, 8, seed=1), _t(2, 2, 6, 8, seed=2)
    bmask = torch.ones(5, 6, dtype=torch.bool)
    bmask[3] = False  # NOTE: eager gives a fully masked row zeros, and zero gradients
    bmask[0, 4:] = False
    attrs = {"enable_gqa": True}
    _grads_match(
        "scaled_dot_product_attention",
        [q, k, v, bmask],
        attrs,
        _sdpa(enable_gqa=True),
        wrt=[0, 1, 2],
    )
    fmask = torch.zeros(5, 6, dtype=F64)
    fmask[2] = -torch.inf
    _grads_match(
        "scaled_dot_product_attention",
        [q, k, v, fmask],
        attrs,
        _sdpa(enable_gqa=True),
        wrt=[0, 1, 2, 3],
    )
    batch = _t(3, 1, 5, 8)  # NOTE: batch dims broadcast: q's sums its copies
    _check(
        Sample(
            "scaled_dot_product_attention",
            [batch, _t(1, 2, 5, 8), _t(1, 2, 5, 8, seed=4), None],
            {},
            lambda: None,
            "broadcast batch",
        )
    )


def test_sdpa_half_precision_and_dropout() -> None:
    q, k, v = (_t(1, 2, 5, 8, seed=s, dtype=torch.bfloat16) for s in range(3))
    graph, tensors = _graph("scaled_dot_product_attention", [q, k, v, None], {"is_causal": True})
    run, _ = _compiled(graph, ["a0", "a1", "a2"])
    ins = [t.clone().requires_grad_() for t in tensors]
    refs = [t.clone().requires_grad_() for t in tensors]
    run(ins)[0].float().sum().backward()
    F.scaled_dot_product_attention(
        refs[0], refs[1], refs[2], is_causal=True
    ).float().sum().backward()
    # NOTE: eager's bfloat16 kernels against the rule's formula (float32 inside): the row of
    # the contract for bfloat16 attention
    tol = plait.contract.load().tolerance("attention", torch.bfloat16)
    for a, e in zip(ins, refs):
        assert a.grad is not None and a.grad.dtype == torch.bfloat16
        torch.testing.assert_close(a.grad, e.grad, rtol=tol.rtol, atol=tol.atol)
    graph, _ = _graph("scaled_dot_product_attention", [q, k, v, None], {"dropout_p": 0.1})
    with pytest.raises(REFUSED, match=r"dropout_p=0\.1"):
        build_joint(graph, ["a0"])


# --- embedding, index_select, pools --------------------------------------------------------


def test_embedding_padding_idx_gets_no_gradient() -> None:
    w = _t(10, 4)
    idx = torch.tensor([[1, 9, 0], [9, 9, 3]])
    for pad in (9, -1, None):
        _grads_match(
            "embedding",
            [idx, w],
            {"padding_idx": pad},
            lambda i, w, pad=pad: F.embedding(i, w, pad),
            wrt=[1],
        )
    graph, _ = _graph("embedding", [idx, w], {"padding_idx": -1})
    run, _ = _compiled(graph, ["a1"])
    leaf = w.clone().requires_grad_()
    run([idx, leaf])[0].sum().backward()
    assert leaf.grad is not None and bool((leaf.grad[9] == 0).all())
    assert bool((leaf.grad[3] == 1).all())


def test_index_select_int32_index_and_pools_3d() -> None:
    x = _t(6, 5)
    idx = torch.tensor([4, 0, 0, 2], dtype=torch.int32)
    _check(Sample("index_select", [x, idx], {"dim": -1}, lambda: None, "int32, dim -1"))
    x3 = _t(3, 7, 6)
    _check(
        Sample(
            "max_pool2d",
            [x3],
            {"kernel_size": (3, 2), "dilation": (2, 1)},
            lambda: None,
            "3-D dilated",
        )
    )
    _check(
        Sample(
            "avg_pool2d",
            [x3],
            {"kernel_size": (2, 2), "divisor_override": 3},
            lambda: None,
            "divisor",
        )
    )
    _check(Sample("adaptive_avg_pool2d", [x3], {"output_size": (4, 4)}, lambda: None, "overlap"))


# --- dropout and native_dropout --------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.9, 1.0])
def test_native_dropout_draws_what_f_dropout_draws(p: float, dtype: torch.dtype) -> None:
    """The fact the joint graph's rewrite of train-mode dropout rests on: on the CPU, after the
    same seed, ``aten.native_dropout(x, p, True)`` draws F.dropout's mask and gives its values
    bit for bit. For 0 < p < 1 both leave the generator in the same state; at p = 0 and p = 1
    F.dropout draws nothing (the identity; x * 0) while native_dropout still draws: those two
    need no rewrite (the dropout rule differentiates them) and must get none."""
    for shape, layout in (((6, 7), None), ((2, 3, 5, 4), torch.channels_last), ((1000,), None)):
        x = _t(*shape, dtype=dtype)
        x[x == 0] = 1
        if layout is not None:
            x = x.to(memory_format=layout)
        for grad in (False, True):
            x = x.detach().requires_grad_(grad)
            torch.manual_seed(11)
            seeded = torch.get_rng_state()
            eager = F.dropout(x, p, training=True)
            after_eager = torch.get_rng_state()
            torch.manual_seed(11)
            out, mask = torch.ops.aten.native_dropout(x, p, True)
            assert torch.equal(mask, eager != 0), (shape, grad)
            assert torch.equal(out, eager), (shape, grad)
            after_native = torch.get_rng_state()
            if 0 < p < 1:
                assert torch.equal(after_native, after_eager)
            else:
                assert torch.equal(after_eager, seeded)
                assert not torch.equal(after_native, seeded)


def test_dropout_eval_and_train() -> None:
    x = _t(6, 7)
    for attrs in ({"p": 0.3, "train": False}, {"p": 0.0, "train": True}, {"p": 1.0, "train": True}):
        _check(Sample("dropout", [x], attrs, lambda: None, str(attrs)))
    graph, _ = _graph("dropout", [x], {"p": 0.3, "train": True})
    with pytest.raises(REFUSED, match=r"train mode \(p=0.3\).*native_dropout"):
        build_joint(graph, ["a0"])


@pytest.mark.parametrize("train", [True, False, None])
@pytest.mark.parametrize("p", [0.3, 1.0])
def test_native_dropout_reads_its_mask(train: bool | None, p: float) -> None:
    x = _t(5, 6)
    literals = json.dumps([{"t": 0}, p, train])
    attrs = {"name": "native_dropout", "literals": literals}
    graph, _ = _graph("aten", [[x]], attrs)
    _, part = _compiled(graph, ["a0"])
    assert _aten_nodes(part.backward) == ["native_dropout_backward"]
    # NOTE: with train=None eager's gradient is unscaled (derivatives.yaml); plait matches it
    _grads_match(
        "aten", [[x]], attrs, lambda x: torch.ops.aten.native_dropout(x, p, train), wrt=[0], seed=4
    )


# --- aten: random overloads, nondifferentiable results -----------------------------------------


_ZERO_CALLS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "aten.bernoulli.default": lambda t: torch.ops.aten.bernoulli.default(t.sigmoid()),
    "aten.bernoulli.Tensor": lambda t: torch.ops.aten.bernoulli.Tensor(t, t.sigmoid()),
    "aten.uniform.default": lambda t: torch.ops.aten.uniform.default(t, 0.0, 1.0),
    "aten.normal.Tensor_float": lambda t: torch.ops.aten.normal.Tensor_float(t, 1.0),
    "aten.normal.float_Tensor": lambda t: torch.ops.aten.normal.float_Tensor(0.0, t.exp()),
    "aten.normal.Tensor_Tensor": lambda t: torch.ops.aten.normal.Tensor_Tensor(t, t.exp()),
    "aten.exponential.default": lambda t: torch.ops.aten.exponential.default(t, 1.5),
    "aten.geometric.default": lambda t: torch.ops.aten.geometric.default(t, 0.3),
    "aten.log_normal.default": lambda t: torch.ops.aten.log_normal.default(t, 1.0, 2.0),
    "aten.cauchy.default": lambda t: torch.ops.aten.cauchy.default(t, 0.0, 1.0),
    "aten.poisson.default": lambda t: torch.ops.aten.poisson.default(t.exp()),
    # NOTE: a functional form with no formula of its own: eager's in-place op has one
    "aten.normal_functional.default": lambda t: (t * 1).normal_(1.0, 2.0),
}


def test_zero_gradient_draws_are_eager_zero_gradients() -> None:
    assert set(_ZERO_CALLS) == set(ZERO_GRADIENT_DRAWS)
    for name, call in _ZERO_CALLS.items():
        t = _t(3, 4).requires_grad_()
        y = call(t)
        (g,) = torch.autograd.grad(y, t, torch.ones_like(y), allow_unused=True)
        assert g is not None and bool((g == 0).all()), name  # NOTE: zeros, never None


def test_aten_random_overloads() -> None:
    x = _t(4, 3).abs() + 0.5
    graph, _ = _graph(
        "aten", [[x]], {"name": "normal", "overload": "Tensor_float", "literals": '[{"t": 0}, 1.0]'}
    )
    assert build_joint(graph, ["a0"]).grads == [0]  # NOTE: eager's gradient is zeros
    graph, _ = _graph("aten", [[x]], {"name": "_standard_gamma"})
    with pytest.raises(REFUSED, match=r"aten\._standard_gamma\.default draws"):
        build_joint(graph, ["a0"])
    # NOTE: tagged random, but train=False draws nothing: PyTorch's autograd runs it again
    attrs = {"name": "dropout", "literals": '[{"t": 0}, 0.4, false]'}
    _grads_match("aten", [[x]], attrs, lambda x: torch.ops.aten.dropout(x, 0.4, False), wrt=[0])


def test_gumbel_softmax_trains_through_draws_and_empty_like() -> None:
    """F.gumbel_softmax's ATen program: ``empty_like(x)`` (no gradient in eager), an
    ``exponential`` draw (a zero one), then arithmetic on x: eager's gradient under one seed."""
    x = _t(3, 5)
    b = GraphBuilder()
    xv = b.input("x", TensorType.of(x))
    (buf,) = b.call("aten", [xv], name="empty_like")
    (e,) = b.call("aten", [buf], name="exponential", literals='[{"t": 0}]')
    gumbels = b.call("neg", b.call("log", e))
    b.output(b.call("softmax", b.call("add", xv, gumbels), dim=-1))
    run, _ = _compiled(b.build(), ["x"])
    ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    cot = _t(3, 5, seed=9)
    torch.manual_seed(2)
    run([ours])[0].backward(cot)
    torch.manual_seed(2)
    eager_e = torch.empty_like(ref).exponential_()
    torch.softmax(ref - eager_e.log(), dim=-1).backward(cot)
    assert ours.grad is not None and ref.grad is not None
    # NOTE: softmax's backward is the rule's formula, eager's its kernel: the contract's row
    tol = plait.contract.load().tolerance("reduction", F64)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=tol.rtol, atol=tol.atol)


def test_probing_a_call_leaves_the_generator_alone() -> None:
    x = _t(4, 3)
    graph, _ = _graph("random_call", [[x]], {"target": "torch.bernoulli", "out_types": "f64[4, 3]"})
    before = torch.get_rng_state()
    build_joint(graph, ["a0"])
    assert torch.equal(torch.get_rng_state(), before)


# --- random_call, opaque, aten_datadep -------------------------------------------------------


def test_random_call_gradients() -> None:
    x = _t(4, 3)
    # NOTE: rand_like's result is not differentiable in eager (no gradient); bernoulli's and
    # poisson's gradient is zeros (an optimizer steps on it: never None)
    for target, grads in (
        ("torch.rand_like", []),
        ("torch.bernoulli", [0]),
        ("torch.poisson", [0]),
    ):
        graph, _ = _graph("random_call", [[x.abs()]], {"target": target, "out_types": "f64[4, 3]"})
        assert build_joint(graph, ["a0"]).grads == grads, target
    # NOTE: torch.bernoulli(x, p): eager raises "derivative not implemented"; plait refuses too
    literals = '[{"t": 0}, 0.25]'
    graph, _ = _graph(
        "random_call",
        [[x]],
        {"target": "torch.bernoulli", "out_types": "f64[4, 3]", "literals": literals},
    )
    with pytest.raises(REFUSED, match=r"random_call torch\.bernoulli"):
        build_joint(graph, ["a0"])
    graph, _ = _graph(
        "random_call",
        [[x]],
        {
            "target": "torch.nn.functional.rrelu",
            "out_types": "f64[4, 3]",
            "kwliterals": '{"training": true}',
        },
    )
    with pytest.raises(REFUSED, match=r"random_call torch\.nn\.functional\.rrelu"):
        build_joint(graph, ["a0"])


def test_opaque_refuses_a_random_target() -> None:
    x = _t(4, 3)
    graph, _ = _graph(
        "opaque",
        [[x]],
        {
            "target": "torch.nn.functional.rrelu",
            "out_types": "f64[4, 3]",
            "kwliterals": '{"training": true}',
        },
    )
    with pytest.raises(REFUSED, match=r"opaque torch\.nn\.functional\.rrelu draws"):
        build_joint(graph, ["a0"])
    # NOTE: a result PyTorch's autograd does not differentiate gets no cotangent
    graph, _ = _graph("opaque", [[x]], {"target": "torch.zeros_like", "out_types": "f64[4, 3]"})
    assert build_joint(graph, ["a0"]).grads == []


def test_masked_select_gradient() -> None:
    x = _t(4, 6)
    mask = x > 0.2
    attrs = {"name": "masked_select", "sizes": "dd0"}
    # NOTE: save-all only: min-cut weighs each value in bytes, and a data-dependent size has none
    # before it runs (partition.value_bytes raises on dd0)
    _grads_match(
        "aten_datadep", [[x, mask]], attrs, torch.masked_select, wrt=[0], partitioners=("save-all",)
    )


def test_cuda_sdpa_gradient_is_autograd_over_eagers_fused_kernel() -> None:
    """On CUDA, attention's gradient is PyTorch's autograd over the call (eager picks its fused
    kernel and that kernel's backward), not the float32 math the CPU rule writes."""
    b = GraphBuilder()
    half = [b.input(n, TensorType((2, 4, 16, 8), torch.bfloat16, "cuda:0")) for n in "qkv"]
    b.output(b.call("scaled_dot_product_attention", *half, None, is_causal=True))
    joint = build_joint(b.build(), ["q", "k", "v"])
    ops = [n.op for n in joint.graph.nodes]
    vjps = [n for n in joint.graph.nodes if n.op == "torch_vjp"]
    assert len(vjps) == 1 and vjps[0].attrs["of"] == "scaled_dot_product_attention"
    assert "matmul" not in ops and "softmax" not in ops
