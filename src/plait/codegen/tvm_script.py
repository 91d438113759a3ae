"""The TVM printer: kernel IR to the TVMScript text of one TensorIR function.

The third printer of the kernel IR (after :mod:`plait.codegen.cpp` and
:mod:`plait.codegen.triton`), with the C++ printer's semantics statement for statement. The
function takes one flat buffer per kernel buffer, in buffer order (16-bit floats as their
``uint16`` bits, bools as ``uint8``), aligned to its element only (arena offsets and views are
not vector-aligned); a kernel with integer division takes one more ``int32[1]`` buffer, ``err``,
set to 1 where a divisor is 0 (the executor raises PyTorch's error).

Loops (after :func:`~plait.codegen.loops.merge_loops`, as the other printers) are printed
serial and unscheduled, one loop nest per block, in order: for each phase, one reduction block
per reduction (spatial over the outer variables, reducing over the inner ones, its result in an
``acc`` buffer shaped like the outer domain) and one block for the phase's stores (over outer and
inner variables), then one block for the final stores (over the outer ones).
:mod:`plait.codegen.tvm_schedule` schedules them (or tuning does, :mod:`plait.codegen.tvm_tune`).
Vector blocks (:mod:`plait.codegen.tvm_vector`) are printed over chunks of vector lanes instead;
a reduction accumulated in lanes is a vector block and its combines
(:mod:`plait.codegen.tvm_lanes`), and a kernel with such blocks is printed fused: every block
under the outer loops they share, one nest.

Statements are inlined into the expressions that read them (TVM's common subexpression pass
shares them again), so that a reduction's update is one store TensorIR recognizes; integer and
floor division and integer powers are ``T.let`` lines of their own, and a bfloat16 rounding's
argument that rounds in turn is a local scalar of its block (read three times, a chain of them
inlined grew as 3^n; TVM expands lets). Semantics that TVM would otherwise change are spelled
out: float operands pass through :func:`opaque` (TVM's simplifier applies integer algebra to
floats), NaN tests are ``T.isnan`` (it folds ``x != x`` to false), a float max or min reduction
is TVM's max (or min) plus a flag of NaNs and infinities, so that it stays a reduction TVM can
split into vector lanes and still returns what the C++ kernel does (one in lanes propagates NaN
in one pass instead). Transcendentals call the C library's functions (``expf``, ...), as the C++
kernels' scalar paths do, or libmvec's in vector blocks.

Refused (the caller falls back to the C++ printer, recorded): symbolic sizes (TVM kernels are
static), an empty loop, an index or buffer past int32, a reduction of bools.

Printing needs no TVM; building does.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> from plait.codegen.kir import KernelBuilder
    >>> b = KernelBuilder("k", outer=(Var("i0", 8),))
    >>> x, y = b.buffer("x", "f32", 8), b.buffer("y", "f32", 8, output=True)
    >>> i = Ix.var(b.outer[0])
    >>> b.store(y, i, b.op("exp", [b.load(x, i)], "f32"))
    >>> src = print_tvm(b.build(nodes=()), "k_exp")
    >>> 'T.call_pure_extern("float32", "expf"' in src.source, src.buffers
    (True, (('float32', 8), ('float32', 8)))
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from plait.codegen.errors import CodegenError
from plait.codegen.index import Atom, Clamp, Div, Ix, Mod, Var, index_bound
from plait.codegen.kir import CHECKED_INT_OPS, Kernel, Reduce, Stmt, Store, is_float
from plait.codegen.loops import merge_loops
from plait.codegen.tvm_lanes import lanes_buffers, lanes_reduction
from plait.codegen.tvm_scalar import (
    DTYPE,
    as_byte,
    bf16_bits,
    combine,
    const_text,
    extremum,
    float_ne,
    float_to_int,
    floor_division,
    holds_bf16_rounding,
    identity_text,
    integer_division,
    integer_power,
    local_scalar,
    opaque,
    product,
    round16,
    select,
    signbit,
    vector_lanes,
    vector_type,
)
from plait.codegen.tvm_vector import (
    lane_coefficient,
    reduction_lanes,
    rereads,
    store_lanes,
    vector_lanes_for,
    vector_name,
    without,
)
from plait.errors import InternalCompilerError

STORAGE = {**DTYPE, "bf16": "uint16", "f16": "uint16", "b": "uint8"}
ITEM = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "int16": 2, "uint16": 2}
ITEM.update({"int8": 1, "uint8": 1})
# The C library's math functions (float variants with an ``f`` suffix): what C++ kernels call.
LIBM = ("exp", "log", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "asinh", "acosh", "atanh", "expm1", "log1p", "log2", "log10", "exp2", "erfc", "pow",
        "atan2", "hypot", "fmod")  # fmt: skip
# Exact operations LLVM has instructions or intrinsics for.
_EXACT = {"sqrt": "T.sqrt", "floor": "T.floor", "ceil": "T.ceil", "trunc": "T.trunc"}
_EXACT.update({"rint": "T.nearbyint", "copysign": "T.copysign"})
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_BITWISE = {"band": "T.bitwise_and", "bor": "T.bitwise_or", "bxor": "T.bitwise_xor"}
INT32_BOUND = 1 << 31
# Statements printed as statements of their own (``T.let`` lines), never inlined.
_BOUND_OPS = (*CHECKED_INT_OPS, "fdiv_floor", "ipow")
# NOTE: the inlined text of a block's values, in characters, past which a block binds them all
INLINE_LIMIT = 1 << 15
PRINTER_VERSION = "plait-tvm-script-2"


# NOTE: the longest float sum a TVM kernel adds (its lanes add their elements in sequence):
# rows of 8192 float32 values passed the gate's reduction rule, rows of 20000 failed it; longer
# sums go to the C++ printer, which adds them in blocks (plait.codegen.cpp.BLOCK)
SUM_RUN = 8192


class Unsupported(CodegenError):
    """The TVM printer does not print this kernel (the C++ printer does); ``str()`` says why."""


@dataclass(frozen=True)
class TvmSource:
    """A printed kernel: ``source`` defines ``def symbol(...)``; ``buffers`` are its arguments'
    storage dtypes and element counts, in buffer order; ``checks_division``: one more argument,
    ``err`` (``int32[1]``). ``outer`` and ``inner``: the loop extents after merging (what the
    default schedule reads), and ``blocks`` the names of its blocks, in order. ``fused``: every
    block is printed under the outer loops they share (a reduction kernel with vector blocks,
    which TensorIR's ``compute_at`` cannot move: it misjudges their vector regions)."""

    symbol: str
    source: str
    buffers: tuple[tuple[str, int], ...]
    checks_division: bool
    outer: tuple[int, ...]
    inner: tuple[int, ...]
    phases: int
    blocks: tuple[str, ...] = ()
    fused: bool = False


def _static(n: object, what: str) -> int:
    if not isinstance(n, int):
        raise Unsupported(f"symbolic size {n} ({what}): TVM kernels are static")
    return n


def _index_bound(ix: Ix) -> int:
    return index_bound(ix, lambda n: _static(n, "index"))


class _Printer:
    def __init__(
        self, kernel: Kernel, symbol: str, vector_math: tuple[str, int] | None = None
    ) -> None:
        atoms = kernel.size_atoms()
        if atoms:
            raise Unsupported(f"symbolic sizes ({', '.join(atoms)}): TVM kernels are static")
        self.k = merge_loops(kernel)
        self.symbol = symbol
        self.outer = [_static(v.extent, "loop") for v in self.k.outer]
        self.inner = [_static(v.extent, "loop") for v in self.k.inner]
        if 0 in self.outer or 0 in self.inner:
            raise Unsupported("an empty loop (a zero extent)")
        self._check_int32()
        self.reduce_of = {r.acc: r for ph in self.k.phases for r in ph.reduces}
        for r in self.reduce_of.values():
            if r.dtype == "b":
                raise Unsupported("a reduction of bools")
            if r.kind == "sum" and is_float(r.dtype) and math.prod(self.inner) > SUM_RUN:
                raise Unsupported(
                    f"a float sum over {math.prod(self.inner)} elements (past {SUM_RUN}: the C++ "
                    "printer sums in blocks, a TVM kernel's lanes would add it in one run each)"
                )
        self.checks = any(s.op in CHECKED_INT_OPS for s in self.k.stmts())
        if any(s.op == "ipow" and s.args[1].op != "const" for s in self.k.stmts()):
            raise Unsupported("an integer power whose exponent is not a constant")
        if rereads(self.k):
            raise Unsupported("a phase reads back a buffer an earlier phase stored")
        self.lines: list[str] = []
        self.names: dict[int, str] = {}  # NOTE: statements bound by name in the current block
        self.inline = True
        self.block_names: list[str] = []
        # NOTE: a vector block (plait.codegen.tvm_vector): its lanes, its innermost variable
        self.isa = vector_math
        self.lanes = vector_lanes_for(self.k, self.outer, vector_math)
        self.lane_var: Var | None = self.k.outer[-1] if self.lanes > 1 else None
        # NOTE: reductions accumulated in vector blocks of lanes (plait.codegen.tvm_vector)
        self.red_lanes: dict[int, int] = {}
        for r in self.reduce_of.values():
            n = reduction_lanes(self.k, r, self.inner, vector_math)
            if n > 1:
                self.red_lanes[r.acc] = n
        self.store_lanes = [
            store_lanes(self.k, ph.stores, self.inner, vector_math) if self.lanes == 1 else 1
            for ph in self.k.phases
        ]
        self.fused = bool(self.red_lanes) or max(self.store_lanes, default=1) > 1

    @contextlib.contextmanager
    def vector(self, lanes: int, var: Var | None) -> Iterator[None]:
        """Print the enclosed block over chunks of ``lanes`` of ``var`` (1: scalars)."""
        saved = self.lanes, self.lane_var
        self.lanes, self.lane_var = lanes, (var if lanes > 1 else None)
        try:
            with vector_lanes(lanes):
                yield
        finally:
            self.lanes, self.lane_var = saved

    def _check_int32(self) -> None:
        k = self.k
        sizes = [_static(b.numel, "buffer") for b in k.buffers]
        sizes.append(math.prod(self.outer) * max(1, math.prod(self.inner)))
        for s in k.stmts():
            if s.op == "load":
                sizes.append(_index_bound(s.attr[1]))
            elif s.op == "index":
                sizes.append(_index_bound(s.attr))
        for st in [*(st for ph in k.phases for st in ph.stores), *k.final]:
            sizes.append(_index_bound(st.index))
        if max(sizes) >= INT32_BOUND:
            raise Unsupported("an index or buffer past int32 (TVM kernels index in int32)")

    # --- text helpers -------------------------------------------------------------------------
    def line(self, depth: int, *texts: str) -> None:
        self.lines += ["    " * depth + text for text in texts]

    def index(self, ix: Ix) -> str:
        parts = []
        for atom, coef in ix.terms:
            a = self._atom(atom)
            parts.append(a if coef == 1 else f"{a} * {coef}")
        if ix.const != 0 or not parts:
            parts.append(str(ix.const))
        return " + ".join(parts)

    def _atom(self, a: Atom) -> str:
        if isinstance(a, Var):
            return a.name
        if isinstance(a, Div):
            return f"T.floordiv({self.index(a.e)}, {a.k})"
        if isinstance(a, Mod):
            return f"T.floormod({self.index(a.e)}, {a.k})"
        assert isinstance(a, Clamp)
        return f"T.max(T.min({self.index(a.e)}, {a.hi}), {a.lo})"

    def acc_ref(self, n: int, suffix: str = "") -> str:
        outer = ", ".join(v.name for v in self.k.outer) or "0"
        return f"acc{n}{suffix}[{outer}]"

    def acc_value(self, n: int) -> str:
        """A reduction's result. A float max or min reduces with TVM's own max (or min) and a
        flag of what it saw (2: a NaN, 1: a value above the identity's side, else only
        infinities toward it), so that both are reductions TensorIR can split."""
        r = self.reduce_of[n]
        if not (is_float(r.dtype) and r.kind in ("max", "min")) or n in self.red_lanes:
            return self.acc_ref(n)
        flag = self.acc_ref(n, "_flag")
        inf = -math.inf if r.kind == "max" else math.inf
        nan, edge = const_text(math.nan, r.dtype), const_text(inf, r.dtype)
        return f"T.Select({flag} == 2, {nan}, T.Select({flag} == 1, {self.acc_ref(n)}, {edge}))"

    # --- statements ---------------------------------------------------------------------------
    def operand(self, s: Stmt, memo: dict[int, str] | None = None) -> str:
        """A statement's value where it is read: a constant, a bound name, or (inlined) its
        expression."""
        if s.op == "const":
            return const_text(s.attr, s.dtype)
        name = self.names.get(s.id)
        if name is not None:
            return name
        if memo is None:
            memo = {}
        return self.text_of(s, memo)

    def rhs(self, s: Stmt, memo: dict[int, str] | None = None) -> str:
        op, t = s.op, s.dtype
        if op == "const":
            return const_text(s.attr, t)
        if s.id in self.names and memo is not None:
            return self.names[s.id]
        a = [self.operand(x, memo) for x in s.args]
        if op == "load":
            return self.load(s)
        if op == "index":
            return f'T.Cast("int64", {self.index(s.attr)})'
        if op == "acc":
            if self.lanes > 1:  # NOTE: one value per outer point: broadcast
                with vector_lanes(1):
                    return f"T.Broadcast({self.acc_value(s.attr)}, {self.lanes})"
            return self.acc_value(s.attr)
        if op == "cast":
            return self.cast(a[0], s.args[0].dtype, t)
        if op == "round":
            return round16(a[0], s.attr)
        if t == "b" and op in ("add", "sub", "mul"):
            # NOTE: C++ bool arithmetic, converted back to bool
            return {
                "add": f"T.Or({a[0]}, {a[1]})",
                "sub": f"({as_byte(a[0])} != {as_byte(a[1])})",
            }.get(op, f"T.And({a[0]}, {a[1]})")
        if op in _ARITH or op in _COMPARE:
            x, y = a
            if s.args[0].dtype == "b":
                # NOTE: TVM's LLVM backend compares bools with float comparisons: as bytes
                x, y = as_byte(x), as_byte(y)
            if is_float(s.args[0].dtype):
                if op == "ne":
                    return float_ne(x, y, s.args[0].dtype)
                x, y = opaque(x, s.args[0].dtype, 0), opaque(y, s.args[0].dtype, 1)
                if op == "mul":
                    return product(x, y, t)
            return f"({x} {_ARITH.get(op) or _COMPARE[op]} {y})"
        if op in ("and", "or", "not"):
            return f"T.{op.capitalize()}({', '.join(a)})"
        if op == "neg":
            return f"(-{opaque(a[0], t, 0)})" if is_float(t) else f"({const_text(0, t)} - {a[0]})"
        if op == "abs":
            if is_float(t):
                return f"T.fabs({a[0]})"
            return select(f"{a[0]} < {const_text(0, t)}", f"({const_text(0, t)} - {a[0]})", a[0])
        if op == "where":
            return f"T.Select({a[0]}, {a[1]}, {a[2]})"
        return self.rhs_more(s, a)

    def rhs_more(self, s: Stmt, a: list[str]) -> str:
        op, t = s.op, s.dtype
        if op in ("max", "min", "fmax", "fmin"):
            return extremum(op, t, a[0], a[1])
        if op in _EXACT:
            return f"{_EXACT[op]}({', '.join(a)})"
        if op in LIBM:
            name = f"{op}f" if t == "f32" else op
            if self.lanes > 1:
                assert self.isa is not None
                name = vector_name(op, self.isa)
            return f'T.call_pure_extern("{vector_type(DTYPE[t])}", "{name}", {", ".join(a)})'
        if op == "fdiv_trunc":
            return f"T.trunc({a[0]} / {a[1]})"
        if op == "signbit":
            return signbit(a[0], s.args[0].dtype)
        if op in _BITWISE:
            if t == "b":
                return {"band": "T.And", "bor": "T.Or"}.get(
                    op, "T.bitwise_xor"
                ) + f"({a[0]}, {a[1]})"
            return f"{_BITWISE[op]}({a[0]}, {a[1]})"
        if op == "bnot":
            return f"T.Not({a[0]})" if t == "b" else f"T.bitwise_not({a[0]})"
        raise InternalCompilerError(f"statement {op} is printed by emit")

    def cast(self, x: str, src: str, t: str) -> str:
        if t == "b":
            if is_float(src):
                return float_ne(x, const_text(0.0, src), src)
            return f"({x} != {const_text(0, src)})"
        if is_float(src):
            x = opaque(x, src, 0)
        if is_float(src) and not is_float(t):
            # NOTE: PyTorch's widths (uint8 and int64 through 64 bits, the others through 32),
            # then the low bits; NaN and out-of-range values as the machine converts them
            wide = "int64" if t in ("u8", "i64") else "int32"
            return f'T.Cast("{vector_type(DTYPE[t])}", {float_to_int(x, src, wide)})'
        return f'T.Cast("{DTYPE[t]}", {x})'

    def ref(self, buf: int, ix: Ix) -> str:
        """An element of buffer ``buf``; in a vector block, the lanes' consecutive elements (or
        one element, broadcast)."""
        v = self.lane_var
        if v is None:
            return f"b{buf}[{self.index(ix)}]"
        if lane_coefficient(ix, v) == 0:
            return f"T.Broadcast(b{buf}[{self.index(ix)}], {self.lanes})"
        base = f"{self.index(without(ix, v))} + {v.name} * {self.lanes}"
        return f"b{buf}[T.Ramp({base}, 1, {self.lanes})]"

    def load(self, s: Stmt) -> str:
        buf, ix = s.attr
        ref = self.ref(buf, ix)
        storage = self.k.buffers[buf].dtype
        if storage == "bf16":
            return f'T.reinterpret("float32", T.shift_left(T.Cast("uint32", {ref}), T.uint32(16)))'
        if storage == "f16":
            return f'T.Cast("float32", T.reinterpret("float16", {ref}))'
        if storage == "b":
            return f"({ref} != T.uint8(0))"
        return ref

    def emit(self, depth: int, roots: list[Stmt]) -> None:
        """Open a block's statements: the ones that need statements of their own (integer
        division, floor division, integer power) as ``T.let`` lines, every other one inlined
        into the expressions that read it (TVM's common subexpression pass shares them again),
        so that a reduction's update is one store TensorIR recognizes. A block whose inlined
        text would grow past :data:`INLINE_LIMIT` binds every statement instead."""
        sizes: dict[int, int] = {}
        self.inline = sum(self._inline_size(r, sizes) for r in roots) <= INLINE_LIMIT
        self.names = {}
        done: set[int] = set()
        for r in roots:
            self._bind(depth, r, done)

    def _bind(self, depth: int, s: Stmt, done: set[int]) -> None:
        if s.id in done or s.op == "const":
            return
        for x in s.args:
            self._bind(depth, x, done)
        done.add(s.id)
        if s.op == "round" and s.attr == "bf16" and holds_bf16_rounding(s.args[0], self.names):
            # NOTE: read three times by the rounding, stored once (inlined, a chain grew as 3^n)
            x, name = s.args[0], f"s{s.args[0].id}_{len(self.block_names)}"
            self.line(depth, *local_scalar(name, x.dtype, self.operand(x)))
            self.names[x.id] = f"{name}[0]"

        def emit(text: str) -> None:
            self.line(depth, text)

        n = f"t{s.id}"
        if s.op in CHECKED_INT_OPS:
            a, b = (self.operand(x) for x in s.args)
            integer_division(s.op, s.dtype, a, b, n, emit)
        elif s.op == "fdiv_floor":
            a, b = (self.operand(x) for x in s.args)
            floor_division(s.dtype, a, b, n, emit)
        elif s.op == "ipow":
            integer_power(s.dtype, self.operand(s.args[0]), int(s.args[1].attr), n, emit)
        elif not self.inline and s.op != "acc":
            self.let(depth, f"t{s.id}", s.dtype, self.rhs(s))
        else:
            return
        self.names[s.id] = f"t{s.id}"

    def _inline_size(self, s: Stmt, sizes: dict[int, int]) -> int:
        """About how long ``s`` is inlined (bound statements count as their name)."""
        hit = sizes.get(s.id)
        if hit is None:
            if s.op in _BOUND_OPS:
                hit = 8
            else:
                hit = 40 + sum(self._inline_size(x, sizes) for x in s.args)
            sizes[s.id] = hit = min(hit, INLINE_LIMIT + 1)
        return hit

    def text_of(self, s: Stmt, memo: dict[int, str]) -> str:
        """``s`` as an expression (lets by name, the rest inlined)."""
        hit = memo.get(s.id)
        if hit is None:
            for x in s.args:
                self.text_of(x, memo)
            hit = memo[s.id] = self.rhs(s, memo)
        return hit

    def let(self, depth: int, name: str, t: str, value: str) -> None:
        self.line(depth, f"{name}: T.let[T.{DTYPE[t]}] = {value}")

    # --- blocks -------------------------------------------------------------------------------
    def extents(self, variables: Sequence[Var], extents: list[int]) -> list[tuple[Var, int]]:
        """Loop variables and extents; in a vector block, its lane variable's counts chunks."""
        return [
            (v, e // self.lanes if v == self.lane_var else e) for v, e in zip(variables, extents)
        ]

    def axes(self, depth: int, inner: str | None) -> None:
        for v, e in self.extents(self.k.outer, self.outer):
            self.line(depth, f"{v.name} = T.axis.spatial({e}, l_{v.name})")
        if inner is not None:
            for v, e in self.extents(self.k.inner, self.inner):
                self.line(depth, f"{v.name} = T.axis.{inner}({e}, l_{v.name})")

    def loops(self, depth: int, inner: bool) -> int:
        """A block's own loop nest: the outer loops, and the inner ones if ``inner``."""
        loops = [] if self.fused else self.extents(self.k.outer, self.outer)
        if inner:
            loops += self.extents(self.k.inner, self.inner)
        for v, e in loops:
            self.line(depth, f"for l_{v.name} in range({e}):")
            depth += 1
        return depth

    def reduce_block(self, depth: int, p: int, r: Reduce) -> None:
        """One reduction block (two for a float max or min: the value, and its flag), its
        initial value the identity TensorIR knows the reduction by (``T.min_value`` for a
        max), so that the schedule can split it into vector lanes. A reduction of
        :attr:`red_lanes`: a vector block of lanes and their combine instead."""
        if r.acc in self.red_lanes:
            lanes_reduction(self, depth, f"p{p}_{r.kind}_{r.dtype}_acc{r.acc}", r)
            return
        self._reduction(depth, f"p{p}_{r.kind}_{r.dtype}_acc{r.acc}", r, "")
        if is_float(r.dtype) and r.kind in ("max", "min"):
            self._reduction(depth, f"p{p}_flag_i32_acc{r.acc}", r, "_flag")

    def _reduction(self, depth: int, name: str, r: Reduce, suffix: str) -> None:
        d = self.loops(depth, inner=True)
        self.line(d, f'with T.sblock("{name}"):')
        self.block_names.append(name)
        self.axes(d + 1, "reduce")
        ref = self.acc_ref(r.acc, suffix)
        self.line(d + 1, "with T.init():")
        self.line(d + 2, f"{ref} = {identity_text(r.kind if not suffix else 'flag', r.dtype)}")
        self.emit(d + 1, [r.value])
        v = self.operand(r.value)
        if suffix:
            edge = const_text(-math.inf if r.kind == "max" else math.inf, r.dtype)
            beyond = f"{opaque(v, r.dtype, 0)} {'>' if r.kind == 'max' else '<'} {edge}"
            code = f"T.Select(T.isnan({v}), 2, T.Select({beyond}, 1, 0))"
            self.line(d + 1, f"{ref} = T.max({ref}, {code})")
            return
        self.line(d + 1, f"{ref} = {combine(r, ref, v)}")

    def store_block(self, depth: int, name: str, stores: list[Store], inner: bool) -> None:
        d = self.loops(depth, inner)
        self.line(d, f'with T.sblock("{name}"):')
        self.block_names.append(name)
        self.axes(d + 1, "spatial" if inner else None)
        with vector_lanes(self.lanes):
            self.emit(d + 1, [st.value for st in stores])
            for st in stores:
                self.line(d + 1, f"{self.ref(st.buffer, st.index)} = {self.stored(st)}")

    def stored(self, st: Store) -> str:
        v = self.operand(st.value)
        storage = self.k.buffers[st.buffer].dtype
        if storage == "bf16":
            return bf16_bits(v, rounded=st.value.op == "round" and st.value.attr == "bf16")
        if storage == "f16":
            return f'T.reinterpret("uint16", T.Cast("float16", {v}))'
        if storage == "b":
            return f'T.Cast("uint8", {v})'
        if storage != st.value.dtype:
            return self.cast(v, st.value.dtype, storage)
        return v

    def phase_stores(self, depth: int, p: int, stores: list[Store]) -> None:
        """A phase's store block: a vector block in a pointwise kernel of vector lanes, or in a
        reduction kernel where its stores call libmvec (:func:`store_lanes`)."""
        if self.lanes > 1:
            self.store_block(depth, f"p{p}_vector{self.lanes}", stores, inner=True)
            return
        lanes = self.store_lanes[p]
        with self.vector(lanes, self.k.inner[-1] if self.k.inner else None):
            name = f"p{p}_store" if lanes == 1 else f"p{p}_vector{lanes}"
            self.store_block(depth, name, stores, inner=True)

    def source(self) -> TvmSource:
        k = self.k
        args = [
            f'b{j}: T.Buffer(({b.numel},), "{STORAGE[b.dtype]}", align={ITEM[STORAGE[b.dtype]]})'
            for j, b in enumerate(k.buffers)
        ]
        if self.checks:
            args.append('err: T.Buffer((1,), "int32", align=4)')
        self.line(0, "@T.prim_func(s_tir=True)")
        self.line(0, f"def {self.symbol}({', '.join(args)}):")
        shape = ", ".join(map(str, self.outer)) or "1"
        for r in self.reduce_of.values():
            self.line(1, f'acc{r.acc} = T.sblock_alloc_buffer(({shape},), "{DTYPE[r.dtype]}")')
            for buf, lanes in lanes_buffers(r, self.red_lanes.get(r.acc, 1)):
                alloc = f'T.sblock_alloc_buffer(({shape}, {lanes}), "{DTYPE[r.dtype]}")'
                self.line(1, f"{buf} = {alloc}")
            if is_float(r.dtype) and r.kind in ("max", "min") and r.acc not in self.red_lanes:
                self.line(1, f'acc{r.acc}_flag = T.sblock_alloc_buffer(({shape},), "int32")')
        depth = 1
        if self.fused:
            for v, e in zip(self.k.outer, self.outer):
                self.line(depth, f"for l_{v.name} in range({e}):")
                depth += 1
        for p, ph in enumerate(k.phases):
            for r in ph.reduces:
                self.reduce_block(depth, p, r)
            if ph.stores:
                self.phase_stores(depth, p, ph.stores)
        if k.final:
            self.store_block(depth, "final", k.final, inner=False)
        if not k.phases and not k.final:
            self.line(depth, "T.evaluate(0)")
        buffers = tuple((STORAGE[b.dtype], int(b.numel)) for b in k.buffers)
        return TvmSource(
            self.symbol,
            "\n".join(self.lines) + "\n",
            buffers,
            self.checks,
            tuple(self.outer),
            tuple(self.inner),
            len(k.phases),
            tuple(self.block_names),
            self.fused,
        )


def print_tvm(kernel: Kernel, symbol: str, vector_math: tuple[str, int] | None = None) -> TvmSource:
    """``kernel`` as the TVMScript of ``def symbol(b0, b1, ...)``; raises :class:`Unsupported`
    for what the TVM printer does not print (the caller's C++ fallback records why).
    ``vector_math``: libmvec's vector ABI and lanes (:func:`~plait.codegen.tvm_vector.vector_isa`)
    where it may be called (vector blocks, :mod:`plait.codegen.tvm_vector`); None: never."""
    return _Printer(kernel, symbol, vector_math).source()
