"""Padding, roll, flip, repeat, gather and the other data-movement calls compile into Stax's
native kernels (no opaque node, no fallback) and equal eager PyTorch bitwise.

Each case runs inside a pointwise chain (an op before and after it), so the generated C++ reads
through the movement's index map; it is called on its capture sample and on fresh draws of
other values (index tensors drawn in range), with float, bfloat16, integer and bool inputs where
the op takes them, and with a non-contiguous input. These calls move data and do no arithmetic:
bitwise equality is the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import assert_bitwise

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-movement")]

ALL_DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
NUMBERS = (torch.float32, torch.bfloat16, torch.int32)
FLOATS = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Any]
    shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    # NOTE: an index operand: (shape, exclusive upper bound, lowest value)
    index: tuple[tuple[int, ...], int, int] | None = None


def _pre(x: torch.Tensor) -> torch.Tensor:
    """A pointwise op in front of (and behind) the movement: the chain fuses."""
    if x.dtype == torch.bool:
        return torch.logical_not(x)
    return x - 1 if not x.is_floating_point() else x * 2


def _chain(op: Callable[..., Any]) -> Callable[..., Any]:
    def fn(x: torch.Tensor, *rest: torch.Tensor) -> Any:
        out = op(_pre(x), *rest)
        if isinstance(out, tuple):
            return tuple(_pre(o) for o in out)
        return _pre(out)

    return fn


CASES = [
    Case("pad-constant", lambda x: F.pad(x, (1, 2, -1, 3)), (2, 3, 5, 6)),
    Case("pad-constant-value", lambda x: F.pad(x, (2, 0, 0, 1), value=3), (3, 4), NUMBERS),
    Case("pad-constant-fraction", lambda x: F.pad(x, (1, 1), value=-1.75), (4, 3), FLOATS),
    Case("pad-constant-bool", lambda x: F.pad(x, (1, 1), value=True), (4, 3), (torch.bool,)),
    Case("pad-constant-empty", lambda x: F.pad(x, (1, 1, 2, 0), value=2), (0, 3), NUMBERS),
    Case("pad-crop", lambda x: F.pad(x, (-2, -1, 0, -1)), (4, 6)),
    Case("constant_pad_nd", lambda x: torch.constant_pad_nd(x, (1, 1), 5), (3, 4), NUMBERS),
    Case("pad-reflect", lambda x: F.pad(x, (2, 1, 1, 3), mode="reflect"), (2, 3, 5, 6), NUMBERS),
    Case("pad-reflect-crop", lambda x: F.pad(x, (-1, 3), mode="reflect"), (1, 2, 8), NUMBERS),
    Case(
        "pad-replicate",
        lambda x: F.pad(x, (1, 2, 0, 1, 2, 2), mode="replicate"),
        (1, 2, 3, 4, 5),
        NUMBERS,
    ),
    Case("pad-replicate-crop", lambda x: F.pad(x, (3, -2), mode="replicate"), (2, 6), NUMBERS),
    Case("pad-circular", lambda x: F.pad(x, (2, -1, 3, 3), mode="circular"), (2, 3, 5, 6), NUMBERS),
    Case("roll", lambda x: torch.roll(x, (2, -7), (1, 3)), (2, 3, 5, 6)),
    Case("roll-flat", lambda x: x.roll(5), (3, 4)),
    Case("roll-empty", lambda x: x.roll(1, 0), (0, 4)),
    Case("flip", lambda x: torch.flip(x, (0, 3)), (2, 3, 5, 6)),
    Case("flip-0d", lambda x: torch.flip(x, ()), ()),
    Case("flip-keyword", lambda x: torch.flip(x, dims=(0, 1, 2)), (2, 3, 4)),
    Case("flip-no-dims", lambda x: (torch.flip(x, dims=()), x.flip([])), (2, 3, 4)),
    Case("fliplr-flipud", lambda x: (torch.fliplr(x), x.flipud()), (3, 4)),
    Case("rot90", lambda x: (x.rot90(), torch.rot90(x, 2), torch.rot90(x, -1, (1, 0))), (3, 4)),
    Case("repeat", lambda x: x.repeat(2, 1, 1, 3), (3, 1, 4)),
    Case("repeat-0d", lambda x: x.repeat(2, 3), ()),
    Case("tile", lambda x: (x.tile(2), torch.tile(x, (2, 1, 3))), (3, 4)),
    Case(
        "repeat_interleave", lambda x: (x.repeat_interleave(3, 1), x.repeat_interleave(2)), (2, 3)
    ),
    Case("diagonal", lambda x: (x.diagonal(), torch.diagonal(x, -1, 2, 0)), (3, 4, 5)),
    Case("diag_embed", lambda x: (torch.diag_embed(x), x.diag_embed(-1, 0, 2)), (2, 3)),
    Case("diag", lambda x: (torch.diag(x[0], 1), x.diag(-1)), (3, 4)),
    Case("take", lambda x, i: torch.take(x, i), (3, 4), index=((2, 5), 12, -12)),
    Case("unfold", lambda x: x.unfold(2, 3, 2), (2, 3, 8)),
    Case("movedim", lambda x: (torch.movedim(x, (0, 1), (2, 0)), x.moveaxis(-1, 0)), (2, 3, 4)),
    Case("swapaxes", lambda x: torch.swapaxes(x, 0, 2), (2, 3, 4)),
    Case("broadcast_to", lambda x: torch.broadcast_to(x, (2, 3, 4, 6)), (3, 1, 6)),
    Case("expand_as", lambda x: x.expand_as(torch.empty(2, 3, 4)), (3, 1)),
    Case(
        "atleast",
        lambda x: (torch.atleast_1d(x), torch.atleast_2d(x), torch.atleast_3d(x)),
        (),
    ),
    Case("atleast-1d", lambda x: (torch.atleast_2d(x), torch.atleast_3d(x)), (5,)),
    Case("atleast-2d", lambda x: torch.atleast_3d(x, x), (3, 4)),
    Case("adjoints", lambda x: (x.mT, x.mH, x.adjoint()), (2, 3, 4)),
    Case("H", lambda x: x.H, (3, 4)),
    Case(
        "conj-of-real",
        lambda x: (x.conj(), torch.resolve_conj(x), x.resolve_neg(), x.conj_physical(), x.real),
        (3, 4),
        NUMBERS,  # NOTE: not(not(x)) of bool simplifies to x: no kernel left to check
    ),
    Case("narrow", lambda x: (x.narrow(1, 1, 2), x.narrow_copy(1, -3, 2)), (3, 5)),
    Case("gather", lambda x, i: torch.gather(x, 1, i), (3, 4, 5), index=((2, 6, 5), 4, 0)),
    Case("gather-method", lambda x, i: x.gather(-1, i), (4, 5), index=((4, 2), 5, 0)),
    Case(
        "gather-empty-index",
        lambda x, i: (x * 2 + torch.gather(x, 0, i[:, :0]).sum(), torch.gather(x, 0, i[:0])),
        (5,),
        index=((2, 3), 5, 0),
    ),
    Case(
        "take_along_dim",
        lambda x, i: torch.take_along_dim(x, i, 1),
        (3, 4, 5),
        index=((1, 2, 5), 4, -4),
    ),
    Case("take_along_dim-flat", lambda x, i: x.take_along_dim(i), (3, 4), index=((7,), 12, 0)),
    Case(
        "view-copies",
        lambda x: (
            torch.diagonal_copy(x, 1, 0, 2),
            torch.permute_copy(x, (2, 0, 1)),
            torch.transpose_copy(x, 0, 2),
            torch.expand_copy(x[:, :1], (2, 3, 4, 5)),
            torch.unfold_copy(x, 2, 2, 1),
            torch.view_copy(x, (12, 5)),
            torch.select_copy(x, 1, 2),
            *torch.split_with_sizes_copy(x, [1, 3], 1),
            *torch.unbind_copy(x, 2),
            torch.squeeze_copy(x[:1], 0),
            torch.t_copy(x[0]),
        ),
        (3, 4, 5),
    ),
    Case("ravel", lambda x: (x.ravel(), x.t().ravel()), (3, 4)),
    Case(
        "stacks",
        lambda x: (
            torch.hstack((x, x.flip(0))),
            torch.hstack((x[0, 0], x[1, 1])),
            torch.vstack([x[0, 0], x[1, 1]]),
            torch.dstack([x[0], x[1]]),
            torch.column_stack([x[0, 0], x[1].t()]),
        ),
        (3, 4, 5),
    ),
    Case(
        "splits",
        lambda x: (
            *torch.tensor_split(x, 3, dim=2),
            *x.tensor_split([1, 9], 1),
            *torch.hsplit(x, 2),
            *torch.vsplit(x, [1]),
            *torch.dsplit(x, [2, 3]),
        ),
        (3, 4, 5),
    ),
    Case(
        "scatters",
        lambda x: (
            torch.slice_scatter(x, x[:, 2:4].flip(1), 1, 1, 3),
            torch.slice_scatter(x, x[:2], 0, 1),
            torch.slice_scatter(x, x[:, :, :2].flip(2), 2, 1, None, 3),
            torch.select_scatter(x, x[:, 0], 1, -1),
            torch.diagonal_scatter(x, x[0, :, :3], 0, 0, 2),
            torch.diagonal_scatter(x, x[:, 0, :4], -1, 2, 1),
        ),
        (3, 4, 5),
    ),
    Case(
        "adaptive_avg_pool1d",
        lambda x: (F.adaptive_avg_pool1d(x, 3), F.adaptive_avg_pool1d(x, 7)),
        (2, 3, 7),
        FLOATS,
    ),
]


def _draw(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def _inputs(case: Case, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    x = _draw(case.shape, dtype, seed)
    if case.index is None:
        return (x,)
    shape, hi, lo = case.index
    g = torch.Generator().manual_seed(seed + 1000)
    return x, torch.randint(lo, hi, shape, generator=g)


def _params() -> list[Any]:
    return [
        pytest.param(case, dtype, id=f"{case.name}-{str(dtype)[6:]}")
        for case in CASES
        for dtype in case.dtypes
    ]


def _same(got: Any, want: Any, what: str) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for k, (a, b) in enumerate(zip(got, want)):
            assert_bitwise(a, b, f"{what}[{k}]")
    else:
        assert_bitwise(got, want, what)


def _no_fallback(compiled: Any) -> None:
    for spec in compiled.specializations:
        assert spec.graph is not None and spec.fallback_reason is None
        assert not [n for n in spec.graph.nodes if n.op == "opaque"]
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0 and counts["native"] > 0, counts


@pytest.mark.parametrize(("case", "dtype"), _params())
def test_movement_is_native_and_bitwise_eager(case: Case, dtype: torch.dtype) -> None:
    fn = _chain(case.fn)
    compiled = plait.compile(fn, backend="stax", fullgraph=True)
    for seed in (0, 1, 2):
        xs = _inputs(case, dtype, seed)
        _same(compiled(*xs), fn(*xs), f"{case.name} {dtype} draw {seed}")
    _no_fallback(compiled)


@pytest.mark.parametrize("case", [c for c in CASES if len(c.shape) >= 2], ids=lambda c: c.name)
def test_movement_of_a_non_contiguous_input(case: Case) -> None:
    fn = _chain(case.fn)
    compiled = plait.compile(fn, backend="stax", fullgraph=True)
    for seed in (3, 4):
        dtype = case.dtypes[0]
        x, *rest = _inputs(case, dtype, seed)
        wide = _draw((*case.shape[:-1], case.shape[-1] * 2), dtype, seed + 7)
        strided = wide[..., ::2]
        strided.copy_(x)
        assert not strided.is_contiguous() or strided.numel() <= 1
        _same(compiled(strided, *rest), fn(strided, *rest), f"{case.name} strided draw {seed}")
    _no_fallback(compiled)


def test_gather_out_of_range_index_raises_like_eager() -> None:
    fn = _chain(lambda x, i: torch.gather(x, 1, i))
    compiled = plait.compile(fn, backend="stax", fullgraph=True)
    x = _draw((3, 4), torch.float32, 0)
    ok = torch.randint(0, 4, (3, 2), generator=torch.Generator().manual_seed(5))
    _same(compiled(x, ok), fn(x, ok), "in range")
    for bad in (ok + 4, ok - 5):
        with pytest.raises(RuntimeError):
            fn(x, bad)
        with pytest.raises((RuntimeError, IndexError)):
            compiled(x, bad)


def test_flip_of_a_reshape_reads_the_right_elements() -> None:
    """A flipped index (n-1-i) read through a reshape of a transpose is divided and reduced
    modulo the rows separately: its remainder part is negative, so C++'s truncating division
    must see the whole index (it read out of bounds)."""
    fn = _chain(lambda x: (torch.flip(x.t().reshape(6), (0,)), x.t().reshape(2, 3).flip(1)))
    compiled = plait.compile(fn, backend="stax", fullgraph=True)
    for seed in (0, 1):
        x = _draw((2, 3), torch.float32, seed)
        _same(compiled(x), fn(x), f"draw {seed}")
    _no_fallback(compiled)
