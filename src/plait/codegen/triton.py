"""The Triton printer: kernel IR to one ``@triton.jit`` kernel, as the text of a Python module.

The kernel takes one pointer per kernel buffer, in buffer order (element 0 of the buffer); static
sizes, strides and block sizes are literals of the source, so a launch passes the buffers and
nothing else (a symbolic kernel: the size atoms too, below). The semantics are the C++
printer's (:mod:`plait.codegen.cpp`), statement for statement:

- Pointwise kernels (no ``inner``) flatten the outer domain into one index, ``XBLOCK`` elements
  per program, masked at the end; each loop variable is recovered with ``//`` and ``%`` of the
  extents (loop variables and indices are nonnegative, :mod:`plait.codegen.index`).
- Kernels with ``inner`` are 2-D: ``XBLOCK`` rows (outer points) by ``RBLOCK`` reduced elements,
  looping over the flattened inner domain in chunks of ``RBLOCK`` (one chunk, no loop, when the
  row fits). Each reduction accumulates ``[XBLOCK, RBLOCK]`` partials, masked lanes holding the
  reduction's identity, and reduces them across the row after its phase; a later phase reads the
  ``[XBLOCK, 1]`` result. Float max/min ignore NaN while accumulating and return NaN where one was
  seen, as the C++ printer does. (Of a row holding both +0.0 and -0.0 as its max or min, which
  zero comes back is the reduction tree's choice; the C++ printer returns the first in row
  order.)
- Every statement has exactly its IR dtype: constants are typed (``tl.full([], v, dtype)``), so
  Triton's promotion of Python scalars never applies; ``-0.0`` is built from its bits (Triton
  folds a zero constant to +0.0).
- Transcendentals and exact helpers are libdevice's functions, called through the module global
  ``M`` that the loader binds (:mod:`plait.codegen.triton_load`): libdevice on a GPU, a numpy
  shim under Triton's interpreter (:mod:`plait.codegen.triton_interp`).
- Index arithmetic is int32 when every index, extent and buffer fits in 2**30 elements (masked
  lanes run a block past the end), else int64.
- Symbolic sizes (a :class:`~plait.symbolic.poly.Poly` extent, stride or offset): the kernel
  takes each size atom it uses (:meth:`~plait.codegen.kir.Kernel.size_atoms`) as one more
  integer argument after the pointers, ``sz_<atom>``, marked ``do_not_specialize`` (one binary
  serves every size). Index arithmetic is then int64, masks compare against the sizes, a
  reduction loops over its row in chunks of ``RBLOCK`` whatever its length (a ``while`` loop:
  Triton's interpreter cannot ``range`` over a runtime integer), and the grid is computed per
  launch from the bound sizes (:attr:`TritonSource.rows`). Block sizes come from the size hints
  (:func:`~plait.codegen.triton_blocks.default_blocks`): they decide speed, never coverage.

Printing needs no Triton; loading and launching do.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> from plait.codegen.kir import KernelBuilder
    >>> b = KernelBuilder("k", outer=(Var("i0", 8),))
    >>> x, y = b.buffer("x", "f32", 8), b.buffer("y", "f32", 8, output=True)
    >>> i = Ix.var(b.outer[0])
    >>> b.store(y, i, b.op("exp", [b.load(x, i)], "f32"))
    >>> ts = print_triton(b.build(nodes=()), "k_exp")
    >>> "@triton.jit" in ts.source, "M.exp(" in ts.source, ts.grid, ts.num_warps
    (True, True, (1,), 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from plait.codegen.index import Atom, Clamp, Div, Ix, Mod, Var, index_bound
from plait.codegen.kir import Kernel, Reduce, Stmt, Store, is_float, reduce_identity
from plait.codegen.loops import merge_loops
from plait.codegen.triton_blocks import Blocks, blocks_hints, default_blocks, static
from plait.codegen.triton_helpers import helpers_text, module_header, with_needs
from plait.codegen.triton_text import TL, TritonSource, const_text, size_arg, size_text
from plait.errors import InternalCompilerError
from plait.symbolic.poly import Poly, Size

# Indices stay int32 below this bound (a masked lane runs at most a block past the end).
INT32_BOUND = 1 << 30
INT32_LIMIT = 1 << 31

# libdevice's name for each IR op computed by one libdevice call.
LIBDEVICE = {op: op for op in ("exp", "log", "tanh", "erf", "sin", "cos", "tan", "asin", "acos",
                               "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1",
                               "log1p", "log2", "log10", "exp2", "erfc", "atan2", "hypot", "pow",
                               "floor", "ceil", "trunc", "rint", "fmod", "copysign")}  # fmt: skip
LIBDEVICE["sqrt"] = "sqrt_rn"  # NOTE: tl.sqrt is approximate on the GPU; sqrt_rn is IEEE
# Every libdevice function a printed kernel may call (the interpreter's shim provides each).
LIBDEVICE_NAMES = frozenset({*LIBDEVICE.values(), "div_rn", "signbit"})


_INT_DIVISION = ("idiv_trunc", "idiv_floor", "imod_trunc", "imod_floor")
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_BOOL_ARITH = {"add": "|", "sub": "^", "mul": "&"}  # C++ bool arithmetic, converted back to bool
_BITWISE = {"band": "&", "bor": "|", "bxor": "^", "and": "&", "or": "|"}
_INT_BITS = {"i64": 63, "i32": 31, "i16": 15, "i8": 7, "u8": 8}


def _index_bound(ix: Ix) -> int:
    return index_bound(ix, static)


class _Printer:
    def __init__(self, kernel: Kernel, symbol: str, blocks: Blocks | None = None) -> None:
        self.atoms = tuple(kernel.size_atoms())
        self.k = merge_loops(kernel)
        self.symbol = symbol
        self.reducing = bool(self.k.inner)
        self.rows: Size = 1
        for v in self.k.outer:
            self.rows = self.rows * v.extent
        self.row: Size = 1
        for v in self.k.inner:
            self.row = self.row * v.extent
        self.blocks = blocks or default_blocks(self.k)
        # NOTE: symbolic sizes have no proven bound: their index arithmetic is int64
        self.wide = bool(self.atoms) or not self._fits_int32()
        self.itype = "tl.int64" if self.wide else "tl.int32"
        self.names = {v: f"x{j}" for j, v in enumerate(self.k.outer)}
        self.names.update({v: f"r{j}" for j, v in enumerate(self.k.inner)})
        self.outer_vars = set(self.k.outer)
        self.helpers: set[str] = set()
        self.lines: list[str] = []
        self.indent = 1
        self.emitted: set[int] = set()
        self.single_chunk_ready = False  # the one chunk's rindex, masks and variables emitted
        self.acc_phase = {r.acc: p for p, ph in enumerate(self.k.phases) for r in ph.reduces}
        self.reduce_of = {r.acc: r for ph in self.k.phases for r in ph.reduces}
        self.dims: dict[int, frozenset[str]] = {}
        self.phase: dict[int, int] = {}
        for s in self.k.stmts():
            self._classify(s)

    def _fits_int32(self) -> bool:
        k = self.k
        sizes = [b.numel for b in k.buffers] + [v.extent for v in (*k.outer, *k.inner)]
        sizes += [self.rows + self.blocks.xblock, self.row + self.blocks.rblock]
        for s in k.stmts():
            if s.op == "load":
                sizes.append(_index_bound(s.attr[1]))
            elif s.op == "index":
                sizes.append(_index_bound(s.attr))
        for st in [*(st for ph in k.phases for st in ph.stores), *k.final]:
            sizes.append(_index_bound(st.index))
        return max(sizes) < INT32_BOUND

    # --- statement classification -------------------------------------------------------------
    def _index_dims(self, ix: Ix) -> frozenset[str]:
        return frozenset("x" if v in self.outer_vars else "r" for v in ix.vars())

    def _classify(self, s: Stmt) -> None:
        """A statement's block dims (``x``: outer, ``r``: inner) and the last phase whose
        result it reads (-1: none)."""
        dims: frozenset[str] = frozenset()
        phase = -1
        if s.op == "load":
            dims = self._index_dims(s.attr[1])
        elif s.op == "index":
            dims = self._index_dims(s.attr)
        elif s.op == "acc":
            phase = self.acc_phase[s.attr]
            # NOTE: a reduction's result is [XBLOCK, 1]; without inner loops (reduced dims of
            # size 1) it is its one value, of that value's shape.
            dims = frozenset("x") if self.reducing else self.dims[self.reduce_of[s.attr].value.id]
        for a in s.args:
            dims |= self.dims[a.id]
            phase = max(phase, self.phase[a.id])
        self.dims[s.id] = dims
        self.phase[s.id] = phase

    # --- output helpers -----------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def helper(self, name: str) -> str:
        self.helpers.update(with_needs(name))
        return name

    def expr(self, s: Stmt) -> str:
        return f"acc{s.attr}" if s.op == "acc" else f"t{s.id}"

    def index(self, ix: Ix) -> str:
        parts: list[str] = []
        for atom, c in ix.terms:
            a = self._atom(atom)
            if isinstance(c, Poly):
                parts.append(f"+ {a} * {size_text(c)}")
                continue
            term = a if abs(c) == 1 else f"{a} * {abs(c)}"
            parts.append(("- " if c < 0 else "+ ") + term)
        const = ix.const
        if isinstance(const, Poly):
            parts.append(f"+ {size_text(const)}")
        elif const or not parts:
            parts.append(("- " if const < 0 else "+ ") + str(abs(const)))
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]

    def _atom(self, a: Atom) -> str:
        if isinstance(a, Var):
            return self.names[a]
        # NOTE: a symbolic divisor is 0 only where its loop runs zero times (nothing launched
        # or a masked lane): integer division by zero does not trap in Triton
        if isinstance(a, Div):
            return f"(({self.index(a.e)}) // {size_text(a.k)})"
        if isinstance(a, Mod):
            return f"(({self.index(a.e)}) % {size_text(a.k)})"
        assert isinstance(a, Clamp)
        lo, hi = size_text(a.lo), size_text(a.hi)
        return f"tl.minimum(tl.maximum({self.index(a.e)}, {lo}), {hi})"

    def mask(self, dims: frozenset[str]) -> str | None:
        if dims == {"x", "r"}:
            return "rxmask"
        if dims == {"x"}:
            return "xmask"
        if dims == {"r"}:
            return "rmask"
        return None

    def pointer(self, buffer: int, ix: Ix, dims: frozenset[str]) -> str:
        """``b<buffer> + ix``, broadcast to ``dims`` where the index lacks some of them."""
        offset = self.index(ix)
        text = f"b{buffer} + " + (offset if offset.isidentifier() else f"({offset})")
        missing = dims - self._index_dims(ix)
        if missing:
            text += f" + tl.zeros({self._shape(missing)}, {self.itype})"
        return text

    def _shape(self, dims: frozenset[str]) -> str:
        """The block shape of ``dims`` (1 along the others)."""
        xblock = self.blocks.xblock if "x" in dims else 1
        if not self.reducing:
            return f"[{xblock}]"
        return f"[{xblock}, {self.blocks.rblock if 'r' in dims else 1}]"

    # --- statements ---------------------------------------------------------------------------
    def emit(self, s: Stmt) -> None:
        if s.id in self.emitted or s.op == "acc":
            return
        self.emitted.add(s.id)
        rhs = self.rhs(s, [self.expr(a) for a in s.args])
        if s.dtype == "b" and not self.dims[s.id] and s.op != "const":
            # NOTE: Triton's interpreter gives a comparison's result the operands' dtype, which
            # a scalar keeps when it is broadcast (``scalar_bool & block`` then fails); a
            # selection between typed constants is a proper bool (and costs nothing compiled).
            rhs = f"tl.where({rhs}, {const_text(True, 'b')}, {const_text(False, 'b')})"
        self.line(f"t{s.id} = {rhs}")

    def rhs(self, s: Stmt, a: list[str]) -> str:
        op, t = s.op, s.dtype
        if op == "const":
            return const_text(s.attr, t)
        if op == "load":
            return self.load(s)
        if op == "index":
            ix = s.attr
            if ix.is_const and isinstance(ix.const, int):
                return const_text(ix.const, "i64")
            return f"({self.index(ix)}).to(tl.int64)"
        if op == "cast":
            return self.cast(a[0], s.args[0].dtype, t)
        if op == "round":
            if s.attr == "bf16":
                return f"{self.helper('_bf16_round')}({a[0]})"
            return f"{a[0]}.to(tl.float16).to(tl.float32)"
        for table in (self._arith, self._compare, self._logic, self._math):
            text = table(s, a)
            if text is not None:
                return text
        raise InternalCompilerError(f"no Triton for scalar op {op!r}")

    def _arith(self, s: Stmt, a: list[str]) -> str | None:
        op, t = s.op, s.dtype
        if op in _ARITH:
            return f"{a[0]} {(_BOOL_ARITH if t == 'b' else _ARITH)[op]} {a[1]}"
        if op == "div" and is_float(t):
            # NOTE: Triton's float32 ``/`` is approximate on the GPU; div_rn is IEEE.
            return f"M.div_rn({a[0]}, {a[1]})"
        if op == "neg":
            if is_float(t):
                # NOTE: Triton's unary minus is ``0 - x``, which makes -(+0.0) +0.0.
                return f"{a[0]} * {const_text(-1.0, t)}"
            return a[0] if t == "b" else f"{const_text(0, t)} - {a[0]}"
        if op == "abs":
            return a[0] if t in ("u8", "b") else f"tl.abs({a[0]})"
        if op in _INT_DIVISION or op == "div":
            name = "idiv_trunc" if op == "div" else op
            return f"{self.helper('_' + name)}({a[0]}, {a[1]}, {t != 'u8'})"
        if op == "fdiv_trunc":
            return f"M.trunc(M.div_rn({a[0]}, {a[1]}))"
        if op == "fdiv_floor":
            return f"{self.helper('_fdiv_floor')}({a[0]}, {a[1]})"
        if op == "ipow":
            return f"{self.helper('_ipow')}({a[0]}, {a[1]}, {_INT_BITS[t]}, {t != 'u8'})"
        if op in ("max", "min", "fmax", "fmin"):
            return self._extremum(op, t, a)
        return None

    def _extremum(self, op: str, t: str, a: list[str]) -> str:
        if is_float(t):
            name = {"max": "_max_nan", "min": "_min_nan", "fmax": "_fmax", "fmin": "_fmin"}[op]
            return f"{self.helper(name)}({a[0]}, {a[1]})"
        larger = op in ("max", "fmax")
        if t == "b":
            return f"{a[0]} {'|' if larger else '&'} {a[1]}"
        return f"tl.where({a[0]} {'>' if larger else '<'} {a[1]}, {a[0]}, {a[1]})"

    def _compare(self, s: Stmt, a: list[str]) -> str | None:
        if s.op not in _COMPARE:
            return None
        if s.args[0].dtype == "b":
            # NOTE: Triton's int1 is signed (true < false); C++ compares bools as 0 and 1.
            a = [f"{x}.to(tl.int32)" for x in a]
        return f"{a[0]} {_COMPARE[s.op]} {a[1]}"

    def _logic(self, s: Stmt, a: list[str]) -> str | None:
        op = s.op
        if op in _BITWISE:
            return f"{a[0]} {_BITWISE[op]} {a[1]}"
        if op in ("not", "bnot"):
            # NOTE: xor with all ones, typed (the interpreter's ``~`` of a uint8 overflows).
            ones = True if s.dtype == "b" else (255 if s.dtype == "u8" else -1)
            return f"{a[0]} ^ {const_text(ones, s.dtype)}"
        if op == "where":
            return f"tl.where({a[0]}, {a[1]}, {a[2]})"
        return None

    def _math(self, s: Stmt, a: list[str]) -> str | None:
        if s.op == "signbit":
            return f"M.signbit({a[0]}) != {const_text(0, 'i32')}"
        if s.op in LIBDEVICE:
            return f"M.{LIBDEVICE[s.op]}({', '.join(a)})"
        return None

    def cast(self, x: str, src: str, t: str) -> str:
        if t == "b":
            return f"{x} != {const_text(0.0 if is_float(src) else 0, src)}"
        if is_float(src) and t in ("i8", "i16"):
            # NOTE: PyTorch's widths, on both devices: through int32 (saturated on a GPU, x86's
            # lowest integer on a CPU), then wrapped to the narrow type.
            return f"{x}.to(tl.int32).to({TL[t]})"
        if is_float(src) and t == "u8":
            return f"{x}.to(tl.int64).to({TL[t]})"
        return f"{x}.to({TL[t]})"

    def load(self, s: Stmt) -> str:
        buf, ix = s.attr
        dims = self._index_dims(ix)
        mask = self.mask(dims)
        args = self.pointer(buf, ix, dims)
        if mask is not None:
            args += f", mask={mask}, other=0"
        value = f"tl.load({args})"
        storage = self.k.buffers[buf].dtype
        if storage == "bf16":
            return f"{self.helper('_bf16_load')}({value})"
        if storage == "f16":
            return f"{value}.to(tl.float32)"
        return value

    def store(self, st: Store) -> None:
        v = self.expr(st.value)
        storage = self.k.buffers[st.buffer].dtype
        if storage == "bf16":
            v = f"{self.helper('_bf16_store')}({v})"
        elif storage == "f16":
            v = f"{v}.to(tl.float16)"
        elif storage != st.value.dtype:
            v = self.cast(v, st.value.dtype, storage)
        dims = self.dims[st.value.id] | self._index_dims(st.index)
        mask = self.mask(dims)
        tail = "" if mask is None else f", mask={mask}"
        self.line(f"tl.store({self.pointer(st.buffer, st.index, dims)}, {v}{tail})")

    # --- placement ----------------------------------------------------------------------------
    def emit_where(self, roots: list[Stmt], fits: Callable[[Stmt], bool]) -> None:
        """Statements under ``roots`` that ``fits`` accepts, in dependency order."""
        seen: set[int] = set()

        def visit(s: Stmt) -> None:
            if s.id in seen:
                return
            seen.add(s.id)
            for x in s.args:
                visit(x)
            if fits(s):
                self.emit(s)

        for r in roots:
            visit(r)

    # --- structure ----------------------------------------------------------------------------
    def source(self) -> TritonSource:
        k, blocks = self.k, self.blocks
        names = [f"b{j}" for j in range(len(k.buffers))] + [size_arg(a) for a in self.atoms]
        for a in self.atoms:
            # NOTE: Triton passes a small int as int32: sizes compute in int64
            self.line(f"n_{a} = {size_arg(a)}.to(tl.int64)")
        if isinstance(self.rows, Poly) or self.rows > 0:
            (self.reduction_body if self.reducing else self.pointwise_body)()
        body = "\n".join(self.lines) if self.lines else "    pass"
        jit = "@triton.jit"
        if self.atoms:
            # NOTE: one binary for every size (Triton would specialize 1 and multiples of 16)
            jit += f"(do_not_specialize={[size_arg(a) for a in self.atoms]!r})"
        text = (
            module_header(self.symbol)
            + helpers_text(self.helpers)
            + f"\n\n{jit}\ndef {self.symbol}({', '.join(names)}):\n{body}\n"
        )
        if not self.atoms:
            programs = blocks.programs if static(self.rows) > 0 else 0
            return TritonSource(self.symbol, text, (programs,), blocks.num_warps)
        hints = blocks_hints(self.atoms)
        ts = TritonSource(self.symbol, text, (0,), blocks.num_warps, self.atoms, self.rows,
                          blocks.xblock, hints)  # fmt: skip
        return replace(ts, grid=(ts.programs(hints),))

    def _program_start(self) -> str:
        pid = "tl.program_id(0)" + (".to(tl.int64)" if self.wide else "")
        return f"{pid} * {self.blocks.xblock}"

    def _recover(self, flat: str, loops: tuple[Var, ...]) -> None:
        """Each loop variable of ``loops`` (row-major) from the flat index ``flat``."""
        stride: Size = 1
        for j in range(len(loops) - 1, -1, -1):
            v = loops[j]
            div = flat if stride == 1 else f"({flat} // {size_text(stride)})"
            self.line(f"{self.names[v]} = {div}" + (f" % {size_text(v.extent)}" if j else ""))
            stride = stride * v.extent

    def pointwise_body(self) -> None:
        k = self.k
        if k.outer:
            xblock = self.blocks.xblock
            self.line(f"xindex = {self._program_start()} + tl.arange(0, {xblock})")
            self.line(f"xmask = xindex < {size_text(self.rows)}")
            self._recover("xindex", k.outer)
        for ph in k.phases:
            roots = [r.value for r in ph.reduces] + [st.value for st in ph.stores]
            self.emit_where(roots, lambda s: True)
            for r in ph.reduces:
                self.reduce_directly(r)
            for st in ph.stores:
                self.store(st)
        self.emit_where([st.value for st in k.final], lambda s: True)
        for st in k.final:
            self.store(st)

    def reduction_body(self) -> None:
        k, b = self.k, self.blocks
        self.line(f"xindex = {self._program_start()} + tl.arange(0, {b.xblock})[:, None]")
        self.line(f"xmask = xindex < {size_text(self.rows)}")
        self._recover("xindex", k.outer)
        rbase = f"tl.arange(0, {b.rblock})[None, :]"
        self.line(f"rbase = {rbase}" + (".to(tl.int64)" if self.wide else ""))
        for p, ph in enumerate(k.phases):
            roots = [r.value for r in ph.reduces] + [st.value for st in ph.stores]
            self.emit_where(roots, self._outer_before(p))
            for r in ph.reduces:
                self.init_partial(r)
            if isinstance(self.row, Poly) or self.row > 0:
                self.chunks(ph.reduces, ph.stores, roots)
            for r in ph.reduces:
                self.finish_partial(r)
        self.emit_where([st.value for st in k.final], lambda s: True)
        for st in k.final:
            self.store(st)

    def _outer_before(self, phase: int) -> Callable[[Stmt], bool]:
        """Statements outside the inner loop that read only results of phases before
        ``phase``."""

        def fits(s: Stmt) -> bool:
            return "r" not in self.dims[s.id] and self.phase[s.id] < phase

        return fits

    def chunks(self, reduces: list[Reduce], stores: list[Store], roots: list[Stmt]) -> None:
        """The phase's loop over the row in chunks of RBLOCK (no loop for a single chunk)."""
        rblock = self.blocks.rblock
        symbolic = isinstance(self.row, Poly)
        looping = symbolic or self.row > rblock
        # NOTE: Triton types a literal bound of 2**31 or more uint32 (or int64) and its for loop
        # compares signed: a row that long would run no chunk (a sum of 0). Its offset is int64.
        counted = symbolic or (looping and static(self.row) + rblock >= INT32_LIMIT)
        saved = set(self.emitted)
        if counted:
            # NOTE: a row of any length: chunks until its end (never a block that truncates it)
            start = f"{size_text(self.row)} * 0" if symbolic else const_text(0, "i64")
            self.line(f"roffset = {start}")
            self.line(f"while roffset < {size_text(self.row)}:")
            self.indent += 1
            self.line("rindex = roffset + rbase")
        elif looping:
            self.line(f"for roffset in range(0, {self.row}, {rblock}):")
            self.indent += 1
            self.line("rindex = roffset + rbase")
        if looping or not self.single_chunk_ready:
            if not looping:
                self.line("rindex = rbase")
            self.line(f"rmask = rindex < {size_text(self.row)}")
            self.line("rxmask = xmask & rmask")
            self._recover("rindex", self.k.inner)
            self.single_chunk_ready = not looping
        self.emit_where(roots, lambda s: True)
        for r in reduces:
            self.accumulate(r)
        for st in stores:
            self.store(st)
        if counted:
            self.line(f"roffset += {rblock}")
        if looping:
            self.indent -= 1
            # NOTE: statements of the loop body are out of scope after it; a single chunk's
            # stay valid (the next phase reads the same elements).
            self.emitted = saved

    # --- reductions ---------------------------------------------------------------------------
    @staticmethod
    def _tracks_nan(r: Reduce) -> bool:
        return r.kind in ("max", "min") and is_float(r.dtype)

    @staticmethod
    def _acc_type(r: Reduce) -> str:
        # NOTE: bool accumulators as int32 (C++ bool arithmetic is on ints), nonzero at the end.
        return "i32" if r.dtype == "b" else r.dtype

    def _value(self, r: Reduce) -> str:
        v = self.expr(r.value)
        t = self._acc_type(r)
        return v if r.value.dtype == t else self.cast(v, r.value.dtype, t)

    @staticmethod
    def _combine(kind: str, acc: str, v: str) -> str:
        if kind == "sum":
            return f"{acc} + {v}"
        if kind == "prod":
            return f"{acc} * {v}"
        # NOTE: the C++ max_/min_: a NaN value leaves the accumulator (tracked apart).
        cmp = f"{acc} < {v}" if kind == "max" else f"{v} < {acc}"
        return f"tl.where({cmp}, {v}, {acc})"

    def _result(self, r: Reduce, value: str) -> str:
        return f"{value} != {const_text(0, 'i32')}" if r.dtype == "b" else value

    def reduce_directly(self, r: Reduce) -> None:
        """A reduction over no inner loop (reduced dims of size 1): its identity combined with
        the one value, as the C++ printer's single step."""
        t = self._acc_type(r)
        v = self._value(r)
        value = self._combine(r.kind, const_text(reduce_identity(r.kind, t), t), v)
        if self._tracks_nan(r):
            value = f"tl.where({v} != {v}, {const_text(math.nan, t)}, {value})"
        self.line(f"acc{r.acc} = {self._result(r, value)}")

    def init_partial(self, r: Reduce) -> None:
        t = self._acc_type(r)
        shape = f"[{self.blocks.xblock}, {self.blocks.rblock}]"
        self.line(f"part{r.acc} = {const_text(reduce_identity(r.kind, t), t, shape)}")
        if self._tracks_nan(r):
            self.line(f"nan{r.acc} = tl.full({shape}, False, tl.int1)")

    def accumulate(self, r: Reduce) -> None:
        t = self._acc_type(r)
        v = f"v{r.acc}"
        identity = const_text(reduce_identity(r.kind, t), t)
        self.line(f"{v} = tl.where(rxmask, {self._value(r)}, {identity})")
        self.line(f"part{r.acc} = {self._combine(r.kind, f'part{r.acc}', v)}")
        if self._tracks_nan(r):
            self.line(f"nan{r.acc} = nan{r.acc} | ({v} != {v})")

    def finish_partial(self, r: Reduce) -> None:
        t = self._acc_type(r)
        part, n = f"part{r.acc}", r.acc
        if isinstance(self.row, int) and self.row == 0:
            shape = f"[{self.blocks.xblock}, 1]"
            empty = const_text(reduce_identity(r.kind, t), t, shape)
            self.line(f"acc{n} = {self._result(r, empty)}")
            return
        if r.kind == "prod":
            total = f"tl.reduce({part}, 1, {self.helper('_prod')}, keep_dims=True)"
        else:
            fn = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}[r.kind]
            total = f"{fn}({part}, axis=1, keep_dims=True)"
        # NOTE: tl.sum widens small integers to int32; the wrapped sum converts back exactly.
        self.line(f"acc{n} = {total}.to({TL[t]})")
        if self._tracks_nan(r):
            seen = f"tl.max(nan{n}.to(tl.int8), axis=1, keep_dims=True)"
            self.line(f"nan{n}_seen = {seen} != {const_text(0, 'i8')}")
            self.line(f"acc{n} = tl.where(nan{n}_seen, {const_text(math.nan, t)}, acc{n})")
        if r.dtype == "b":
            self.line(f"acc{n} = {self._result(r, f'acc{n}')}")


def print_triton(kernel: Kernel, symbol: str, blocks: Blocks | None = None) -> TritonSource:
    """``kernel`` as a Triton module defining ``@triton.jit def symbol(b0, b1, ...)``, launched
    with ``blocks`` (default: :func:`default_blocks`; one of :func:`candidate_blocks`)."""
    return _Printer(kernel, symbol, blocks).source()
