"""The loop-level kernel IR: one kernel = an iteration domain, scalar SSA statements, reductions
and stores. Every printer (C++ today, Triton and TVM later) prints this IR and nothing else, so
fusion and lowering decisions are made once.

A kernel iterates ``outer`` loop variables; for each outer point it runs its ``phases`` in order.
A phase loops over the ``inner`` (reduced) variables, feeds reductions and stores elements. After
the phases, ``final`` stores write per-outer results (a sum, a mean). A statement of a later phase
may read an earlier phase's reduction result (``acc``): that is how softmax, layer_norm and var
are expressed (max, then sum of exp, then the normalized elements).

Statements are hash-consed by the :class:`KernelBuilder`: building the same expression twice
returns the same statement, so sharing is structural and printers never duplicate work.

Scalar types: ``f64 f32 i64 i32 i16 i8 u8 b``. Buffers also hold ``bf16`` and ``f16``, which load
as ``f32`` and round to nearest even on store; a 16-bit value computed inside a kernel is rounded
to its dtype (``round`` statement) where the IR value it stands for would have been.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> b = KernelBuilder("k", outer=(Var("i0", 8),))
    >>> x = b.buffer("x", "f32", 8)
    >>> y = b.buffer("y", "f32", 8, output=True)
    >>> i = Ix.var(b.outer[0])
    >>> v = b.op("add", [b.load(x, i), b.const(1.0, "f32")], "f32")
    >>> b.store(y, i, v)
    >>> kernel = b.build(nodes=(0,))
    >>> print(kernel.text().splitlines()[0])
    kernel k(x: f32[8], out y: f32[8]) over [i0<8]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.codegen.index import Atom, Clamp, Div, Ix, Mod, Var
from plait.errors import InternalValueError
from plait.symbolic.poly import Size, atoms_of

SCALAR_TYPES = ("f64", "f32", "i64", "i32", "i16", "i8", "u8", "b")
STORAGE_TYPES = (*SCALAR_TYPES, "bf16", "f16")
FLOAT_SCALARS = ("f64", "f32")

STORAGE_OF: dict[torch.dtype, str] = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b",
}
TORCH_OF: dict[str, torch.dtype] = {v: k for k, v in STORAGE_OF.items()}
ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1}
ITEMSIZE.update({"u8": 1, "b": 1})

# The closed set of scalar ops a printer must implement (besides load/const/index/acc).
SCALAR_OPS = frozenset(
    {
        "cast", "round", "add", "sub", "mul", "div", "neg", "abs",
        "idiv_trunc", "idiv_floor", "fdiv_trunc", "fdiv_floor", "pow", "ipow",
        "max", "min", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "where",
        "exp", "log", "sqrt", "tanh", "erf",
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
        "expm1", "log1p", "log2", "log10", "exp2", "erfc", "atan2", "hypot",
        "floor", "ceil", "trunc", "rint", "signbit", "fmod", "copysign", "fmax", "fmin",
        "imod_trunc", "imod_floor", "band", "bor", "bxor", "bnot",
    }
)  # fmt: skip
# Integer ops that report a division by zero (the kernel returns nonzero; PyTorch raises).
CHECKED_INT_OPS = frozenset({"idiv_trunc", "idiv_floor", "imod_trunc", "imod_floor"})
REDUCE_KINDS = ("sum", "prod", "max", "min")


def compute_type(storage: str) -> str:
    """The scalar type a buffer's elements are computed in (16-bit floats compute in f32)."""
    return "f32" if storage in ("bf16", "f16") else storage


def scalar_of(dtype: torch.dtype) -> str:
    return compute_type(STORAGE_OF[dtype])


def is_float(t: str) -> bool:
    return t in FLOAT_SCALARS


@dataclass(frozen=True)
class Buffer:
    """A kernel argument: a pointer to elements of ``dtype``; ``numel`` elements are touched."""

    name: str
    dtype: str
    numel: Size
    output: bool = False


@dataclass(eq=False)
class Stmt:
    """``t<id> = op(args)`` of scalar type ``dtype``. ``attr``: the constant (const), the
    ``(buffer, Ix)`` (load), the ``Ix`` (index), the accumulator number (acc), the target type
    (cast), the 16-bit storage type (round)."""

    id: int
    op: str
    args: tuple[Stmt, ...]
    dtype: str
    attr: Any = None

    def __str__(self) -> str:
        return f"t{self.id}"


@dataclass(frozen=True)
class Reduce:
    """Accumulator ``acc`` of scalar type ``dtype`` combines ``value`` over the inner loop."""

    acc: int
    kind: str
    value: Stmt
    dtype: str


@dataclass(frozen=True)
class Store:
    buffer: int
    index: Ix
    value: Stmt


@dataclass
class Phase:
    reduces: list[Reduce] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)


def _reach(s: Stmt, seen: dict[int, Stmt]) -> None:
    """``s`` and what it reads into ``seen`` (by id), operands first."""
    if s.id in seen:
        return
    for a in s.args:
        _reach(a, seen)
    seen[s.id] = s


@dataclass
class Kernel:
    name: str
    outer: tuple[Var, ...]
    inner: tuple[Var, ...]
    buffers: list[Buffer]
    phases: list[Phase]
    final: list[Store]
    nodes: tuple[int, ...] = ()
    template: str = "pointwise"

    @property
    def numel(self) -> Size:
        n: Size = 1
        for v in (*self.outer, *self.inner):
            n = n * v.extent
        return n

    def size_atoms(self) -> list[str]:
        """The size atoms (symbols of the program's shapes) the kernel's loops and indices use,
        sorted by name: the sizes a call passes it (none for a static kernel)."""
        sizes: list[Size] = [v.extent for v in (*self.outer, *self.inner)]
        for ix in kernel_indices(self):
            sizes.extend(_index_sizes(ix))
        return sorted(atoms_of(sizes))

    def stmts(self) -> list[Stmt]:
        """Every statement reachable from the kernel's stores and reductions, in dependency
        order."""
        seen: dict[int, Stmt] = {}
        for ph in self.phases:
            for r in ph.reduces:
                _reach(r.value, seen)
            for st in ph.stores:
                _reach(st.value, seen)
        for st in self.final:
            _reach(st.value, seen)
        return list(seen.values())

    def text(self) -> str:
        """A readable listing (the debugging and golden-test view)."""
        args = ", ".join(
            f"{'out ' if b.output else ''}{b.name}: {b.dtype}[{b.numel}]" for b in self.buffers
        )
        dom = ", ".join(f"{v}<{v.extent}" for v in self.outer)
        red = ", ".join(f"{v}<{v.extent}" for v in self.inner)
        lines = [f"kernel {self.name}({args}) over [{dom}]" + (f" reduce [{red}]" if red else "")]
        for s in self.stmts():
            lines.append(f"  {s} = {_stmt_text(s, self.buffers)}")
        for p, ph in enumerate(self.phases):
            for r in ph.reduces:
                lines.append(f"  phase {p}: acc{r.acc}: {r.dtype} = {r.kind}({r.value})")
            for st in ph.stores:
                lines.append(
                    f"  phase {p}: {self.buffers[st.buffer].name}[{st.index}] = {st.value}"
                )
        for st in self.final:
            lines.append(f"  final: {self.buffers[st.buffer].name}[{st.index}] = {st.value}")
        return "\n".join(lines)


def kernel_indices(kernel: Kernel) -> list[Ix]:
    """Every index expression of ``kernel``: loads, index statements and stores."""
    out = []
    for s in kernel.stmts():
        if s.op == "load":
            out.append(s.attr[1])
        elif s.op == "index":
            out.append(s.attr)
    for ph in kernel.phases:
        out.extend(st.index for st in ph.stores)
    out.extend(st.index for st in kernel.final)
    return out


def _index_sizes(ix: Ix) -> list[Size]:
    out: list[Size] = [ix.const]
    for a, c in ix.terms:
        out.append(c)
        out.extend(_atom_sizes(a))
    return out


def _atom_sizes(a: Atom) -> list[Size]:
    if isinstance(a, Var):
        return [a.extent]
    if isinstance(a, (Div, Mod)):
        return [a.k, *_index_sizes(a.e)]
    assert isinstance(a, Clamp)
    return [a.lo, a.hi, *_index_sizes(a.e)]


def _stmt_text(s: Stmt, buffers: list[Buffer]) -> str:
    if s.op == "const":
        return f"{s.dtype}({s.attr!r})"
    if s.op == "load":
        buf, ix = s.attr
        return f"load {buffers[buf].name}[{ix}]"
    if s.op == "index":
        return f"index({s.attr})"
    if s.op == "acc":
        return f"acc{s.attr}"
    extra = f" -> {s.attr}" if s.op in ("cast", "round") else ""
    return f"{s.op}({', '.join(map(str, s.args))}){extra}: {s.dtype}"


class KernelBuilder:
    """Builds one :class:`Kernel`; statements are hash-consed."""

    def __init__(self, name: str, outer: tuple[Var, ...], inner: tuple[Var, ...] = ()) -> None:
        self.name = name
        self.outer = outer
        self.inner = inner
        self.buffers: list[Buffer] = []
        self.phases: list[Phase] = [Phase()]
        self.final: list[Store] = []
        self._memo: dict[tuple[Any, ...], Stmt] = {}
        self._next_acc = 0

    # --- buffers ------------------------------------------------------------------------------
    def buffer(self, name: str, dtype: str, numel: Size, output: bool = False) -> int:
        self.buffers.append(Buffer(name, dtype, numel, output))
        return len(self.buffers) - 1

    # --- statements ---------------------------------------------------------------------------
    def _make(self, op: str, args: tuple[Stmt, ...], dtype: str, attr: Any = None) -> Stmt:
        if dtype not in SCALAR_TYPES:
            raise InternalValueError(
                f"statement {op}: scalar type {dtype!r} is not one of {SCALAR_TYPES}"
            )
        key = (op, tuple(a.id for a in args), dtype, _attr_key(attr))
        hit = self._memo.get(key)
        if hit is None:
            hit = Stmt(len(self._memo), op, args, dtype, attr)
            self._memo[key] = hit
        return hit

    def const(self, value: float | int | bool, dtype: str) -> Stmt:
        if dtype == "b":
            value = bool(value)
        elif not is_float(dtype):
            value = int(value)
        elif dtype == "f32" and isinstance(value, int) and not isinstance(value, bool):
            value = int_to_f32(value)
        else:
            value = float(value)
        return self._make("const", (), dtype, value)

    def load(self, buffer: int, index: Ix) -> Stmt:
        return self._make("load", (), compute_type(self.buffers[buffer].dtype), (buffer, index))

    def index(self, ix: Ix) -> Stmt:
        return self._make("index", (), "i64", ix)

    def acc(self, n: int, dtype: str) -> Stmt:
        return self._make("acc", (), dtype, n)

    def cast(self, x: Stmt, dtype: str) -> Stmt:
        if x.dtype == dtype:
            return x
        if x.op == "const":
            return (
                self.const(x.attr, dtype) if _exact_const(x.attr, dtype) else self._cast(x, dtype)
            )
        return self._cast(x, dtype)

    def _cast(self, x: Stmt, dtype: str) -> Stmt:
        return self._make("cast", (x,), dtype, dtype)

    def round(self, x: Stmt, storage: str) -> Stmt:
        """Round an f32 value to the precision of a 16-bit storage type (identity otherwise)."""
        if storage not in ("bf16", "f16") or x.op == "round":
            return x
        return self._make("round", (x,), "f32", storage)

    def op(self, op: str, args: list[Stmt], dtype: str) -> Stmt:
        if op not in SCALAR_OPS:
            raise InternalValueError(f"unknown scalar op {op!r}")
        return self._make(op, tuple(args), dtype)

    # --- structure ----------------------------------------------------------------------------
    def reduce(self, kind: str, value: Stmt, dtype: str) -> Stmt:
        """Add a reduction to the current phase; returns the statement reading its result
        (valid in later phases and in final stores)."""
        if kind not in REDUCE_KINDS:
            raise InternalValueError(f"unknown reduction {kind!r}")
        n = self._next_acc
        self._next_acc += 1
        self.phases[-1].reduces.append(Reduce(n, kind, value, dtype))
        return self.acc(n, dtype)

    def next_phase(self) -> None:
        self.phases.append(Phase())

    def store(self, buffer: int, index: Ix, value: Stmt) -> None:
        self.phases[-1].stores.append(Store(buffer, index, value))

    def store_final(self, buffer: int, index: Ix, value: Stmt) -> None:
        self.final.append(Store(buffer, index, value))

    def mark(self) -> tuple[int, ...]:
        """What has been built so far, for :meth:`rewind`."""
        last = self.phases[-1]
        return (len(self.buffers), len(self._memo), len(self.phases), len(last.stores),
                len(last.reduces), len(self.final), self._next_acc)  # fmt: skip

    def rewind(self, mark: tuple[int, ...]) -> None:
        """Forget every buffer, statement, store and reduction made since ``mark``. Statements
        are numbered in order of creation (the hash-consing table keeps insertion order), so
        those kept keep their numbers."""
        buffers, stmts, phases, stores, reduces, final, acc = mark
        del self.buffers[buffers:]
        while len(self._memo) > stmts:
            self._memo.popitem()
        del self.phases[phases:]
        del self.phases[-1].stores[stores:]
        del self.phases[-1].reduces[reduces:]
        del self.final[final:]
        self._next_acc = acc

    def build(self, nodes: tuple[int, ...], template: str = "pointwise") -> Kernel:
        phases = [p for p in self.phases if p.reduces or p.stores]
        return Kernel(
            self.name, self.outer, self.inner, self.buffers, phases, self.final, nodes, template
        )


def _attr_key(attr: Any) -> Any:
    if isinstance(attr, float):
        # NOTE: 0.0 and -0.0 (and NaNs) are different constants.
        return ("f", attr.hex())
    if isinstance(attr, bool):
        return ("b", attr)
    if isinstance(attr, tuple):
        return tuple(_attr_key(a) for a in attr)
    return attr


def int_to_f32(value: int) -> float:
    """The float32 nearest ``value`` (ties to even), as ATen converts an int64 to float32.

    ``float(value)`` rounds to float64 first, and the printer's float32 literal rounds again:
    ``2**60 + 2**36 + 1`` is ``2**60 + 2**36`` in float64, a tie that float32 breaks to even
    (``2**60``), where the integer rounds once to ``2**60 + 2**37``.

    >>> int_to_f32(2**60 + 2**36 + 1) == 2.0**60 + 2**37, int_to_f32(-3)
    (True, -3.0)
    """
    magnitude = abs(value)
    shift = magnitude.bit_length() - 24
    if shift > 0:
        q, r = divmod(magnitude, 1 << shift)
        half = 1 << (shift - 1)
        q += r > half or (r == half and q & 1)
        magnitude = q << shift
    return float(magnitude) if value >= 0 else -float(magnitude)


def _exact_const(value: Any, dtype: str) -> bool:
    """Whether converting a constant at build time gives what the C++ cast would."""
    if dtype == "b":
        return True
    if is_float(dtype):
        # NOTE: rounding a Python float to f32 is left to the compiler's exact conversion.
        return not (dtype == "f32" and isinstance(value, float))
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        bits = ITEMSIZE[dtype] * 8
        lo = 0 if dtype == "u8" else -(1 << (bits - 1))
        return lo <= value < lo + (1 << bits)
    return False


def reduce_identity(kind: str, t: str) -> object:
    """A reduction's initial value over scalar type ``t`` (every printer's)."""
    if kind == "sum":
        return 0.0 if is_float(t) else 0
    if kind == "prod":
        return 1.0 if is_float(t) else 1
    if is_float(t):
        return -math.inf if kind == "max" else math.inf
    if t == "u8":
        return 0 if kind == "max" else 255
    bits = {"i64": 64, "i32": 32, "i16": 16, "i8": 8}[t]
    return -(1 << (bits - 1)) if kind == "max" else (1 << (bits - 1)) - 1
