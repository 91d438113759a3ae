"""The op database: generated samples for every registered op.

Each sample holds the op's operands and attributes and, separately, the PyTorch call a user would
write for the same thing (operators, Tensor methods, ``torch.nn.functional``). The reference
implementation must equal that call bitwise. Samples cover odd sizes, broadcasting, non-contiguous
inputs, size-1 and size-0 dims and every dtype the op declares.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from plait.ir.ops import all_ops
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES


@dataclass
class Sample:
    op: str
    args: list[Any]
    attrs: dict[str, Any]
    torch_fn: Callable[[], Any]
    desc: str = ""
    # positions (into args) whose dims must stay static when the type rule is run symbolically
    static: set[int] = field(default_factory=set)


class Maker:
    """Random tensors: never all zeros, optionally non-contiguous."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def __call__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        *,
        noncontig: bool = False,
        low: float = -3.0,
        high: float = 3.0,
        positive: bool = False,
    ) -> torch.Tensor:
        if noncontig and len(shape) >= 1:
            # build a tensor twice as wide in the last dim, take every other element
            base = self(
                (*tuple(shape[:-1]), shape[-1] * 2), dtype, low=low, high=high, positive=positive
            )
            out = base[..., ::2]
            assert not out.is_contiguous() or out.numel() <= 1
            return out
        if dtype == torch.bool:
            return torch.rand(shape, generator=self.g) > 0.5
        if dtype in INT_DTYPES:
            lo = 1 if positive else max(int(low), 0 if dtype == torch.uint8 else -100)
            hi = max(int(high), lo + 1)
            return torch.randint(lo, hi + 1, shape, generator=self.g).to(dtype)
        t = torch.rand(shape, generator=self.g, dtype=torch.float64)
        lo = 0.1 if positive else low
        return (lo + (high - lo) * t).to(dtype)


UNARY_SHAPES: list[tuple[tuple[int, ...], bool]] = [
    ((3, 5, 7), False),
    ((5, 7), True),
    ((1,), False),
    ((0, 3), False),
    ((), False),
    ((4, 1, 3), True),
]
BINARY_SHAPES: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = [
    ((3, 5), (3, 5), False),
    ((3, 1, 5), (4, 5), False),
    ((0, 3), (1, 3), False),
    ((), (2, 3), False),
    ((5, 7), (7,), True),
    ((2, 3), (), False),
]
REDUCE_CASES: list[tuple[tuple[int, ...], tuple[int, ...] | None, bool, bool]] = [
    ((3, 5, 7), (1,), False, False),
    ((3, 5, 7), (0, 2), True, False),
    ((5, 7), None, False, True),
    ((4, 1, 3), (-1,), False, False),
    ((0, 3), (1,), False, False),
    ((), None, False, False),
    ((6, 3), (0,), True, True),
]


def _float_or_all(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES


UNARY_FNS: dict[str, Callable[..., Any]] = {
    "relu": lambda x: F.relu(x),
    "silu": lambda x: F.silu(x),
    "sigmoid": lambda x: torch.sigmoid(x),
    "tanh": lambda x: x.tanh(),
    "exp": lambda x: x.exp(),
    "log": lambda x: torch.log(x),
    "sqrt": lambda x: x.sqrt(),
    "rsqrt": lambda x: x.rsqrt(),
    "erf": lambda x: torch.special.erf(x),
    "reciprocal": lambda x: x.reciprocal(),
    "neg": lambda x: -x,
    "abs": lambda x: abs(x),
    "logical_not": lambda x: x.logical_not(),
}


def gen_unary(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    positive = op in ("log", "sqrt", "rsqrt")
    for shape, nc in UNARY_SHAPES:
        x = make(shape, dtype, noncontig=nc, positive=positive)
        yield Sample(op, [x], {}, lambda x=x: UNARY_FNS[op](x), f"{shape} nc={nc}")
    # out-of-domain values must agree too (NaN and inf positions)
    if positive and dtype in FLOAT_DTYPES:
        x = make((7,), dtype, low=-2.0, high=2.0)
        yield Sample(op, [x], {}, lambda x=x: UNARY_FNS[op](x), "out of domain")


def gen_gelu(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for approximate in ("none", "tanh"):
        for shape, nc in UNARY_SHAPES:
            x = make(shape, dtype, noncontig=nc)
            yield Sample(
                "gelu",
                [x],
                {"approximate": approximate},
                lambda x=x, a=approximate: F.gelu(x, approximate=a),
                f"{shape} {approximate}",
            )


def gen_to_dtype(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for target in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool):
        for shape, nc in UNARY_SHAPES[:4]:
            x = make(shape, dtype, noncontig=nc)
            yield Sample(
                "to_dtype",
                [x],
                {"dtype": target},
                lambda x=x, t=target: x.to(t),
                f"{shape} -> {target}",
            )


BINARY_FNS: dict[str, Callable[..., Any]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a**b,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
}
SCALAR_FIRST = ("add", "sub", "mul", "pow")


def _scalar_for(dtype: torch.dtype, op: str) -> list[Any]:
    if op == "pow":
        return [2, 0.5] if dtype in FLOAT_DTYPES else [2]
    if dtype == torch.bool:
        return [True]
    return [2, -1.5] if op != "div" else [3, 0.25]


def gen_binary(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = BINARY_FNS[op]
    integral = dtype not in FLOAT_DTYPES
    pos = op == "pow" or (op == "div" and integral)
    for sa, sb, nc in BINARY_SHAPES:
        a = make(
            sa,
            dtype,
            noncontig=nc and len(sa) > 0,
            low=0.0 if op == "pow" else -3.0,
            high=3.0,
            positive=op == "pow" and integral,
        )
        b = make(sb, dtype, noncontig=nc and len(sb) > 0, positive=pos, high=3.0)
        yield Sample(op, [a, b], {}, lambda a=a, b=b: fn(a, b), f"{sa} {sb} nc={nc}")
    if op in ("maximum", "minimum", "logical_and", "logical_or"):
        return
    a = make((3, 4), dtype, positive=op == "pow" and integral)
    for s in _scalar_for(dtype, op):
        if op in ("sub", "neg") and dtype == torch.bool:
            continue
        yield Sample(op, [a, s], {}, lambda a=a, s=s: fn(a, s), f"tensor op {s!r}")
        if op in SCALAR_FIRST:
            yield Sample(op, [s, a], {}, lambda a=a, s=s: fn(s, a), f"{s!r} op tensor")
    if op in ("add", "sub") and dtype != torch.bool:
        b = make((3, 4), dtype)
        yield Sample(
            op, [a, b], {"alpha": 2}, lambda a=a, b=b: getattr(torch, op)(a, b, alpha=2), "alpha=2"
        )
    if op == "div":
        b = make((3, 4), dtype, positive=True)
        for mode in ("trunc", "floor"):
            yield Sample(
                op,
                [a, b],
                {"rounding_mode": mode},
                lambda a=a, b=b, m=mode: torch.div(a, b, rounding_mode=m),
                mode,
            )


def gen_where(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    cond = make((3, 1, 5), torch.bool)
    a, b = make((4, 5), dtype), make((3, 4, 1), dtype, noncontig=True)
    yield Sample("where", [cond, a, b], {}, lambda: torch.where(cond, a, b), "broadcast")
    s = True if dtype == torch.bool else 2
    yield Sample("where", [cond, s, b], {}, lambda: torch.where(cond, s, b), "scalar a")
    c0 = make((0, 5), torch.bool)
    a0 = make((0, 5), dtype)
    yield Sample("where", [c0, a0, s], {}, lambda: torch.where(c0, a0, s), "size 0")
    if dtype in FLOAT_DTYPES:
        keep = make((4, 5), torch.bool)
        yield Sample(
            "where",
            [keep, a, float("-inf")],
            {},
            lambda: a.masked_fill(~keep, float("-inf")),
            "masked_fill spelling",
        )


def gen_clamp(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, nc in UNARY_SHAPES:
        x = make(shape, dtype, noncontig=nc)
        yield Sample("clamp", [x], {"min": -1, "max": 2}, lambda x=x: x.clamp(-1, 2), f"{shape}")
    x = make((4, 5), dtype)
    yield Sample("clamp", [x], {"min": 0}, lambda: torch.clamp(x, min=0), "min only")
    yield Sample("clamp", [x], {"max": 1.5}, lambda: torch.clamp(x, max=1.5), "float max")


def gen_tri(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, diag in (((5, 5), 0), ((3, 4, 6), 1), ((2, 7, 3), -1), ((0, 3), 0)):
        x = make(shape, dtype)
        yield Sample(
            op,
            [x],
            {"diagonal": diag},
            lambda x=x, d=diag: getattr(x, op)(diagonal=d),
            f"{shape} {diag}",
        )


REDUCE_FNS: dict[str, Callable[..., Any]] = {
    "sum": lambda x, dims, k, **kw: (
        x.sum(dims, keepdim=k, **kw)
        if dims
        else x.sum(**kw)
        if not k
        else x.sum(tuple(range(x.dim())), keepdim=True, **kw)
    ),
    "mean": lambda x, dims, k, **kw: (
        x.mean(dims, keepdim=k, **kw)
        if dims
        else x.mean(**kw)
        if not k
        else x.mean(tuple(range(x.dim())), keepdim=True, **kw)
    ),
    "amax": lambda x, dims, k: x.amax(dims if dims else (), keepdim=k),
    "amin": lambda x, dims, k: torch.amin(x, dims if dims else (), keepdim=k),
}


def gen_reduce(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = REDUCE_FNS[op]
    for shape, dims, keep, nc in REDUCE_CASES:
        if op in ("amax", "amin") and 0 in shape:
            continue
        x = make(shape, dtype, noncontig=nc)
        attrs = {"dims": dims, "keepdim": keep}
        yield Sample(
            op,
            [x],
            attrs,
            lambda x=x, d=dims, k=keep: fn(x, d, k),
            f"{shape} dims={dims} keep={keep}",
        )
    if op in ("sum", "mean") and dtype in FLOAT_DTYPES and dtype != torch.float64:
        x = make((4, 9), dtype)
        yield Sample(
            op,
            [x],
            {"dims": (1,), "dtype": torch.float64},
            lambda: fn(x, (1,), False, dtype=torch.float64),
            "accumulate in f64",
        )


def gen_var(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, dims, keep, nc in REDUCE_CASES:
        if 0 in shape or shape == ():
            continue
        for corr in (0, 1):
            x = make(shape, dtype, noncontig=nc)
            yield Sample(
                "var",
                [x],
                {"dims": dims, "correction": corr, "keepdim": keep},
                lambda x=x, d=dims, k=keep, c=corr: torch.var(x, d, correction=c, keepdim=k),
                f"{shape} {dims} corr={corr}",
            )


def gen_softmax(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    fn = F.softmax if op == "softmax" else F.log_softmax
    for shape, dim, nc in (
        ((3, 5, 7), -1, False),
        ((5, 7), 0, True),
        ((1,), 0, False),
        ((0, 3), 1, False),
        ((4, 1, 3), 1, False),
    ):
        x = make(shape, dtype, noncontig=nc, low=-30.0, high=30.0)
        yield Sample(op, [x], {"dim": dim}, lambda x=x, d=dim: fn(x, dim=d), f"{shape} dim={dim}")
    if dtype != torch.float32:
        x = make((4, 6), dtype)
        yield Sample(
            op,
            [x],
            {"dim": 1, "dtype": torch.float32},
            lambda: fn(x, dim=1, dtype=torch.float32),
            "dtype=f32",
        )


def gen_layer_norm(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    x = make((3, 5, 8), dtype)
    w, b = make((8,), dtype), make((8,), dtype)
    yield Sample(
        "layer_norm",
        [x, w, b],
        {"normalized_shape": (8,), "eps": 1e-5},
        lambda: F.layer_norm(x, (8,), w, b, eps=1e-5),
        "affine",
    )
    x2 = make((2, 3, 5), dtype, noncontig=True)
    yield Sample(
        "layer_norm",
        [x2, None, None],
        {"normalized_shape": (3, 5), "eps": 1e-6},
        lambda: F.layer_norm(x2, (3, 5), eps=1e-6),
        "no affine, 2 dims, nc",
    )
    x3 = make((0, 4), dtype)
    yield Sample(
        "layer_norm",
        [x3, None, None],
        {"normalized_shape": (4,)},
        lambda: F.layer_norm(x3, (4,)),
        "size 0",
    )


def gen_group_norm(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    x = make((2, 6, 5, 3), dtype)
    w, b = make((6,), dtype), make((6,), dtype)
    yield Sample(
        "group_norm",
        [x, w, b],
        {"num_groups": 3, "eps": 1e-5},
        lambda: F.group_norm(x, 3, w, b, 1e-5),
        "affine",
    )
    x2 = make((3, 4, 7), dtype, noncontig=True)
    yield Sample(
        "group_norm", [x2, None, None], {"num_groups": 1}, lambda: F.group_norm(x2, 1), "one group"
    )


def gen_batch_norm(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, nc in (((4, 6, 5, 3), False), ((5, 6), False), ((3, 6, 7), True)):
        x = make(shape, dtype, noncontig=nc)
        w, b = make((6,), dtype), make((6,), dtype)
        rm, rv = make((6,), dtype), make((6,), dtype, positive=True)
        yield Sample(
            "batch_norm",
            [x, w, b, rm, rv],
            {"eps": 1e-5},
            lambda x=x, w=w, b=b, rm=rm, rv=rv: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5),
            f"{shape}",
        )


def gen_batch_norm_train(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    def eager(x: Any, w: Any, b: Any, rm: Any, rv: Any, momentum: float) -> Any:
        rm2, rv2 = rm.clone(), rv.clone()
        y = F.batch_norm(x, rm2, rv2, w, b, True, momentum, 1e-5)
        return (y, rm2, rv2)

    for shape, nc in (((4, 6, 5, 3), False), ((5, 6), True)):
        x = make(shape, dtype, noncontig=nc)
        w, b = make((6,), dtype), make((6,), dtype)
        rm, rv = make((6,), dtype), make((6,), dtype, positive=True)
        yield Sample(
            "batch_norm_train",
            [x, w, b, rm, rv],
            {"momentum": 0.1, "eps": 1e-5},
            lambda x=x, w=w, b=b, rm=rm, rv=rv: eager(x, w, b, rm, rv, 0.1),
            f"{shape}",
        )
    x = make((4, 6, 3), dtype)
    yield Sample(
        "batch_norm_train",
        [x, None, None, None, None],
        {"momentum": 0.1},
        lambda: F.batch_norm(x, None, None, training=True),
        "no running stats",
    )


VIEW_CASES: dict[str, list[tuple[tuple[int, ...], dict[str, Any], Callable[..., Any], bool]]] = {
    "view": [
        ((3, 4, 5), {"shape": (12, 5)}, lambda x: x.view(12, 5), False),
        ((3, 4, 5), {"shape": (-1, 20)}, lambda x: x.view(-1, 20), False),
        ((0, 4), {"shape": (4, 0)}, lambda x: x.view(4, 0), False),
        ((), {"shape": (1, 1)}, lambda x: x.view(1, 1), False),
    ],
    "reshape": [
        ((3, 4, 5), {"shape": (5, -1)}, lambda x: x.reshape(5, -1), True),
        ((6,), {"shape": (2, 3)}, lambda x: torch.reshape(x, (2, 3)), False),
    ],
    "permute": [
        ((3, 4, 5), {"dims": (2, 0, 1)}, lambda x: x.permute(2, 0, 1), True),
        ((2, 1, 3), {"dims": (-1, 1, 0)}, lambda x: x.permute(-1, 1, 0), False),
    ],
    "transpose": [
        ((3, 4, 5), {"dim0": -2, "dim1": -1}, lambda x: x.transpose(-2, -1), True),
        ((4, 5), {"dim0": 0, "dim1": 1}, lambda x: x.t(), False),
    ],
    "expand": [
        ((3, 1), {"shape": (2, 3, 4)}, lambda x: x.expand(2, 3, 4), False),
        ((1, 5), {"shape": (-1, 5)}, lambda x: x.expand(-1, 5), True),
        ((0, 1), {"shape": (0, 3)}, lambda x: x.expand(0, 3), False),
    ],
    "unsqueeze": [
        ((3, 4), {"dim": 0}, lambda x: x.unsqueeze(0), False),
        ((3, 4), {"dim": -1}, lambda x: x.unsqueeze(-1), True),
        ((), {"dim": 0}, lambda x: x.unsqueeze(0), False),
    ],
    "squeeze": [
        ((3, 1, 4, 1), {"dims": None}, lambda x: x.squeeze(), False),
        ((3, 1, 4, 1), {"dims": (1,)}, lambda x: x.squeeze(1), False),
        ((3, 4), {"dims": (0,)}, lambda x: x.squeeze(0), True),
    ],
    "flatten": [
        ((2, 3, 4, 5), {"start_dim": 1}, lambda x: x.flatten(1), False),
        ((2, 3, 4), {"start_dim": 0, "end_dim": 1}, lambda x: torch.flatten(x, 0, 1), True),
        ((), {}, lambda x: x.flatten(), False),
    ],
    "slice": [
        ((7, 5), {"dim": 0, "start": 1, "end": 6, "step": 2}, lambda x: x[1:6:2], False),
        ((4, 9), {"dim": 1, "start": -3}, lambda x: x[:, -3:], True),
        ((4, 5), {"dim": 1, "start": 2, "end": 100}, lambda x: x[:, 2:100], False),
        ((4, 5), {"dim": 0, "start": 3, "end": 1}, lambda x: x[3:1], False),
    ],
    "select": [
        ((4, 5), {"dim": 0, "index": 2}, lambda x: x[2], False),
        ((4, 5, 3), {"dim": -1, "index": -1}, lambda x: x[..., -1], True),
    ],
    "detach": [((4, 5), {}, lambda x: x.detach(), True)],
    "contiguous": [((4, 5), {}, lambda x: x.contiguous(), True)],
    "constant_pad": [
        ((2, 3, 5), {"pad": (1, 2, 0, 3), "value": 0}, lambda x: F.pad(x, (1, 2, 0, 3)), True),
        ((4, 5), {"pad": (-1, 2), "value": 1}, lambda x: F.pad(x, (-1, 2), value=1), False),
        ((3, 6), {"pad": (-2, -1, 2, -1), "value": 0}, lambda x: F.pad(x, (-2, -1, 2, -1)), True),
        (
            (0, 3),
            {"pad": (1, 1, 2, 0), "value": 1},
            lambda x: F.pad(x, (1, 1, 2, 0), value=1),
            False,
        ),
        ((), {"pad": (), "value": 0}, lambda x: F.pad(x, ()), False),
        ((4, 5), {"pad": (0, -5), "value": 0}, lambda x: F.pad(x, (0, -5)), False),
    ],
    "pad": [
        (
            (2, 3, 5),
            {"pad": (2, 1), "mode": "reflect"},
            lambda x: F.pad(x, (2, 1), mode="reflect"),
            True,
        ),
        (
            (2, 4, 5),
            {"pad": (1, -2, 3, 2), "mode": "reflect"},
            lambda x: F.pad(x, (1, -2, 3, 2), mode="reflect"),
            False,
        ),
        (
            (1, 2, 3, 4, 5),
            {"pad": (1, 2, 2, 0, 1, 1), "mode": "replicate"},
            lambda x: F.pad(x, (1, 2, 2, 0, 1, 1), mode="replicate"),
            True,
        ),
        (
            (3, 4),
            {"pad": (-1, 3), "mode": "replicate"},
            lambda x: F.pad(x, (-1, 3), mode="replicate"),
            False,
        ),
        (
            (2, 3, 5),
            {"pad": (2, -1), "mode": "circular"},
            lambda x: F.pad(x, (2, -1), mode="circular"),
            True,
        ),
        (
            (2, 3, 4, 5),
            {"pad": (5, 5, 1, 2), "mode": "circular"},
            lambda x: F.pad(x, (5, 5, 1, 2), mode="circular"),
            False,
        ),
        (
            (2, 3, 4),
            {"pad": (-2, -2), "mode": "circular"},
            lambda x: F.pad(x, (-2, -2), mode="circular"),
            False,
        ),
    ],
    "roll": [
        (
            (3, 4, 5),
            {"shifts": (1, -7), "dims": (0, 2)},
            lambda x: torch.roll(x, (1, -7), (0, 2)),
            True,
        ),
        ((4, 5), {"shifts": (3,), "dims": (-1,)}, lambda x: x.roll(3, -1), False),
        ((0, 5), {"shifts": (2,), "dims": (0,)}, lambda x: x.roll(2, 0), False),
    ],
    "flip": [
        ((3, 4, 5), {"dims": (0, 2)}, lambda x: torch.flip(x, (0, 2)), True),
        ((4, 5), {"dims": (-1,)}, lambda x: x.flip(-1), False),
        ((0, 3), {"dims": (0, 1)}, lambda x: x.flip(0, 1), False),
        ((), {"dims": ()}, lambda x: x.flip(()), False),
        ((3, 4), {"dims": ()}, lambda x: x.flip(()), True),
    ],
    "diagonal": [
        ((4, 5), {}, lambda x: x.diagonal(), True),
        ((3, 4, 5), {"offset": 2, "dim1": 2, "dim2": 0}, lambda x: x.diagonal(2, 2, 0), False),
        (
            (3, 4, 5),
            {"offset": -1, "dim1": -1, "dim2": 1},
            lambda x: torch.diagonal(x, -1, -1, 1),
            True,
        ),
        ((2, 3), {"offset": 5}, lambda x: x.diagonal(5), False),
    ],
    "unfold": [
        ((3, 10), {"dim": 1, "size": 3, "step": 2}, lambda x: x.unfold(1, 3, 2), True),
        ((7, 2), {"dim": 0, "size": 7, "step": 1}, lambda x: x.unfold(0, 7, 1), False),
        ((), {"dim": 0, "size": 1, "step": 1}, lambda x: x.unfold(0, 1, 1), False),
        ((4, 0), {"dim": 1, "size": 0, "step": 3}, lambda x: x.unfold(1, 0, 3), False),
    ],
}


def gen_view(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, attrs, fn, nc in VIEW_CASES[op]:
        if op == "view" and nc:
            continue
        x = make(shape, dtype, noncontig=nc)
        yield Sample(op, [x], attrs, lambda x=x, fn=fn: fn(x), f"{shape} {attrs}")


def gen_cat_stack(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    if op == "cat":
        xs = [make((2, 3), dtype), make((4, 3), dtype, noncontig=True), make((0, 3), dtype)]
        yield Sample("cat", [xs], {"dim": 0}, lambda: torch.cat(xs), "dim 0 with empty")
        ys = [make((2, 3, 1), dtype), make((2, 3, 4), dtype)]
        yield Sample("cat", [ys], {"dim": -1}, lambda: torch.cat(ys, dim=-1), "last dim")
    else:
        xs = [make((2, 3), dtype), make((2, 3), dtype, noncontig=True)]
        yield Sample("stack", [xs], {"dim": 1}, lambda: torch.stack(xs, 1), "dim 1")
        yield Sample("stack", [xs[:1]], {"dim": 0}, lambda: torch.stack(xs[:1]), "one tensor")


def gen_split_chunk(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    x = make((7, 4), dtype)
    if op == "split":
        yield Sample(
            "split", [x], {"sizes": (3, 3, 1), "dim": 0}, lambda: x.split(3), "split_size 3"
        )
        yield Sample("split", [x], {"sizes": (1, 3), "dim": 1}, lambda: x.split([1, 3], 1), "sizes")
    else:
        yield Sample("chunk", [x], {"chunks": 3, "dim": 0}, lambda: x.chunk(3), "7 in 3")
        y = make((2, 6), dtype, noncontig=True)
        yield Sample(
            "chunk",
            [y],
            {"chunks": 4, "dim": 1},
            lambda: y.chunk(4, dim=1),
            "6 in 4 gives 3",
            static={0},
        )


def gen_extern(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    if op == "conv2d":
        x, w, b = make((2, 4, 9, 7), dtype), make((6, 4, 3, 3), dtype), make((6,), dtype)
        yield Sample(
            op,
            [x, w, b],
            {"stride": (1, 1), "padding": (1, 1)},
            lambda: F.conv2d(x, w, b, padding=1),
            "same padding",
            static={1},
        )
        w2 = make((4, 2, 3, 1), dtype)
        yield Sample(
            op,
            [x, w2, None],
            {"stride": (2, 1), "padding": (0, 0), "groups": 2, "dilation": (2, 1)},
            lambda: F.conv2d(x, w2, None, (2, 1), 0, (2, 1), 2),
            "grouped strided",
            static={1},
        )
        xc = x.to(memory_format=torch.channels_last)
        yield Sample(op, [xc, w, b], {}, lambda: F.conv2d(xc, w, b), "channels_last", static={1})
    elif op == "linear":
        x, w, b = make((3, 5, 8), dtype), make((6, 8), dtype), make((6,), dtype)
        yield Sample(op, [x, w, b], {}, lambda: F.linear(x, w, b), "bias")
        xn = make((4, 8), dtype, noncontig=True)
        yield Sample(op, [xn, w, None], {}, lambda: xn @ w.t(), "no bias via matmul spelling")
    elif op == "matmul":
        for sa, sb in (
            ((3, 4), (4, 5)),
            ((2, 3, 4), (4,)),
            ((4,), (2, 4, 5)),
            ((2, 1, 3, 4), (5, 4, 2)),
            ((4,), (4,)),
        ):
            a, b = make(sa, dtype, low=-2, high=2), make(sb, dtype, low=-2, high=2)
            yield Sample(op, [a, b], {}, lambda a=a, b=b: a @ b, f"{sa}@{sb}")
    elif op == "bmm":
        a, b = make((2, 3, 4), dtype, low=-2, high=2), make((2, 4, 5), dtype, low=-2, high=2)
        yield Sample(op, [a, b], {}, lambda: torch.bmm(a, b), "bmm")
    elif op == "scaled_dot_product_attention":
        q, k, v = (make((2, 3, 5, 8), dtype) for _ in range(3))
        yield Sample(
            op,
            [q, k, v, None],
            {"is_causal": True},
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "causal",
        )
        mask = make((5, 5), torch.bool)
        mask[:, 0] = True
        yield Sample(
            op,
            [q, k, v, mask],
            {"scale": 0.5},
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5),
            "bool mask",
        )
    elif op == "embedding":
        w = make((10, 4), dtype)
        idx = torch.randint(0, 10, (3, 5), generator=make.g)
        yield Sample(op, [idx, w], {}, lambda: F.embedding(idx, w), "2-D indices")
        yield Sample(op, [idx, w], {"padding_idx": 0}, lambda: F.embedding(idx, w, 0), "pad")
    elif op == "index_select":
        x = make((6, 5), dtype)
        idx = torch.tensor([4, 0, 0, 2])
        yield Sample(op, [x, idx], {"dim": 0}, lambda: x.index_select(0, idx), "dim 0")
        yield Sample(op, [x, idx], {"dim": 1}, lambda: torch.index_select(x, 1, idx), "dim 1")
    elif op == "max_pool2d":
        x = make((2, 3, 9, 8), dtype)
        yield Sample(
            op,
            [x],
            {"kernel_size": (3, 3), "stride": (2, 2), "padding": (1, 1)},
            lambda: F.max_pool2d(x, 3, 2, 1),
            "resnet stem pool",
        )
        yield Sample(
            op,
            [x],
            {"kernel_size": (2, 2), "ceil_mode": True},
            lambda: F.max_pool2d(x, 2, ceil_mode=True),
            "ceil mode",
        )
    elif op == "avg_pool2d":
        x = make((2, 3, 9, 8), dtype)
        yield Sample(
            op,
            [x],
            {
                "kernel_size": (3, 3),
                "stride": (2, 2),
                "padding": (1, 1),
                "count_include_pad": False,
            },
            lambda: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
            "pad excluded",
        )
        yield Sample(op, [x], {"kernel_size": (2, 2)}, lambda: F.avg_pool2d(x, 2), "2x2")
    elif op == "adaptive_avg_pool2d":
        x = make((2, 3, 7, 5), dtype, noncontig=True)
        yield Sample(
            op, [x], {"output_size": (1, 1)}, lambda: F.adaptive_avg_pool2d(x, 1), "global"
        )
        yield Sample(
            op, [x], {"output_size": (3, 2)}, lambda: F.adaptive_avg_pool2d(x, (3, 2)), "3x2"
        )


def gen_random(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    x = make((6, 7), dtype)
    yield Sample(
        "dropout",
        [x],
        {"p": 0.3, "train": False},
        lambda: F.dropout(x, 0.3, training=False),
        "eval",
    )
    # NOTE: the random sample compares under one seed; see test_reference_matches_torch.
    yield Sample(
        "dropout", [x], {"p": 0.3, "train": True}, lambda: F.dropout(x, 0.3, training=True), "train"
    )


def gen_constant(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    if op == "full":
        yield Sample(
            op,
            [],
            {"shape": (2, 3), "value": 1, "dtype": dtype},
            lambda: torch.full((2, 3), 1, dtype=dtype),
            "2x3",
        )
    elif op in ("zeros", "ones"):
        fn = getattr(torch, op)
        yield Sample(
            op, [], {"shape": (3, 0, 2), "dtype": dtype}, lambda: fn(3, 0, 2, dtype=dtype), "size 0"
        )
        yield Sample(op, [], {"shape": (), "dtype": dtype}, lambda: fn((), dtype=dtype), "0-d")
    elif op == "arange":
        yield Sample(op, [], {"end": 7, "dtype": dtype}, lambda: torch.arange(7, dtype=dtype), "7")
        if dtype in FLOAT_DTYPES:
            yield Sample(
                op,
                [],
                {"start": 0.5, "end": 3.0, "step": 0.25, "dtype": dtype},
                lambda: torch.arange(0.5, 3.0, 0.25, dtype=dtype),
                "float step",
            )
        yield Sample(
            op,
            [],
            {"start": 5, "end": 1, "step": -2, "dtype": dtype},
            lambda: torch.arange(5, 1, -2, dtype=dtype),
            "negative step",
        )


def gen_opaque(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    x = make((4, 6), dtype)
    t = f"{_tname(dtype)}[4, 6]"
    yield Sample(
        "opaque",
        [[x]],
        {"target": "torch.fliplr", "out_types": t},
        lambda: torch.fliplr(x),
        "fliplr by name",
    )
    yield Sample(
        "opaque",
        [[x]],
        {"target": "torch.roll", "out_types": t, "literals": '[{"t": 0}, 1, 0]'},
        lambda: torch.roll(x, 1, 0),
        "roll with literal arguments",
    )
    y = make((4, 6), dtype)
    yield Sample(
        "opaque",
        [[x, y]],
        {
            "target": "torch.stack",
            "out_types": f"{_tname(dtype)}[4, 2, 6]",
            "literals": '[[{"t": 0}, {"t": 1}]]',
            "kwliterals": '{"dim": 1}',
        },
        lambda: torch.stack([x, y], dim=1),
        "nested list and keyword literals",
    )


def gen_aten(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    """Typed ATen nodes (plait.ir.ops.aten): one result, literals, several results."""
    aten = torch.ops.aten
    x = make((4, 6), dtype, noncontig=True)
    yield Sample("aten", [[x]], {"name": "flip", "literals": '[{"t": 0}, [0]]'},
                 lambda: aten.flip.default(x, [0]), "flip with a literal")  # fmt: skip
    yield Sample("aten", [[x]], {"name": "roll", "literals": '[{"t": 0}, [1, -2], [0, 1]]'},
                 lambda: aten.roll.default(x, [1, -2], [0, 1]), "roll")  # fmt: skip
    yield Sample(
        "aten",
        [[x]],
        {"name": "split_with_sizes_copy", "literals": '[{"t": 0}, [1, 3]]'},
        lambda: tuple(aten.split_with_sizes_copy.default(x, [1, 3])),
        "a list of results",
    )


def gen_aten_datadep(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    """Data-dependent ATen nodes whose size is static (no unbacked size: the generic checks
    compare static types); unbacked sizes: tests/ir/test_datadep_node.py. (repeat_interleave
    given output_size is not here: the conformance checks draw fresh repeats, whose sum is
    not the size; tests/capture/test_data_dependent_shapes.py covers it.)"""
    aten = torch.ops.aten
    x = make((4, 6), dtype, noncontig=True)
    yield Sample("aten_datadep", [[x]],
                 {"name": "nonzero_static", "literals": '[{"t": 0}]',
                  "kwliterals": '{"size": 9, "fill_value": -1}'},
                 lambda: aten.nonzero_static.default(x, size=9, fill_value=-1),
                 "nonzero_static (a static size)")  # fmt: skip


def gen_aten_factory(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    name = str(dtype).removeprefix("torch.")
    yield Sample(
        "aten_factory",
        [],
        {"name": "eye", "overload": "m", "literals": "[3, 4]",
         "kwliterals": json.dumps({"dtype": {"dtype": name}})},
        lambda: torch.ops.aten.eye.m(3, 4, dtype=dtype),
        "eye with a dtype",
    )  # fmt: skip


def gen_torch_vjp(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    """PyTorch's autograd of an op's reference: gradients of mul and of softmax."""
    x, y, g = make((3, 4), dtype), make((4,), dtype), make((3, 4), dtype)

    def grads(fn: Callable[..., torch.Tensor], *ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = [t.detach().requires_grad_(True) for t in ts]
        return torch.autograd.grad(fn(*leaves), leaves, g)

    layout2 = json.dumps([{"t": 0}, {"t": 1}])
    yield Sample(
        "torch_vjp",
        [[x, y, g]],
        {"of": "mul", "attrs": "{}", "operands": layout2, "seeded": (0,), "wrt": (0, 1)},
        lambda: grads(torch.mul, x, y),
        "mul, broadcast operand",
    )
    attrs = json.dumps({"dim": 1, "dtype": None})
    yield Sample(
        "torch_vjp",
        [[x, g]],
        {"of": "softmax", "attrs": attrs, "operands": json.dumps([{"t": 0}]), "seeded": (0,),
         "wrt": (0,)},
        lambda: grads(lambda t: torch.softmax(t, 1), x),
        "softmax",
    )  # fmt: skip


def gen_aten_check(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    """A runtime check (plait.ir.ops.aten): passes on a zero LAPACK info, returns the token."""
    info = torch.zeros(2, dtype=torch.int32)
    yield Sample(
        "aten_check",
        [[info]],
        {"name": "_linalg_check_errors", "literals": '[{"t": 0}, "linalg.inv"]',
         "kwliterals": '{"is_matrix": false}'},
        lambda: torch.zeros((), dtype=torch.int64),
        "a passing linalg check",
    )  # fmt: skip


def gen_rng(op: str, dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    """The generator's ops (plait.ir.ops.rng); the test seeds the generator alike before both."""
    if op == "rng_seed":
        yield Sample(
            op, [], {"seed": 7}, lambda: (torch.manual_seed(7), torch.tensor(7))[1], "seed 7"
        )
    elif op == "rng_get_state":
        yield Sample(op, [], {"size": 5056}, torch.get_rng_state, "state")
    elif op == "rng_set_state":
        g = torch.Generator().manual_seed(3)
        torch.rand(2, generator=g)
        state = g.get_state()
        yield Sample(
            op,
            [state],
            {},
            lambda: (torch.set_rng_state(state), torch.zeros((), dtype=torch.int64))[1],
            "a state after draws",
            static={0},
        )
    elif op == "random_call":
        x = make((4, 6), dtype)
        t = f"{_tname(dtype)}[4, 6]"
        yield Sample(
            op, [[x]], {"target": "torch.rand_like", "out_types": t}, lambda: torch.rand_like(x)
        )
        p = torch.rand(4, 6, generator=make.g).to(dtype)
        yield Sample(
            op,
            [[p]],
            {"target": "torch.bernoulli", "out_types": t, "literals": '[{"t": 0}, 0.25]'},
            lambda: torch.bernoulli(p, 0.25),
            "literal",
        )
    else:
        yield Sample(
            op,
            [],
            {
                "target": "torch.randn",
                "out_types": f"{_tname(dtype)}[2, 3]",
                "literals": "[2, 3]",
                "kwliterals": json.dumps({"dtype": {"dtype": str(dtype).removeprefix("torch.")}}),
            },
            lambda: torch.randn(2, 3, dtype=dtype),
            "dtype keyword",
        )


def _tname(dtype: torch.dtype) -> str:
    from plait.ir.types import dtype_name

    return dtype_name(dtype)


GENERATORS: dict[str, Callable[[torch.dtype, Maker], Iterator[Sample]]] = {}
for _op in UNARY_FNS:
    GENERATORS[_op] = lambda d, m, op=_op: gen_unary(op, d, m)
for _op in BINARY_FNS:
    GENERATORS[_op] = lambda d, m, op=_op: gen_binary(op, d, m)
for _op in REDUCE_FNS:
    GENERATORS[_op] = lambda d, m, op=_op: gen_reduce(op, d, m)
for _op in VIEW_CASES:
    GENERATORS[_op] = lambda d, m, op=_op: gen_view(op, d, m)
for _op in ("softmax", "log_softmax"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_softmax(op, d, m)
for _op in ("triu", "tril"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_tri(op, d, m)
for _op in ("cat", "stack"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_cat_stack(op, d, m)
for _op in ("split", "chunk"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_split_chunk(op, d, m)
for _op in (
    "conv2d",
    "linear",
    "matmul",
    "bmm",
    "scaled_dot_product_attention",
    "embedding",
    "index_select",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
):
    GENERATORS[_op] = lambda d, m, op=_op: gen_extern(op, d, m)
for _op in ("full", "zeros", "ones", "arange"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_constant(op, d, m)
GENERATORS.update(
    {
        "gelu": gen_gelu,
        "to_dtype": gen_to_dtype,
        "where": gen_where,
        "clamp": gen_clamp,
        "var": gen_var,
        "layer_norm": gen_layer_norm,
        "group_norm": gen_group_norm,
        "batch_norm": gen_batch_norm,
        "batch_norm_train": gen_batch_norm_train,
        "dropout": gen_random,
        "opaque": gen_opaque,
        "aten": gen_aten,
        "aten_factory": gen_aten_factory,
        "aten_datadep": gen_aten_datadep,
        "aten_check": gen_aten_check,
        "torch_vjp": gen_torch_vjp,
    }
)
for _op in ("rng_seed", "rng_get_state", "rng_set_state", "random_call", "random_factory"):
    GENERATORS[_op] = lambda d, m, op=_op: gen_rng(op, d, m)

# NOTE: at the end: opdb_math and opdb_batch_norm_relu import this module's Sample and Maker.
from tests.ir.opdb_batch_norm_relu import GENERATORS as _BN_RELU_GENERATORS  # noqa: E402
from tests.ir.opdb_math import GENERATORS as _MATH_GENERATORS  # noqa: E402

GENERATORS.update(_MATH_GENERATORS)
GENERATORS.update(_BN_RELU_GENERATORS)


def cases() -> list[tuple[str, torch.dtype]]:
    """(op, dtype) for every registered op and each dtype it declares."""
    return [(name, dtype) for name, op in sorted(all_ops().items()) for dtype in op.dtypes]


def samples(op: str, dtype: torch.dtype, seed: int = 0) -> list[Sample]:
    return list(GENERATORS[op](dtype, Maker(seed)))
