"""Lowering: a fusion group of IR nodes becomes one kernel of the loop-level kernel IR.

A value inside a kernel is an expression of the loop index: a load from a buffer (a graph input,
an extern's result, a value materialized by an earlier kernel) at a strided or div/mod index, or
the value's own computation inlined at that index (pointwise ops, views as index maps, constants,
``cat``/``stack`` as selections). A value that the kernel itself stores is computed once and
reused at the kernel's own index.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.codegen.fusion import plan_graph
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> gb.output(gb.call("relu", gb.call("add", x, 1.0)))
    >>> plan = plan_graph(gb.build())
    >>> [k.kernel.template for k in plan.kernels]
    ['pointwise']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plait.codegen.index import Ix, Var, contiguous_strides, linear
from plait.codegen.kir import STORAGE_OF, KernelBuilder, Stmt, scalar_of
from plait.codegen.placement import Loc, Lowered
from plait.codegen.scalar import CHANNEL_OPERANDS, RULES
from plait.codegen.scalar_args import Arg, arg_of, to
from plait.codegen.views import (
    INDEXED_VIEWS,
    MAPPED_VIEWS,
    cat_pieces,
    input_index,
    moved_index,
    pad_window,
    sizes_of,
)
from plait.ir.graph import Node, Value
from plait.ir.types import TensorType
from plait.symbolic.poly import Poly, Size, hint


def native_max_pool(node: Node) -> bool:
    """Whether a Triton kernel computes ``node`` (a ``max_pool2d``) in place of ATen's call: a
    floating 4-D input of static size, no ``ceil_mode`` (a window past the input's end). Its
    reads are inlined (the producer's epilogue, batch norm and ReLU, computed at each window
    position) and its result stored in the layout the next convolution wants."""
    if node.op != "max_pool2d" or node.attrs.get("ceil_mode"):
        return False
    x = node.inputs[0]
    t = x.type if isinstance(x, Value) else None
    if not isinstance(t, TensorType) or t.rank != 4 or not t.dtype.is_floating_point:
        return False
    return t.is_static


class Unfusable(Exception):
    """A value would read a value of its own kernel at another index than the kernel's own."""


def loop_vars(shape: Sequence[Size], prefix: str = "i", start: int = 0) -> tuple[Var, ...]:
    return tuple(Var(f"{prefix}{start + k}", _extent(n)) for k, n in enumerate(shape))


def _extent(n: Size) -> Size:
    return n if isinstance(n, Poly) else int(n)


def size_stmt(b: KernelBuilder, n: Size, dtype: str = "i64") -> Stmt:
    """A size as a value of scalar type ``dtype``: a constant, or a symbolic size read at run
    time (an index statement of the size, converted)."""
    if isinstance(n, int):
        return b.const(n, dtype)
    return b.cast(b.index(Ix.lit(n)), dtype)


class Lowerer:
    """Builds one kernel. ``locs`` says where each value lives; ``own`` are the values this
    kernel stores (computed once, at the kernel's own index ``home``)."""

    def __init__(self, builder: KernelBuilder, locs: dict[Value, Loc]) -> None:
        self.b = builder
        self.locs = locs
        self.bindings: list[Value] = []
        self._buf_of: dict[Value, int] = {}
        self.own: dict[Value, Stmt] = {}
        self.home: tuple[Ix, ...] | None = None
        self.own_values: set[Value] = set()
        self._memo: dict[tuple[int, tuple[Ix, ...]], Stmt] = {}
        self.covered: set[int] = set()

    # --- buffers ------------------------------------------------------------------------------
    def buffer_for(self, v: Value, output: bool = False) -> int:
        if v in self._buf_of and not output:
            return self._buf_of[v]
        t = v.type
        assert isinstance(t, TensorType)
        numel: Size = 1
        for d in sizes_of(t):
            numel = numel * d
        kind = "out" if output else "in"
        index = self.b.buffer(f"{kind}{len(self.bindings)}", STORAGE_OF[t.dtype], numel, output)
        self.bindings.append(v)
        if not output:
            self._buf_of[v] = index
        return index

    # --- values -------------------------------------------------------------------------------
    def value_at(self, v: Value, idx: tuple[Ix, ...]) -> Stmt:
        """The element of ``v`` at ``idx``, in ``v``'s compute type."""
        if v in self.own_values:
            if idx != self.home:
                raise Unfusable(f"%{v.name} read at another index than its kernel's own")
            return self.own[v]
        key = (id(v), idx)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._value_at(v, idx)
            self._memo[key] = hit
        return hit

    def _value_at(self, v: Value, idx: tuple[Ix, ...]) -> Stmt:
        loc = self.locs[v]
        if loc.kind in ("input", "buffer", "view"):
            assert loc.base is not None
            if loc.base in self.own_values:
                raise Unfusable(f"%{v.name} views a value its own kernel is writing")
            buf = self.buffer_for(loc.base)
            return self.b.load(buf, linear(idx, loc.strides, loc.offset))
        return self.produce(v, idx)

    def produce(self, v: Value, idx: tuple[Ix, ...]) -> Stmt:
        """``v`` computed from its producer at ``idx`` (whatever its location)."""
        node = v.producer
        assert node is not None, f"%{v.name} has no location"
        self.covered.add(node.id)
        if node.op in MAPPED_VIEWS:
            x = node.inputs[0]
            assert isinstance(x, Value)
            return self.value_at(x, input_index(node, v.index, idx))
        if node.op in INDEXED_VIEWS:
            x = node.inputs[0]
            assert isinstance(x, Value)
            return self.value_at(x, moved_index(node, idx))
        if node.op == "constant_pad":
            return self._constant_pad(node, idx)
        if node.op in ("cat", "stack"):
            return self._select(node, idx)
        if node.op in ("full", "zeros", "ones", "arange"):
            return self._constant(node, idx)
        if node.op == "max_pool2d":
            return self._max_pool(node, idx)
        return self.compute(node, idx)

    def _max_pool(self, node: Node, idx: tuple[Ix, ...]) -> Stmt:
        """The largest input element of the output element's window, bit for bit ATen's (NaN if
        any is NaN; of equal values the first); a window position outside the input counts as
        -inf (:func:`native_max_pool` says which nodes come here)."""
        self.covered.add(node.id)
        out = node.outputs[0].type
        x = node.inputs[0]
        assert isinstance(out, TensorType) and isinstance(x, Value)
        t = scalar_of(out.dtype)
        a = node.attrs
        kernel, pad, dil = a["kernel_size"], a["padding"], a["dilation"]
        stride = a["stride"] or kernel
        in_shape = sizes_of(x.type)
        rank = len(in_shape)
        low = self.b.const(float("-inf"), t)
        # NOTE: ATen's fold, in its window order (rows, then columns): a value replaces the
        # maximum when greater, or NaN; so of equal values (+0.0, -0.0) the first stays, of NaNs
        # the last; a position outside the input is -inf, which never replaces it
        best = low
        for kh in range(kernel[0]):
            for kw in range(kernel[1]):
                sub = list(idx)
                take: Stmt | None = None
                for j, k in ((0, kh), (1, kw)):
                    d = rank - 2 + j
                    n = in_shape[d]
                    assert isinstance(n, int)  # NOTE: native_max_pool admits static sizes only
                    pos = idx[d] * stride[j] + (k * dil[j] - pad[j])
                    sub[d] = pos.clamp(0, n - 1)
                    lo, hi = pos.range
                    always = {"ge": isinstance(lo, int) and lo >= 0,
                              "lt": isinstance(hi, int) and hi < n}  # fmt: skip
                    for cond, bound in (("ge", 0), ("lt", n)):
                        if always[cond]:
                            continue  # NOTE: always in range: no test
                        where = self.b.index(pos)
                        test = self.b.op(cond, [where, self.b.const(bound, "i64")], "b")
                        take = test if take is None else self.b.op("and", [take, test], "b")
                value = to(self.b, arg_of(x, self.value_at(x, tuple(sub))), t)
                if take is not None:
                    value = self.b.op("where", [take, value, low], t)
                greater = self.b.op("gt", [value, best], "b")
                nan = self.b.op("ne", [value, value], "b")
                replaces = self.b.op("or", [greater, nan], "b")
                best = self.b.op("where", [replaces, value, best], t)
        return self.b.round(best, STORAGE_OF[out.dtype])

    def compute(self, node: Node, idx: tuple[Ix, ...]) -> Stmt:
        """A pointwise node's value at ``idx`` (rounded to its 16-bit dtype if it has one)."""
        self.covered.add(node.id)
        out = node.outputs[0].type
        assert isinstance(out, TensorType)
        out_shape = sizes_of(out)
        channel = CHANNEL_OPERANDS.get(node.op, ())
        args: list[Arg] = []
        for pos, operand in enumerate(node.inputs):
            if isinstance(operand, Value):
                if pos in channel:
                    sub: tuple[Ix, ...] = (idx[1] if len(idx) > 1 else Ix.lit(0),)
                else:
                    sub = broadcast_index(idx, out_shape, sizes_of(operand.type))
                args.append(arg_of(operand, self.value_at(operand, sub)))
            else:
                args.append(arg_of(operand, None))
        stmt = RULES[node.op](self.b, node, args, idx)
        return self.b.round(stmt, STORAGE_OF[out.dtype])

    def _select(self, node: Node, idx: tuple[Ix, ...]) -> Stmt:
        out = node.outputs[0].type
        assert isinstance(out, TensorType)
        t = scalar_of(out.dtype)
        d, pieces = cat_pieces(node, idx)
        if not pieces:
            return self.b.const(0, t)
        result: Stmt | None = None
        for pos, start, sub in reversed(pieces):
            x = node.inputs[pos]
            assert isinstance(x, Value)
            value = self.b.round(
                to(self.b, arg_of(x, self.value_at(x, sub)), t), STORAGE_OF[out.dtype]
            )
            if result is None:
                result = value
                continue
            bound = size_stmt(self.b, start + _piece_len(node, pos, d))
            take = self.b.op("lt", [self.b.index(idx[d]), bound], "b")
            result = self.b.op("where", [take, value, result], t)
        assert result is not None
        return result

    def _constant_pad(self, node: Node, idx: tuple[Ix, ...]) -> Stmt:
        """The input where the index falls inside it, else the fill value (in x's dtype)."""
        out = node.outputs[0].type
        x = node.inputs[0]
        assert isinstance(out, TensorType) and isinstance(x, Value)
        t = scalar_of(out.dtype)
        fill = self.b.round(
            to(self.b, Arg(None, node.attrs["value"], None), t), STORAGE_OF[out.dtype]
        )
        if 0 in sizes_of(x.type):
            return fill  # NOTE: an empty input has no element to load: all fill
        sub, conditions = pad_window(node, idx)
        value = self.b.round(to(self.b, arg_of(x, self.value_at(x, sub)), t), STORAGE_OF[out.dtype])
        take: Stmt | None = None
        for i, lo, hi in conditions:
            where = self.b.index(i)
            inside = self.b.op("lt", [where, size_stmt(self.b, hi)], "b")
            if lo > 0:
                above = self.b.op("ge", [where, self.b.const(lo, "i64")], "b")
                inside = self.b.op("and", [above, inside], "b")
            take = inside if take is None else self.b.op("and", [take, inside], "b")
        if take is None:
            return value
        return self.b.op("where", [take, value, fill], t)

    def _constant(self, node: Node, idx: tuple[Ix, ...]) -> Stmt:
        self.covered.add(node.id)
        out = node.outputs[0].type
        assert isinstance(out, TensorType)
        t = scalar_of(out.dtype)
        a = node.attrs
        if node.op == "arange":
            acc = t if t not in ("f32", "f64") else "f64"
            i = self.b.cast(self.b.index(idx[0]), acc)
            step = to(self.b, Arg(None, a["step"], None), acc)
            start = to(self.b, Arg(None, a["start"], None), acc)
            value = self.b.op("add", [start, self.b.op("mul", [i, step], acc)], acc)
            return self.b.round(self.b.cast(value, t), STORAGE_OF[out.dtype])
        fill = {"zeros": 0, "ones": 1}.get(node.op, a.get("value"))
        value = to(self.b, Arg(None, fill, None), t)
        return self.b.round(value, STORAGE_OF[out.dtype])


def _piece_len(node: Node, pos: int, d: int) -> Size:
    if node.op == "stack":
        return 1
    x = node.inputs[pos]
    assert isinstance(x, Value)
    return sizes_of(x.type)[d]


def broadcast_index(
    idx: tuple[Ix, ...], out_shape: tuple[Size, ...], shape: tuple[Size, ...]
) -> tuple[Ix, ...]:
    """The index into an operand of ``shape`` broadcast to ``out_shape``."""
    lead = len(out_shape) - len(shape)
    return tuple(
        Ix.lit(0) if shape[j] == 1 and out_shape[lead + j] != 1 else idx[lead + j]
        for j in range(len(shape))
    )


def memory_order(shape: Sequence[Size], strides: Sequence[Size]) -> list[int]:
    """Dims from the largest stride to the smallest (the loop order that walks memory; a
    symbolic stride is ordered by a representative value: the order decides speed only)."""
    return sorted(range(len(shape)), key=lambda d: (-hint(strides[d]), d))


class OpenKernel:
    """A pointwise kernel still taking members, each stored into a fresh buffer laid out with
    ``strides`` (contiguous by default; loops walk that layout's memory order): each value
    added is lowered once, on top of what the members before it built (a kernel of n members
    costs n lowerings, where lowering all of them again at each member cost n^2/2). A member
    that cannot join raises :class:`Unfusable` and leaves the kernel as it was.

    Example:
        >>> import torch
        >>> from plait.ir import GraphBuilder, TensorType
        >>> gb = GraphBuilder()
        >>> x = gb.input("x", TensorType((4,), torch.float32))
        >>> gb.output(gb.call("exp", x))
        >>> g = gb.build()
        >>> (y,) = g.outputs
        >>> open_kernel = OpenKernel("k0", (4,), {g.inputs[0]: Loc("input", g.inputs[0], 0, (1,))})
        >>> open_kernel.add(y)
        >>> [v.name for v in open_kernel.lowered().bindings] == [g.inputs[0].name, y.name]
        True
    """

    def __init__(
        self,
        name: str,
        shape: tuple[Size, ...],
        locs: dict[Value, Loc],
        strides: tuple[Size, ...] | None = None,
    ) -> None:
        self.strides = strides or contiguous_strides(shape)
        order = memory_order(shape, self.strides)
        outer = tuple(Var(f"i{k}", _extent(shape[d])) for k, d in enumerate(order))
        by_dim = {d: outer[k] for k, d in enumerate(order)}
        self.b = KernelBuilder(name, outer)
        self.low = Lowerer(self.b, locs)
        self.home = tuple(Ix.var(by_dim[d]) for d in range(len(shape)))
        self.low.home = self.home
        self.members: list[Value] = []

    @property
    def name(self) -> str:
        return self.b.name

    @property
    def covered(self) -> set[int]:
        """The nodes the members computed so far (inline or stored)."""
        return self.low.covered

    def add(self, v: Value) -> None:
        """Store ``v`` (of the kernel's shape) into a fresh buffer, computed at the kernel's
        own index; raises :class:`Unfusable` (kernel unchanged) where it cannot join."""
        low = self.low
        mark = (self.b.mark(), len(low.bindings), len(low._buf_of), len(low._memo))
        covered = set(low.covered)
        try:
            stmt = low.produce(v, self.home)
        except Unfusable:
            built, bindings, buffers, memo = mark
            self.b.rewind(built)
            del low.bindings[bindings:]
            _truncate(low._buf_of, buffers)
            _truncate(low._memo, memo)
            low.covered = covered
            raise
        low.own[v] = stmt
        low.own_values.add(v)
        out = low.buffer_for(v, output=True)
        self.b.store(out, linear(self.home, self.strides), stmt)
        self.members.append(v)

    def lowered(self) -> Lowered:
        """The kernel with the members added so far."""
        nodes = tuple(sorted(self.low.covered))
        return Lowered(self.b.build(nodes, "pointwise"), self.low.bindings, self.low.covered)


def _truncate(table: dict[Any, Any], length: int) -> None:
    """Drop the entries added after the first ``length`` (dicts keep insertion order)."""
    while len(table) > length:
        table.popitem()
