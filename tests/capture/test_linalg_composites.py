"""``einsum``, ``baddbmm``, ``addbmm``, ``addmv``, ``addr``, ``outer``, ``mv``, ``diff`` and
``rms_norm`` are written with plait's own ops (``plait.frontend.lower_linalg``): each compiles in
Stax with no opaque node and matches eager on fresh inputs under its op class's contract row; the
forms the rules do not cover are traced to ATen ops (native IR ops or typed extern nodes, no
opaque node), and still match eager."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.conformance
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise


def _shapes(*shapes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Callable[[int], Any]:
    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(*s, generator=g).to(dtype) for s in shapes)

    return draw


def _judge(program: Callable[..., Any], draw: Callable[[int], Any], op_class: str) -> Any:
    compiled = plait.compile(program, backend="stax", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        compiled(*draw(100))
    report = plait.conformance.check(program, compiled, draw, op_class=op_class, draws=3)
    assert report.ok, str(report)
    for spec in compiled.specializations:
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0, counts
    return compiled


EINSUMS = {
    "batched-matmul": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    "transposed-rhs": ("ij,kj->ik", [(3, 4), (5, 4)]),
    "attention-scores": ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 6, 8)]),
    "ellipsis": ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    "full-sum": ("ij->", [(3, 4)]),
    "row-sum": ("ij->i", [(3, 4)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "chain-of-three": ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    "implicit-output": ("ij,jk", [(2, 3), (3, 4)]),
    "summed-before-product": ("ijk,jl->il", [(2, 3, 4), (3, 5)]),
    "batched-dot": ("bi,bi->b", [(4, 6), (4, 6)]),
    "spaces": (" b i , b i -> b ", [(4, 6), (4, 6)]),
    "sublist": ([0, 1], [(2, 3), (3, 4)]),
}


@pytest.mark.parametrize("name", sorted(EINSUMS))
def test_einsum_is_permutes_reshapes_and_bmm(name: str) -> None:
    equation, shapes = EINSUMS[name]
    if isinstance(equation, list):  # NOTE: the sublist form; torch.einsum spells it as a string

        def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.einsum(x, [0, 1], y, [1, 2])
    else:

        def program(*xs: torch.Tensor) -> torch.Tensor:
            return torch.einsum(equation, *xs)

    _judge(program, _shapes(*shapes), "matmul")


def test_einsum_that_only_permutes_returns_a_view_of_its_operand_as_eager() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ijk->kji", x)

    compiled = _judge(program, _shapes((2, 3, 4)), "data_movement")
    x = torch.randn(2, 3, 4)
    out = compiled(x)
    x.add_(1.0)  # NOTE: a view shows its base's later writes
    assert_bitwise(out, program(x), "the view after its base's write")


def test_einsum_with_nothing_contracted_keeps_signed_zeros_as_eager() -> None:
    """A batched outer product is one multiply per element (a GEMM would add it to +0.0 and
    turn eager's -0.0 into +0.0)."""

    def program(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bi,bj->bij", a, b)

    compiled = plait.compile(program, backend="stax", fullgraph=True)
    for seed in (0, 1):
        a, b = _shapes((3, 4), (3, 5))(seed)
        b[:, ::2] = 0.0  # NOTE: negative x 0.0 is -0.0 in eager
        assert_bitwise(compiled(a, b), program(a, b), f"draw {seed}")


@pytest.mark.parametrize(
    "program,shapes",
    [
        (lambda b, x, y: torch.baddbmm(b, x, y), [(2, 3, 4), (2, 3, 5), (2, 5, 4)]),
        (lambda b, x, y: torch.baddbmm(b, x, y, beta=0.5, alpha=-2),
         [(2, 3, 4), (2, 3, 5), (2, 5, 4)]),
        (lambda b, x, y: b.baddbmm(x, y, beta=0.0), [(2, 3, 4), (2, 3, 5), (2, 5, 4)]),
        (lambda b, x, y: torch.addbmm(b, x, y), [(3, 4), (2, 3, 5), (2, 5, 4)]),
        (lambda b, m, v: torch.addmv(b, m, v, alpha=3), [(3,), (3, 4), (4,)]),
        (lambda m, v: torch.mv(m, v), [(3, 4), (4,)]),
        (lambda m, a, b: torch.addr(m, a, b, beta=2), [(3, 4), (3,), (4,)]),
        (lambda a, b: torch.outer(a, b) + a.ger(b), [(3,), (4,)]),
    ],
    ids=["baddbmm", "baddbmm-scaled", "baddbmm-beta0", "addbmm", "addmv", "mv", "addr", "outer"],
)  # fmt: skip
def test_blas_composites(program: Callable[..., Any], shapes: list[tuple[int, ...]]) -> None:
    _judge(program, _shapes(*shapes), "matmul")


def test_beta_zero_ignores_nan_in_input_as_blas_does() -> None:
    def program(b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(b, x, y, beta=0)

    compiled = plait.compile(program, backend="stax", fullgraph=True)
    b, x, y = torch.full((2, 3, 4), float("nan")), torch.randn(2, 3, 5), torch.randn(2, 5, 4)
    got, want = compiled(b, x, y), program(b, x, y)
    assert not want.isnan().any() and not got.isnan().any()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "program,shapes,dtype",
    [
        (lambda x: torch.diff(x), [(3, 5)], torch.float32),
        (lambda x: x.diff(n=2, dim=0), [(5, 3)], torch.float32),
        (lambda x, p, a: torch.diff(x, prepend=p, append=a), [(3, 4), (3, 2), (3, 1)],
         torch.float32),
        (lambda x: torch.diff(x > 0), [(4, 6)], torch.float32),
        (lambda x: torch.diff(x), [(7,)], torch.int64),
    ],
    ids=["default", "n2-dim0", "prepend-append", "bool", "int"],
)  # fmt: skip
def test_diff(
    program: Callable[..., Any], shapes: list[tuple[int, ...]], dtype: torch.dtype
) -> None:
    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        if dtype == torch.int64:
            return tuple(torch.randint(-50, 50, s, generator=g) for s in shapes)
        return tuple(torch.randn(*s, generator=g) for s in shapes)

    _judge(program, draw, "pointwise")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_rms_norm(dtype: torch.dtype, weighted: bool) -> None:
    def program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (6,), w if weighted else None, eps=1e-5) + F.rms_norm(x, [4, 6])

    _judge(program, _shapes((3, 4, 6), (6,), dtype=dtype), "normalization")


def _integer_baddbmm(b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.baddbmm(*(t.mul(4).long() for t in (b, x, y))).float()


@pytest.mark.parametrize(
    "program,args",
    [
        (lambda x: torch.einsum("ii->i", x), [(4, 4)]),
        (lambda x, y: torch.einsum("ij,jk->ik", x, y), [(2, 1), (3, 4)]),
        (_integer_baddbmm, [(2, 3, 4), (2, 3, 5), (2, 5, 4)]),
    ],
    ids=["diagonal", "broadcast", "integer"],
)  # fmt: skip
def test_forms_with_no_rule_are_traced_to_aten_ops(
    program: Callable[..., Any], args: list[tuple[int, ...]]
) -> None:
    draw = _shapes(*args)
    compiled = plait.compile(program, backend="stax", fullgraph=True)
    compiled(*draw(0))
    (spec,) = compiled.specializations
    assert not spec.opaque_counts and not spec.manifest.fallbacks
    report = plait.conformance.check(program, compiled, draw, op_class="matmul", draws=2)
    assert report.ok, str(report)
