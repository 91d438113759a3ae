"""Derivative rules of reductions, the softmax family and normalizations against PyTorch autograd
and finite differences."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import torch

import plait.contract
from plait.autograd import CompiledAutograd, build_joint, partition
from plait.conformance.gradcheck import gradcheck_fd
from plait.ir import Category, GraphBuilder, TensorType, all_ops, get_op
from plait.ir.ops.vjp import is_differentiable
from tests.autograd.vjp_check import check_op, differentiable_samples

F64 = torch.float64
# NOTE: check_op differentiates every float64 operand and output. Eager refuses a running
# statistic that requires grad ('native_batch_norm is not differentiable with respect to
# argument running_mean'), and finite differences need float64 outputs (softmax's dtype=float32
# sample): these ops are checked below with the running statistics held constant, and without
# finite differences for a result that is not float64.
OWN_CHECK = ("batch_norm", "batch_norm_train", "log_softmax", "softmax")
OPS = sorted(
    n
    for n, o in all_ops().items()
    if o.category is Category.REDUCTION and is_differentiable(n) and n not in OWN_CHECK
)


@pytest.mark.parametrize("op", OPS)
def test_reduction_vjp(op: str) -> None:
    check_op(op)


class Compiled:
    """``op(*args, **attrs)`` as a compiled-autograd callable over its tensor operands,
    differentiated with respect to the operands at flat positions ``wrt``."""

    def __init__(
        self, op: str, args: Sequence[Any], attrs: dict[str, Any], wrt: Sequence[int],
        partitioner: str = "min-cut",
    ) -> None:  # fmt: skip
        self.op, self.args = op, list(args)
        self.attrs = get_op(op).check_attrs(attrs)
        b = GraphBuilder()
        operands: list[Any] = []
        self.positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        for i, a in enumerate(args):
            operands.append(b.input(f"a{i}", TensorType.of(a)) if i in self.positions else a)
        outs = b.call(op, *operands, **self.attrs)
        b.output(*(outs if isinstance(outs, tuple) else (outs,)))
        graph = b.build()
        self.joint = build_joint(graph, [f"a{i}" for i in wrt])
        self.part = partition(self.joint, partitioner)
        self.run = CompiledAutograd.interpreted(
            self.part, n_inputs=len(graph.inputs), n_outputs=len(graph.outputs),
            cotangents=self.joint.cotangents, grads=self.joint.grads, name=op,
        )  # fmt: skip

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        return list(self.run(list(tensors)))

    def reference(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        flat = list(self.args)
        for i, t in zip(self.positions, tensors):
            flat[i] = t
        return list(get_op(self.op).run(flat, self.attrs))


def _prefixed(prefix: str, message: str) -> str:
    return f"{prefix}: {message}"


def check(
    op: str, args: Sequence[Any], attrs: dict[str, Any], wrt: Sequence[int],
    *, outputs: int | None = None, fd: bool = True, where: str = "",
    ref_wrt: Sequence[int] = (),
) -> None:  # fmt: skip
    """Gradients of the operands at ``wrt`` through the first ``outputs`` outputs (default all)
    equal autograd's on the reference (the other operands held constant; those at ``ref_wrt``
    require grad there too); finite differences too when ``fd`` and everything is float64.
    Gradients of the other operands must be none."""
    tol = plait.contract.load().gradcheck
    where = f"{op} {where}"
    for partitioner in ("save-all", "min-cut"):
        c = Compiled(op, args, attrs, wrt, partitioner)
        tensors = [args[i] for i in c.positions]
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
        ours = c(*leaves)
        n_out = len(ours) if outputs is None else outputs
        gen = torch.Generator().manual_seed(1)
        cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in ours]
        diff = [leaves[c.positions.index(i)] for i in wrt]
        got = torch.autograd.grad(ours[:n_out], diff, cots[:n_out], retain_graph=True)
        refs = [t.detach().clone() for t in tensors]
        for i in (*wrt, *ref_wrt):
            refs[c.positions.index(i)].requires_grad_(True)
        ref_diff = [refs[c.positions.index(i)] for i in wrt]
        want = torch.autograd.grad(c.reference(*refs)[:n_out], ref_diff, cots[:n_out])
        for k, (a, e) in enumerate(zip(got, want, strict=True)):
            assert a.dtype == e.dtype and a.shape == e.shape, f"{where}: gradient {k}'s type"
            what = f"{where} {partitioner}: gradient {k} differs"
            torch.testing.assert_close(
                a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True, msg=partial(_prefixed, what)
            )
        others = [t for t in leaves if t.requires_grad and not any(t is d for d in diff)]
        if others:
            for g in torch.autograd.grad(ours, others, cots, allow_unused=True):
                assert g is None or not g.any(), f"{where}: a constant operand got a gradient"
    if fd and all(o.dtype == F64 for o in ours[:n_out]) and all(t.dtype == F64 for t in diff):
        at = [c.positions.index(i) for i in wrt]

        def f(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            full = list(tensors)
            for p, x in zip(at, xs):
                full[p] = x
            return tuple(c(*full)[:n_out])

        gradcheck_fd(f, tuple(tensors[p] for p in at)).raise_if_failed()


@pytest.mark.parametrize("op", OWN_CHECK)
def test_vjp_with_constant_operands(op: str) -> None:
    """x, weight and bias through output 0 (the running statistics get no gradient); the
    softmax family with its dtype attribute."""
    samples = differentiable_samples(op)
    assert samples
    for s in samples:
        # NOTE: flat operands 0-2 of a batch norm are x, weight, bias; 3-4 its running stats
        wrt = [i for i, a in enumerate(s.args) if isinstance(a, torch.Tensor) and i < 3]
        check(op, s.args, s.attrs, wrt, outputs=1, where=s.desc)


def _rand(*shape: int, dtype: torch.dtype = F64, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_prod_with_zeros() -> None:
    """No zero, one zero and two zeros in a slice: eager's product of the other elements."""
    x = _rand(4, 5) + 2.0
    x[1, 2] = 0.0
    x[2, 0] = x[2, 3] = 0.0
    for dims, keep in (((1,), False), ((0,), True), ((-1,), True), (None, False), (None, True)):
        check("prod", [x], {"dims": dims, "keepdim": keep}, [0], where=f"dims={dims} {keep}")
    one = _rand(6) + 2.0
    one[4] = 0.0
    check("prod", [one], {"dims": None, "keepdim": False}, [0], where="one zero in all")
    check("prod", [torch.tensor(0.0, dtype=F64)], {"dims": None}, [0], where="0-dim zero")


@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_amin_ties_share_the_gradient(op: str) -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [-2.0, -2.0, 0.5, -2.0]], dtype=F64)
    for dims, keep in (((1,), False), ((0, 1), True), ((), False), (None, True)):
        # NOTE: a tie is a kink: no finite differences
        check(op, [x], {"dims": dims, "keepdim": keep}, [0], fd=False, where=f"{dims} {keep}")


def test_non_finite_inputs_follow_eager() -> None:
    """NaN and infinite elements propagate as in eager's formulas (no finite differences)."""
    inf, nan = float("inf"), float("nan")
    t = torch.tensor([[1.0, -inf, 2.0], [-inf, -inf, -inf], [nan, 0.5, 0.5]], dtype=F64)
    check("logsumexp", [t], {"dims": (1,)}, [0], fd=False)
    check("softmax", [t[:1]], {"dim": 1}, [0], fd=False)
    check("log_softmax", [t[:1]], {"dim": 1}, [0], fd=False)
    for op in ("amax", "amin"):
        check(op, [t], {"dims": (1,), "keepdim": True}, [0], fd=False)
    check("nansum", [t], {"dims": (0,)}, [0], fd=False)
    # NOTE: prod matches eager at infinite or NaN elements where the tensor has no zero (see its
    # rule)
    p = torch.tensor([[3.0, -inf, 2.0], [nan, 2.0, 1.0], [inf, inf, 0.5]], dtype=F64)
    check("prod", [p], {"dims": (1,)}, [0], fd=False)


def test_dtype_attributes() -> None:
    """A reduction to another dtype: the gradient is computed in the result's dtype, then cast."""
    x = _rand(4, 6).abs() + 0.5
    for op in ("sum", "mean", "nansum", "prod"):
        for dt in (torch.float32, F64):
            check(op, [x.float()], {"dims": (1,), "dtype": dt}, [0], where=f"f32 to {dt}")
            check(op, [x], {"dims": (1,), "dtype": dt}, [0], where=f"f64 to {dt}")
    for op in ("softmax", "log_softmax"):
        check(op, [x.float()], {"dim": 0, "dtype": F64}, [0], where="f32 to f64")


def test_var_corrections() -> None:
    x = _rand(3, 4)
    cases = (((1,), 2, False), (None, 0.5, True), ((0,), 1.5, False), ((0, 1), 1, True))
    for dims, corr, keep in cases:
        check("var", [x], {"dims": dims, "correction": corr, "keepdim": keep}, [0], where=str(corr))


@pytest.mark.filterwarnings("ignore:var..?. degrees of freedom is <= 0:UserWarning")
def test_var_without_degrees_of_freedom() -> None:
    """correction >= n: eager's 2 / (n - correction) (inf at 0, negative below)."""
    x = _rand(3, 4)
    x[:, 1] = 0.5
    for dims, corr in (((0,), 3), ((0,), 4), (None, 12), ((1,), 5.5)):
        attrs = {"dims": dims, "correction": corr}
        check("var", [x], attrs, [0], fd=False, where=f"{dims} correction={corr}")


NORMS: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("layer_norm", [_rand(2, 3, 4), _rand(4, seed=1), _rand(4, seed=2)],
     {"normalized_shape": (4,), "eps": 1e-5}),
    ("layer_norm", [_rand(2, 3, 4), _rand(3, 4, seed=1), None], {"normalized_shape": (3, 4)}),
    ("group_norm", [_rand(2, 6, 3), _rand(6, seed=1), _rand(6, seed=2)], {"num_groups": 2}),
    # NOTE: not (weight None, bias given): eager's backward of that fails ('tensor does not
    # have a device', torch 2.10)
    ("group_norm", [_rand(3, 4), _rand(4, seed=1), None], {"num_groups": 4}),
    ("batch_norm", [_rand(3, 4, 2, 2), _rand(4, seed=1), _rand(4, seed=2), _rand(4, seed=3),
                    _rand(4, seed=4).abs()], {"eps": 1e-5}),
    ("batch_norm_train", [_rand(3, 4, 5), _rand(4, seed=1), _rand(4, seed=2), _rand(4, seed=3),
                          _rand(4, seed=4).abs()], {"momentum": 0.1}),
    ("batch_norm_train", [_rand(5, 4), None, _rand(4, seed=2), None, None], {}),
]  # fmt: skip


def _operands(args: Sequence[Any]) -> list[int]:
    """Flat positions of x, weight and bias given (a norm's 3-4 are its running statistics)."""
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i < 3]


@pytest.mark.parametrize("case", range(len(NORMS)))
def test_norm_gradients_of_each_operand_subset(case: int) -> None:
    """Each subset of (x, weight, bias): only what is asked is computed, and it is right."""
    op, args, attrs = NORMS[case]
    given = _operands(args)
    for n in range(1, len(given) + 1):
        for wrt in itertools.combinations(given, n):
            # NOTE: eager's group_norm backward fails when only its bias requires grad
            check(op, args, attrs, list(wrt), outputs=1, where=f"wrt={wrt}", ref_wrt=given)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_gradients_as_accurate_as_eager(dtype: torch.dtype) -> None:
    """16-bit norms and softmaxes compute in float32 (as eager's kernels do) and return each
    operand's dtype; their worst error against float64 stays within the contract's model rule
    of eager's own error."""
    contract = plait.contract.load()
    tail, floor = contract.model_tail_factor(dtype), contract.model_floor(dtype)
    u = torch.finfo(dtype).eps / 2
    cases = [
        *NORMS,
        ("softmax", [_rand(3, 5) * 3], {"dim": 1}),
        ("log_softmax", [_rand(3, 5) * 3], {"dim": 0}),
    ]
    for op, wide, attrs in cases:
        args = [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in wide]
        wrt = _operands(args)
        c = Compiled(op, args, attrs, wrt)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        ours = _grads(c, c.positions, wrt, tensors)
        eager = _grads(c.reference, c.positions, wrt, tensors)
        exact = _grads(c.reference, c.positions, wrt, [t.double() for t in tensors])
        for i, o, e, z in zip(wrt, ours, eager, exact, strict=True):
            assert o.dtype == dtype and o.shape == args[i].shape, f"{op} operand {i}"
            scale = float(z.abs().max())
            err = float((o.double() - z).abs().max())
            eager_err = float((e.double() - z).abs().max())
            assert err <= tail * eager_err + floor * u * scale, (
                f"{op} operand {i} in {dtype}: error {err:.3g}, eager's {eager_err:.3g}"
            )


def _grads(
    run: Any, positions: list[int], wrt: list[int], tensors: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Gradients of ``run``'s output 0 with respect to the operands at ``wrt``."""
    leaves = [t.detach().clone().requires_grad_(i in wrt) for i, t in zip(positions, tensors)]
    out = run(*leaves)[0]
    cot = _rand(*out.shape, seed=7).to(out.dtype)
    return torch.autograd.grad(out, [t for t in leaves if t.requires_grad], cot)
