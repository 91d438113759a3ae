"""Reduction templates: reductions and the composite ops built on them, as multi-phase kernels.

Each template picks the kernel's domain (``outer`` = the kept positions, ``inner`` = the reduced
ones) and writes its phases in the kernel IR:

=============  ==========================================================================
sum, mean      one phase: sum (accumulated in the contract's type); final store
amax, amin     one phase: NaN-propagating max/min; final store
var            two phases: sum -> mean; sum of squared deviations -> / max(0, n - correction)
all, any,      one phase: int64 count of nonzero elements (NaN is nonzero); all: count == n,
count_nonzero  any: count > 0
nansum, prod   one phase: sum with NaN as zero, product; accumulated as sum
logsumexp      two phases: max m (0 where infinite); sum of exp(x - m); final log(sum) + m
softmax        three phases: max; sum of exp(x - max); store exp(x - max) / sum (C++:
               the exps stored with the sum and divided in place)
log_softmax    three phases: max; sum of exp(x - max); store x - max - log(sum)
layer_norm     three phases: mean; biased variance; store (x - mean) * rstd * weight + bias
group_norm     as layer_norm over (channels of the group, spatial); store x * scale + shift
               (PyTorch's per-channel scale = rstd * weight, shift = bias - scale * mean)
=============  ==========================================================================

``batch_norm`` in inference is pointwise (see :mod:`plait.codegen.scalar`). The input of a
template is read through :meth:`Lowerer.value_at`, so pointwise producers and views fuse into the
reduction (recomputed in each phase, never stored).

The accumulation type is the numerical contract's for the op class and dtype, never narrower than
the values it sums (``accum_type``). Two-pass variance is used (not Welford): it is as accurate and
vectorizes.

Example:
    >>> sorted(TEMPLATES)[:6]
    ['all', 'amax', 'amin', 'any', 'count_nonzero', 'group_norm']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import torch

import plait.contract
from plait.codegen.index import Ix, Var, contiguous_strides, linear
from plait.codegen.kir import STORAGE_OF, KernelBuilder, Stmt, is_float, scalar_of
from plait.codegen.lower import Lowerer, loop_vars, size_stmt
from plait.codegen.placement import Loc, Lowered
from plait.codegen.scalar_args import Arg, to
from plait.codegen.views import sizes_of
from plait.errors import InternalValueError
from plait.ir.graph import Node, Value
from plait.ir.ops.rules import wrap_dim, wrap_dims
from plait.ir.types import TensorType
from plait.symbolic.poly import Size

OP_CLASS = {
    "sum": "reduction",
    "mean": "reduction",
    "amax": "reduction",
    "amin": "reduction",
    "var": "reduction",
    "all": "reduction",
    "any": "reduction",
    "count_nonzero": "reduction",
    "nansum": "reduction",
    "prod": "reduction",
    "logsumexp": "normalization",
    "softmax": "normalization",
    "log_softmax": "normalization",
    "layer_norm": "normalization",
    "group_norm": "normalization",
    "batch_norm": "normalization",
}
_WIDTH = {"b": 0, "u8": 1, "i8": 1, "i16": 2, "i32": 3, "i64": 4, "f32": 5, "f64": 6}
_CONTRACT_ACCUM = {"float64": "f64", "float32": "f32", "int64": "i64"}


@cache
def accum_type(op_class: str, dtype: torch.dtype) -> str:
    """The scalar type to accumulate ``dtype`` values in: the contract's accumulation dtype for
    the op class, widened to the values' own compute type if that is wider (never loosened)."""
    tol = plait.contract.load().tolerance(op_class, dtype)
    declared = _CONTRACT_ACCUM[tol.accum_dtype]
    own = scalar_of(dtype)
    if is_float(own) != is_float(declared):
        return declared
    return own if _WIDTH[own] > _WIDTH[declared] else declared


class _Template:
    """Shared scaffolding: domain, input access at (outer, inner), output buffers."""

    def __init__(
        self,
        name: str,
        node: Node,
        locs: dict[Value, Loc],
        kept: tuple[int, ...],
        reduced: tuple[int, ...],
        groups: int = 0,
        epilogue: Sequence[Node] = (),
    ) -> None:
        """Outer loops over the ``kept`` dims, inner loops over the ``reduced`` dims; with
        ``groups`` (group_norm), outer (N, G) and inner (C/G, spatial...) instead."""
        x = node.inputs[0]
        assert isinstance(x, Value)
        self.node, self.x = node, x
        self.epilogue = tuple(epilogue)
        self.shape = sizes_of(x.type)
        self.kept, self.reduced = kept, reduced
        if groups:
            n, c = self.shape[0], self.shape[1]
            outer = loop_vars([n, groups], "i")
            inner = loop_vars([c // groups, *self.shape[2:]], "r")
            channel = Ix.var(outer[1]) * (c // groups) + Ix.var(inner[0])
            self.index = (Ix.var(outer[0]), channel, *(Ix.var(v) for v in inner[1:]))
        else:
            outer = loop_vars([self.shape[d] for d in kept], "i")
            inner = loop_vars([self.shape[d] for d in reduced], "r")
            index: list[Ix] = [Ix.lit(0)] * len(self.shape)
            for d, v in zip(kept, outer):
                index[d] = Ix.var(v)
            for d, v in zip(reduced, inner):
                index[d] = Ix.var(v)
            self.index = tuple(index)
        self.b = KernelBuilder(name, outer, inner)
        self.low = Lowerer(self.b, locs)
        self.low.covered.add(node.id)
        self.n: Size = 1
        for v in inner:
            self.n = self.n * v.extent

    def count(self, t: str) -> Stmt:
        """The number of reduced elements as a ``t`` value (read at run time when symbolic)."""
        if isinstance(self.n, int):
            return self.b.const(float(self.n) if is_float(t) else self.n, t)
        return size_stmt(self.b, self.n, t)

    def out_type(self, k: int = 0) -> TensorType:
        t = self.node.outputs[k].type
        assert isinstance(t, TensorType)
        return t

    def x_as(self, t: str, source: torch.dtype | None = None) -> Stmt:
        """The input element at the current (outer, inner) point, converted to ``t`` (through
        the ``source`` dtype first when the op converts its input, e.g. ``sum(dtype=...)``)."""
        v = self.low.value_at(self.x, self.index)
        if source is not None:
            v = self.b.round(self.b.cast(v, scalar_of(source)), STORAGE_OF[source])
        return self.b.cast(v, t)

    def store_reduced(self, value: Stmt, keepdim: bool) -> None:
        t = self.out_type()
        out = self.low.buffer_for(self.node.outputs[0], output=True)
        shape = sizes_of(t)
        outer = [Ix.var(v) for v in self.b.outer]
        if keepdim:
            idx: list[Ix] = [Ix.lit(0)] * len(self.shape)
            for d, i in zip(self.kept, outer):
                idx[d] = i
            pos = linear(tuple(idx), contiguous_strides(shape))
        else:
            pos = linear(tuple(outer), contiguous_strides(shape))
        v = self.b.round(self.b.cast(value, scalar_of(t.dtype)), STORAGE_OF[t.dtype])
        self.b.store_final(out, pos, v)

    def store_element(self, value: Stmt) -> None:
        """Store the op's element; with an epilogue (pointwise nodes reading it, same shape),
        compute them on it in registers and store the last one's value instead."""
        t = self.out_type()
        v = self.b.round(self.b.cast(value, scalar_of(t.dtype)), STORAGE_OF[t.dtype])
        result = self.node.outputs[0]
        if self.epilogue:
            low = self.low
            low.home = self.index
            low.own[result], low.own_values = v, {result}
            for n in self.epilogue:
                out_value = n.outputs[0]
                low.own[out_value] = low.produce(out_value, self.index)
                low.own_values.add(out_value)
            result = self.epilogue[-1].outputs[0]
            v = low.own[result]
        out = self.low.buffer_for(result, output=True)
        self.b.store(out, linear(self.index, contiguous_strides(self.shape)), v)

    def done(self, template: str) -> Lowered:
        nodes = tuple(sorted(self.low.covered))
        return Lowered(self.b.build(nodes, template), self.low.bindings, self.low.covered)


def _axes(node: Node, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    reduced = wrap_dims(node.attrs.get("dims"), rank, node.op) if rank else ()
    kept = tuple(d for d in range(rank) if d not in reduced)
    return kept, tuple(sorted(reduced))


def _simple(name: str, node: Node, locs: dict[Value, Loc], epilogue: tuple[Node, ...]) -> Lowered:
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    kept, reduced = _axes(node, x.type.rank)
    tp = _Template(name, node, locs, kept, reduced)
    b = tp.b
    out = tp.out_type()
    op = node.op
    source = node.attrs.get("dtype") if op in ("sum", "mean") else None
    if op == "mean" and source in (torch.float16, torch.bfloat16) and x.type.device == "cpu":
        # NOTE: ATen's CPU mean to a 16-bit dtype sums the input as float32 (never rounded to
        # 16 bits: an int32 or float32 value may overflow float16) and rounds the mean once
        source = torch.float32
    if op in ("sum", "mean"):
        acc_t = accum_type("reduction", source or x.type.dtype)
        acc_t = (
            accum_type("reduction", out.dtype)
            if _WIDTH[scalar_of(out.dtype)] > _WIDTH[acc_t]
            else acc_t
        )
        total = b.reduce("sum", tp.x_as(acc_t, source), acc_t)
        if op == "mean":
            total = b.op("div", [total, tp.count(acc_t)], acc_t)
        tp.store_reduced(total, node.attrs["keepdim"])
        return tp.done(op)
    if op in ("amax", "amin"):
        t = scalar_of(x.type.dtype)
        kind = "max" if op == "amax" else "min"
        if t == "b":
            t = "i32"
        tp.store_reduced(b.reduce(kind, tp.x_as(t), t), node.attrs["keepdim"])
        return tp.done(op)
    # var: two passes
    acc_t = accum_type("reduction", x.type.dtype)
    mean = b.op("div", [b.reduce("sum", tp.x_as(acc_t), acc_t), tp.count(acc_t)], acc_t)
    b.next_phase()
    dev = b.op("sub", [tp.x_as(acc_t), mean], acc_t)
    m2 = b.reduce("sum", b.op("mul", [dev, dev], acc_t), acc_t)
    correction = float(node.attrs["correction"])
    if isinstance(tp.n, int):
        dof = b.const(max(0.0, float(tp.n) - correction), acc_t)
    else:
        dof = b.op("sub", [tp.count(acc_t), b.const(correction, acc_t)], acc_t)
        dof = b.op("max", [dof, b.const(0.0, acc_t)], acc_t)
    var = b.op("div", [m2, dof], acc_t)
    tp.store_reduced(var, node.attrs["keepdim"])
    return tp.done("var")


def _counting(name: str, node: Node, locs: dict[Value, Loc], epilogue: tuple[Node, ...]) -> Lowered:
    """all, any, count_nonzero: the number of nonzero elements (NaN is nonzero), in int64."""
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    kept, reduced = _axes(node, x.type.rank)
    tp = _Template(name, node, locs, kept, reduced)
    b = tp.b
    nonzero = b.cast(tp.x_as("b"), "i64")
    count = b.reduce("sum", nonzero, "i64")
    if node.op == "all":
        count = b.op("eq", [count, tp.count("i64")], "b")
    elif node.op == "any":
        count = b.op("gt", [count, b.const(0, "i64")], "b")
    tp.store_reduced(count, node.attrs.get("keepdim", False))
    return tp.done(node.op)


def _nansum_prod(
    name: str, node: Node, locs: dict[Value, Loc], epilogue: tuple[Node, ...]
) -> Lowered:
    """nansum (NaN elements add zero) and prod, accumulated as sum is."""
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    kept, reduced = _axes(node, x.type.rank)
    tp = _Template(name, node, locs, kept, reduced)
    b = tp.b
    out = tp.out_type()
    source = node.attrs.get("dtype")
    acc_t = accum_type("reduction", source or x.type.dtype)
    if _WIDTH[scalar_of(out.dtype)] > _WIDTH[acc_t]:
        acc_t = accum_type("reduction", out.dtype)
    v = tp.x_as(acc_t, source)
    if node.op == "prod":
        total = b.reduce("prod", v, acc_t)
    else:
        if is_float(acc_t):
            v = b.op("where", [b.op("ne", [v, v], "b"), b.const(0.0, acc_t), v], acc_t)
        total = b.reduce("sum", v, acc_t)
    tp.store_reduced(total, node.attrs["keepdim"])
    return tp.done(node.op)


def _logsumexp(
    name: str, node: Node, locs: dict[Value, Loc], epilogue: tuple[Node, ...]
) -> Lowered:
    """ATen's formula: m = max, replaced by 0 where infinite; log(sum(exp(x - m))) + m."""
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    kept, reduced = _axes(node, x.type.rank)
    tp = _Template(name, node, locs, kept, reduced)
    b = tp.b
    acc_t = accum_type("normalization", tp.out_type().dtype)
    m = b.reduce("max", tp.x_as(acc_t), acc_t)
    infinite = b.op("eq", [b.op("abs", [m], acc_t), b.const(float("inf"), acc_t)], "b")
    m = b.op("where", [infinite, b.const(0.0, acc_t), m], acc_t)
    b.next_phase()
    shifted = b.op("sub", [tp.x_as(acc_t), m], acc_t)
    s = b.reduce("sum", b.op("exp", [shifted], acc_t), acc_t)
    tp.store_reduced(b.op("add", [b.op("log", [s], acc_t), m], acc_t), node.attrs["keepdim"])
    return tp.done(node.op)


def _softmax(
    name: str,
    node: Node,
    locs: dict[Value, Loc],
    epilogue: tuple[Node, ...],
    reread: bool = False,
) -> Lowered:
    """With ``reread``, a softmax whose output holds the accumulation type exactly (float32 in
    float32, no epilogue) stores exp(x - max) in the sum's phase and divides it in place in
    the last one, instead of computing exp twice per element: the same bits, one exp."""
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    rank = x.type.rank
    d = wrap_dim(node.attrs["dim"], rank, node.op) if rank else 0
    kept = tuple(k for k in range(rank) if k != d)
    tp = _Template(name, node, locs, kept, (d,) if rank else (), epilogue=epilogue)
    b = tp.b
    source = node.attrs.get("dtype")
    acc_t = accum_type("normalization", source or x.type.dtype)
    m = b.reduce("max", tp.x_as(acc_t, source), acc_t)
    b.next_phase()
    shifted = b.op("sub", [tp.x_as(acc_t, source), m], acc_t)
    e = b.op("exp", [shifted], acc_t)
    s = b.reduce("sum", e, acc_t)
    kept_exactly = STORAGE_OF[tp.out_type().dtype] == acc_t and not epilogue
    at = linear(tp.index, contiguous_strides(tp.shape))
    # NOTE: a load is a pure value to the printers, placed by what its index reads: one that
    # no inner loop variable moves would be read before the phase that stores it
    moves = {a for a, _ in at.terms if isinstance(a, Var) and a.extent != 1} & set(b.inner)
    if node.op == "softmax" and reread and kept_exactly and moves:
        out = tp.low.buffer_for(node.outputs[0], output=True)
        b.store(out, at, e)
        b.next_phase()
        b.store(out, at, b.op("div", [b.load(out, at), s], acc_t))
        return tp.done(node.op)
    b.next_phase()
    if node.op == "softmax":
        y = b.op("div", [b.op("exp", [shifted], acc_t), s], acc_t)
    else:
        y = b.op("sub", [shifted, b.op("log", [s], acc_t)], acc_t)
    tp.store_element(y)
    return tp.done(node.op)


def _norm(name: str, node: Node, locs: dict[Value, Loc], epilogue: tuple[Node, ...]) -> Lowered:
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    shape = sizes_of(x.type)
    rank = len(shape)
    if node.op == "layer_norm":
        k = len(node.attrs["normalized_shape"])
        kept, reduced = tuple(range(rank - k)), tuple(range(rank - k, rank))
        tp = _Template(name, node, locs, kept, reduced, epilogue=epilogue)
        param_index: tuple[Ix, ...] = tp.index[rank - k :]
    else:
        groups = node.attrs["num_groups"]
        tp = _Template(name, node, locs, (), (), groups=groups, epilogue=epilogue)
        param_index = (tp.index[1],)
    b = tp.b
    acc_t = accum_type("normalization", x.type.dtype)
    n = tp.count(acc_t)
    mean = b.op("div", [b.reduce("sum", tp.x_as(acc_t), acc_t), n], acc_t)
    b.next_phase()
    # NOTE: corrected two-pass moments: sum / n is off by an ulp or so where eager's Welford
    # mean is exact (a row of one value), and rstd = 1/sqrt(eps) magnifies x - mean; the mean of
    # the deviations corrects the mean (exact for such a row) and takes its square off the
    # variance (0 for such a row, so eps=0 gives NaN as in eager)
    dev = b.op("sub", [tp.x_as(acc_t), mean], acc_t)
    shift = b.op("div", [b.reduce("sum", dev, acc_t), n], acc_t)
    m2 = b.op("div", [b.reduce("sum", b.op("mul", [dev, dev], acc_t), acc_t), n], acc_t)
    var = b.op("sub", [m2, b.op("mul", [shift, shift], acc_t)], acc_t)
    negative = b.op("lt", [var, b.const(0.0, acc_t)], "b")
    var = b.op("where", [negative, b.const(0.0, acc_t), var], acc_t)
    mean = b.op("add", [mean, shift], acc_t)
    b.next_phase()
    dev = b.op("sub", [tp.x_as(acc_t), mean], acc_t)
    eps = b.const(float(node.attrs["eps"]), acc_t)
    rstd = b.op(
        "div", [b.const(1.0, acc_t), b.op("sqrt", [b.op("add", [var, eps], acc_t)], acc_t)], acc_t
    )
    weight, bias = node.inputs[1], node.inputs[2]
    if node.op == "group_norm":
        # NOTE: PyTorch's CPU formula, per channel: scale = rstd * weight, shift = -scale * mean +
        # bias, y = x * scale + shift (an infinite weight gives NaN where x and mean agree in
        # sign, as in eager; (x - mean) * rstd * weight would give an infinity).
        scale = rstd
        if isinstance(weight, Value):
            scale = b.op("mul", [rstd, _param(tp, weight, param_index, acc_t)], acc_t)
        shift = b.op("mul", [b.op("neg", [scale], acc_t), mean], acc_t)
        if isinstance(bias, Value):
            shift = b.op("add", [shift, _param(tp, bias, param_index, acc_t)], acc_t)
        tp.store_element(b.op("add", [b.op("mul", [tp.x_as(acc_t), scale], acc_t), shift], acc_t))
        return tp.done(node.op)
    y = b.op("mul", [dev, rstd], acc_t)
    if isinstance(weight, Value):
        y = b.op("mul", [y, _param(tp, weight, param_index, acc_t)], acc_t)
    if isinstance(bias, Value):
        y = b.op("add", [y, _param(tp, bias, param_index, acc_t)], acc_t)
    tp.store_element(y)
    return tp.done(node.op)


def _param(tp: _Template, p: Value, index: tuple[Ix, ...], t: str) -> Stmt:
    return to(tp.b, Arg(tp.low.value_at(p, index), None, None), t)


TEMPLATES: dict[str, Callable[[str, Node, dict[Value, Loc], tuple[Node, ...]], Lowered]] = {
    "sum": _simple,
    "mean": _simple,
    "amax": _simple,
    "amin": _simple,
    "var": _simple,
    "all": _counting,
    "any": _counting,
    "count_nonzero": _counting,
    "nansum": _nansum_prod,
    "prod": _nansum_prod,
    "logsumexp": _logsumexp,
    "softmax": _softmax,
    "log_softmax": _softmax,
    "layer_norm": _norm,
    "group_norm": _norm,
}


ELEMENTWISE = frozenset({"softmax", "log_softmax", "layer_norm", "group_norm"})


def lower_reduction(
    name: str,
    node: Node,
    locs: dict[Value, Loc],
    epilogue: Sequence[Node] = (),
    reread: bool = False,
) -> Lowered:
    """The template kernel of ``node``; ``epilogue``: pointwise nodes of the same shape fused
    into the element store (only for the templates in :data:`ELEMENTWISE`). ``reread``: the
    target's loops see their own earlier stores to a buffer (C++: one thread runs a row's
    phases; a Triton program's lanes need not see each other's), so a template may keep a
    value in its output between phases."""
    if epilogue and node.op not in ELEMENTWISE:
        raise InternalValueError(f"{node.op} stores per-row results: no elementwise epilogue")
    if node.op == "softmax":
        return _softmax(name, node, locs, tuple(epilogue), reread)
    return TEMPLATES[node.op](name, node, locs, tuple(epilogue))
