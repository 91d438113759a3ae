"""The C++ printer: kernel IR to one ``extern "C"`` function per kernel.

Each kernel is ``int NAME(void* const* args)``: ``args`` holds one pointer per kernel buffer, in
buffer order; the return value is nonzero when an integer division by zero happened (the
executor raises PyTorch's error). Sizes and strides are compile-time constants; with symbolic
shapes, each size atom the kernel uses (:meth:`~plait.codegen.kir.Kernel.size_atoms`, in that
order) arrives as one more pointer, to its ``int64_t`` value, after the buffers, and loop bounds,
strides and masks are expressions of those values (``sz_s0``). Decisions that depend on a
symbolic size are taken at run time: the outer loop is parallel ``if`` its work passes the
threshold, sums always run in blocks (one block when the extent is small), and a kernel whose
extents may be 0 runs nothing then.

Loops: the outermost loop is OpenMP-parallel when the kernel's work passes a threshold; the
innermost loop of each loop nest carries ``#pragma omp simd`` (reductions as simd reductions on a
per-run partial, so long sums accumulate in blocks). Statements are placed at the outermost loop
level whose variables they use (loop-invariant code motion by construction), and phase results
(``acc``) right after their phase. Transcendentals call glibc's vector math (libmvec) when
available. 16-bit floats load through exact conversions to float and store with round to nearest
even, bitwise as PyTorch does.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> from plait.codegen.kir import KernelBuilder
    >>> b = KernelBuilder("k", outer=(Var("i0", 8),))
    >>> x, y = b.buffer("x", "f32", 8), b.buffer("y", "f32", 8, output=True)
    >>> i = Ix.var(b.outer[0])
    >>> b.store(y, i, b.op("exp", [b.load(x, i)], "f32"))
    >>> "expf(" in print_kernel(b.build(nodes=()), "stax_k")
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from plait.codegen.index import Atom, Clamp, Div, Ix, Mod, Var
from plait.codegen.kir import CHECKED_INT_OPS, Kernel, Reduce, Stmt, Store, is_float
from plait.codegen.loops import merge_loops, segments
from plait.errors import InternalCompilerError
from plait.symbolic.poly import Poly, Size, is_zero, lower_bound, to_text

CTYPE = {
    "f64": "double",
    "f32": "float",
    "i64": "int64_t",
    "i32": "int32_t",
    "i16": "int16_t",
    "i8": "int8_t",
    "u8": "uint8_t",
    "b": "bool",
}
STORAGE_CTYPE = {**CTYPE, "bf16": "uint16_t", "f16": "uint16_t", "b": "uint8_t"}
BLOCK = 4096
# NOTE: libm functions by their C names (``f`` suffix for float); prelude.py declares them.
LIBM = ("exp", "log", "tanh", "erf", "pow", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
        "cosh", "asinh", "acosh", "atanh", "expm1", "log1p", "log2", "log10", "exp2", "erfc",
        "atan2", "hypot")  # fmt: skip
_VECTOR_MATH = ("exp", "log", "tanh", "erf", "pow", "sin", "cos")
# Exact operations as the prelude's inline wrappers of compiler builtins.
_BUILTINS = {
    op: f"{op}_" for op in ("floor", "ceil", "trunc", "rint", "fmod", "copysign", "sqrt", "signbit")
}


@dataclass(frozen=True)
class PrintOptions:
    parallel_threshold: int = 1 << 17


def c_int(c: int) -> str:
    if c == -(1 << 63):
        return "(-9223372036854775807LL - 1)"
    return f"{c}LL" if abs(c) >= (1 << 31) else str(c)


def size_name(atom: str) -> str:
    """The C++ local holding a size atom's value."""
    return f"sz_{atom}"


def c_size(x: Size) -> str:
    """A size: an integer literal, or the expression of a symbolic one over its atoms."""
    if isinstance(x, int):
        return c_int(x)
    return f"({to_text(x, size_name)})"


def _c_divisor(k: Size) -> str:
    """A divisor; a symbolic one that may be 0 at run time divides by 1 instead (it is 0 only
    where the loop it belongs to runs zero times: the quotient is never used)."""
    if isinstance(k, Poly) and (lower_bound(k) or 0) < 1:
        return f"max_<int64_t>({c_size(k)}, 1)"
    return c_size(k)


def c_index(ix: Ix) -> str:
    parts = []
    for atom, coef in ix.terms:
        a = _c_atom(atom)
        parts.append(a if coef == 1 else f"{a} * {c_size(coef)}")
    if not is_zero(ix.const) or not parts:
        parts.append(c_size(ix.const))
    return " + ".join(parts)


def _c_atom(a: Atom) -> str:
    if isinstance(a, Var):
        return a.name
    if isinstance(a, Div):
        return f"(({c_index(a.e)}) / {_c_divisor(a.k)})"
    if isinstance(a, Mod):
        return f"(({c_index(a.e)}) % {_c_divisor(a.k)})"
    assert isinstance(a, Clamp)
    return f"clamp_i64({c_index(a.e)}, {c_size(a.lo)}, {c_size(a.hi)})"


def c_const(value: object, t: str) -> str:
    if t == "b":
        return "true" if value else "false"
    if is_float(t):
        assert isinstance(value, float)
        if math.isnan(value):
            text = "NAN"
        elif math.isinf(value):
            text = "INFINITY" if value > 0 else "-INFINITY"
        else:
            text = value.hex()
        return f"(({CTYPE[t]}){text})"
    assert isinstance(value, int)
    return f"(({CTYPE[t]}){c_int(value)})"


class _Printer:
    def __init__(self, kernel: Kernel, symbol: str, options: PrintOptions) -> None:
        self.atoms = kernel.size_atoms()
        self.k = merge_loops(kernel, per_element=True)
        self.symbol = symbol
        self.opts = options
        self.lines: list[str] = []
        self.indent = 1
        self.uses_err = False
        outer_pos = {v: i for i, v in enumerate(self.k.outer)}
        inner_pos = {v: i for i, v in enumerate(self.k.inner)}
        self.acc_phase = {r.acc: p for p, ph in enumerate(self.k.phases) for r in ph.reduces}
        self.level: dict[int, tuple[int, int, int]] = {}
        for s in self.k.stmts():
            o, i, p = -1, -1, -1
            own = []
            if s.op == "load":
                own = list(s.attr[1].vars())
            elif s.op == "index":
                own = list(s.attr.vars())
            elif s.op == "acc":
                p = self.acc_phase[s.attr]
                o = len(self.k.outer) - 1
            for v in own:
                if v in outer_pos:
                    o = max(o, outer_pos[v])
                else:
                    i = max(i, inner_pos[v])
            for a in s.args:
                ao, ai, ap = self.level[a.id]
                o, i, p = max(o, ao), max(i, ai), max(p, ap)
            if s.op in CHECKED_INT_OPS:
                self.uses_err = True
            self.level[s.id] = (o, i, p)
        self.emitted: set[int] = set()

    # --- output helpers -----------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def expr(self, s: Stmt) -> str:
        if s.op == "acc":
            return f"acc{s.attr}"
        return f"t{s.id}"

    def emit(self, s: Stmt) -> None:
        if s.id in self.emitted or s.op == "acc":
            return
        self.emitted.add(s.id)
        t = CTYPE[s.dtype]
        a = [self.expr(x) for x in s.args]
        if s.op in CHECKED_INT_OPS:
            self.line(f"err |= ({a[1]} == 0);")
        self.line(f"const {t} t{s.id} = {self.rhs(s, a)};")

    def rhs(self, s: Stmt, a: list[str]) -> str:
        op, t = s.op, s.dtype
        f = is_float(t)
        if op == "const":
            return c_const(s.attr, t)
        if op == "load":
            buf, ix = s.attr
            storage = self.k.buffers[buf].dtype
            ref = f"b{buf}[{c_index(ix)}]"
            if storage == "bf16":
                return f"bf16_load({ref})"
            if storage == "f16":
                return f"f16_load({ref})"
            if storage == "b":
                return f"({ref} != 0)"
            return ref
        if op == "index":
            return f"(int64_t)({c_index(s.attr)})"
        if op == "cast":
            src = s.args[0].dtype
            if t == "b":
                return f"({a[0]} != 0)"
            if is_float(src) and t != "b" and not is_float(t):
                # NOTE: PyTorch's widths (uint8 and int64 through 64 bits, the others through
                # 32); the prelude defines NaN and out-of-range values as the machine does
                wide = "f2i<int64_t>" if t in ("u8", "i64") else "f2i<int32_t>"
                return f"({CTYPE[t]}){wide}({a[0]})"
            return f"({CTYPE[t]}){a[0]}"
        if op == "round":
            return f"{'bf16' if s.attr == 'bf16' else 'f16'}_round({a[0]})"
        binary = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!="}
        binary.update({"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "and": "&&", "or": "||"})
        if op in binary:
            return f"({a[0]} {binary[op]} {a[1]})"
        if op == "neg":
            return f"(-{a[0]})"
        if op == "not":
            return f"(!{a[0]})"
        if op == "abs":
            return f"fabs_({a[0]})" if f else f"({a[0]} < 0 ? ({CTYPE[t]})(-{a[0]}) : {a[0]})"
        if op == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if op in ("max", "min"):
            if f:
                return f"{op}_nan<{CTYPE[t]}>({a[0]}, {a[1]})"
            cmp = ">" if op == "max" else "<"
            return f"({a[0]} {cmp} {a[1]} ? {a[0]} : {a[1]})"
        if op in ("ipow", "fdiv_floor", "fmax", "fmin") or op in CHECKED_INT_OPS:
            return f"{op}<{CTYPE[t]}>({a[0]}, {a[1]})"
        if op == "fdiv_trunc":
            return f"trunc_({a[0]} / {a[1]})"
        bitwise = {"band": "&", "bor": "|", "bxor": "^"}
        if op in bitwise:
            return f"({CTYPE[t]})({a[0]} {bitwise[op]} {a[1]})"
        if op == "bnot":
            return f"({CTYPE[t]})(~{a[0]})"
        if op in _BUILTINS:
            return f"{_BUILTINS[op]}({', '.join(a)})"
        if op in LIBM:
            return f"{op}{'f' if t == 'f32' else ''}({', '.join(a)})"
        raise InternalCompilerError(f"no C++ for scalar op {op!r}")

    def _order(self, roots: list[Stmt]) -> list[Stmt]:
        """Statements under ``roots`` in dependency order."""
        order: list[Stmt] = []
        seen: set[int] = set()

        def visit(s: Stmt) -> None:
            if s.id in seen:
                return
            seen.add(s.id)
            for x in s.args:
                visit(x)
            order.append(s)

        for r in roots:
            visit(r)
        return order

    def emit_where(self, roots: list[Stmt], fits: Callable[[int, int, int], bool]) -> None:
        for s in self._order(roots):
            if fits(*self.level[s.id]):
                self.emit(s)

    def open(self, header: str) -> set[int]:
        self.line(header + " {")
        self.indent += 1
        return set(self.emitted)

    def close(self, saved: set[int]) -> None:
        self.indent -= 1
        self.line("}")
        self.emitted = saved

    # --- structure ----------------------------------------------------------------------------
    def body(self) -> str:
        k = self.k
        for j, b in enumerate(k.buffers):
            const = "" if b.output else "const "
            ctype = STORAGE_CTYPE[b.dtype]
            self.line(f"{const}{ctype}* b{j} = ({const}{ctype}*)args[{j}];")
        for j, name in enumerate(self.atoms):
            slot = len(k.buffers) + j
            self.line(f"const int64_t {size_name(name)} = *(const int64_t*)args[{slot}];")
        self.line("int err = 0;")
        static = [v.extent for v in k.outer if isinstance(v.extent, int)]
        symbolic = [v.extent for v in k.outer if isinstance(v.extent, Poly)]
        if all(e > 0 for e in static):
            # NOTE: a symbolic extent may be 0: then nothing runs, not even a load hoisted out of
            # the loops (its buffer may be empty)
            saved = None
            if symbolic:
                cond = " && ".join(f"{c_size(e)} > 0" for e in symbolic if _may_be_empty(e))
                saved = self.open(f"if ({cond})") if cond else None
            roots = self._all_roots()
            self.emit_where(roots, lambda o, i, p: o < 0 and i < 0 and p < 0)
            self.outer_loop(0, roots)
            if saved is not None:
                self.close(saved)
        self.line("return err;")
        head = f'extern "C" int {self.symbol}(void* const* args) {{'
        return "\n".join([head, *self.lines, "}"])

    def _all_roots(self) -> list[Stmt]:
        out: list[Stmt] = []
        for ph in self.k.phases:
            out += [r.value for r in ph.reduces] + [st.value for st in ph.stores]
        return out + [st.value for st in self.k.final]

    def outer_loop(self, level: int, roots: list[Stmt]) -> None:
        k = self.k
        if level == len(k.outer):
            self.outer_body()
            return
        v = k.outer[level]
        innermost = level == len(k.outer) - 1 and not k.inner
        work = k.numel * max(1, len(k.phases))
        threshold = self.opts.parallel_threshold
        when = ""
        if isinstance(work, int) and isinstance(v.extent, int):
            parallel = level == 0 and v.extent > 1 and work >= threshold
        else:
            # NOTE: decided per call, on the sizes the call binds
            parallel = level == 0
            when = f" if(parallel: {c_size(v.extent)} > 1 && {c_size(work)} >= {threshold})"
        red = " reduction(|:err)" if self.uses_err else ""
        pieces = segments(k, v) if innermost else [(0, v.extent)]
        for lo, hi in pieces:
            if parallel and innermost:
                self.line(f"#pragma omp parallel for simd schedule(static){red}{when}")
            elif parallel:
                self.line(f"#pragma omp parallel for schedule(static){red}{when}")
            elif innermost:
                self.line(f"#pragma omp simd{red}")
            saved = self.open(f"for (int64_t {v} = {lo}; {v} < {c_size(hi)}; ++{v})")
            self.emit_where(roots, lambda o, i, p: o == level and i < 0 and p < 0)
            self.outer_loop(level + 1, roots)
            self.close(saved)

    def outer_body(self) -> None:
        k = self.k
        for p, ph in enumerate(k.phases):
            roots = [r.value for r in ph.reduces] + [st.value for st in ph.stores]
            self.emit_where(roots, _before_phase(p))
            for r in ph.reduces:
                self.line(f"{CTYPE[r.dtype]} acc{r.acc} = {self._init(r)};")
                if self._tracks_nan(r):
                    self.line(f"int nan{r.acc} = 0;")
            if k.inner and all(isinstance(v.extent, Poly) or v.extent > 0 for v in k.inner):
                self.inner_loop(0, ph.reduces, ph.stores, roots)
            elif not k.inner:
                self._innermost(ph.reduces, ph.stores, partial=False)
            for r in ph.reduces:
                if self._tracks_nan(r):
                    self.line(f"if (nan{r.acc}) acc{r.acc} = NAN;")
        roots = [st.value for st in k.final]
        self.emit_where(roots, lambda o, i, p: True)
        for st in k.final:
            self._store(st)

    @staticmethod
    def _tracks_nan(r: Reduce) -> bool:
        return r.kind in ("max", "min") and is_float(r.dtype)

    def _init(self, r: Reduce) -> str:
        t = CTYPE[r.dtype]
        if r.kind == "sum":
            return f"({t})0"
        if r.kind == "prod":
            return f"({t})1"
        if is_float(r.dtype):
            return "-INFINITY" if r.kind == "max" else "INFINITY"
        bits = {"i64": 64, "i32": 32, "i16": 16, "i8": 8}.get(r.dtype)
        if bits is None:  # u8
            return f"({t})0" if r.kind == "max" else f"({t})255"
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return f"({t}){c_int(lo if r.kind == 'max' else hi)}"

    def inner_loop(
        self, level: int, reduces: list[Reduce], stores: list[Store], roots: list[Stmt]
    ) -> None:
        k = self.k
        v = k.inner[level]
        if level < len(k.inner) - 1:
            saved = self.open(f"for (int64_t {v} = 0; {v} < {c_size(v.extent)}; ++{v})")
            self.emit_where(roots, lambda o, i, p: i == level)
            self.inner_loop(level + 1, reduces, stores, roots)
            self.close(saved)
            return
        # NOTE: a symbolic extent always runs in blocks: one block when it is small, which sums
        # exactly as the unblocked loop does
        large = isinstance(v.extent, Poly) or v.extent > BLOCK
        blocked = large and any(r.kind == "sum" for r in reduces)
        outer_saved: set[int] | None = None
        lo, hi = "0", c_size(v.extent)
        if blocked:
            n = c_size(v.extent)
            outer_saved = self.open(f"for (int64_t {v}_b = 0; {v}_b < {n}; {v}_b += {BLOCK})")
            lo, hi = f"{v}_b", f"min_<int64_t>({v}_b + {BLOCK}, {n})"
        for r in reduces:
            self.line(f"{CTYPE[r.dtype]} p{r.acc} = {self._init(r)};")
        sign = {"sum": "+", "prod": "*"}
        clauses = [f"reduction({sign.get(r.kind, r.kind)}:p{r.acc})" for r in reduces]
        clauses += [f"reduction(|:nan{r.acc})" for r in reduces if self._tracks_nan(r)]
        if self.uses_err:
            clauses.append("reduction(|:err)")
        self.line(" ".join(["#pragma omp simd", *clauses]))
        saved = self.open(f"for (int64_t {v} = {lo}; {v} < {hi}; ++{v})")
        self._innermost(reduces, stores, partial=True)
        self.close(saved)
        for r in reduces:
            self.line(self._combine(f"acc{r.acc}", f"p{r.acc}", r))
        if outer_saved is not None:
            self.close(outer_saved)

    def _combine(self, acc: str, value: str, r: Reduce) -> str:
        if r.kind == "sum":
            return f"{acc} += {value};"
        if r.kind == "prod":
            return f"{acc} = ({CTYPE[r.dtype]})({acc} * {value});"
        fn = "max_" if r.kind == "max" else "min_"
        return f"{acc} = {fn}({acc}, {value});"

    def _innermost(self, reduces: list[Reduce], stores: list[Store], partial: bool) -> None:
        roots = [r.value for r in reduces] + [st.value for st in stores]
        self.emit_where(roots, lambda o, i, p: True)
        for r in reduces:
            target = f"p{r.acc}" if partial else f"acc{r.acc}"
            val = self.expr(r.value)
            if self._tracks_nan(r):
                self.line(f"nan{r.acc} |= ({val} != {val});")
            self.line(self._combine(target, val, r))
        for st in stores:
            self._store(st)

    def _store(self, st: Store) -> None:
        storage = self.k.buffers[st.buffer].dtype
        v = self.expr(st.value)
        if storage == "bf16":
            v = f"bf16_store({v})"
        elif storage == "f16":
            v = f"f16_store({v})"
        else:
            v = f"({STORAGE_CTYPE[storage]}){v}"
        self.line(f"b{st.buffer}[{c_index(st.index)}] = {v};")


def _may_be_empty(extent: Poly) -> bool:
    return (lower_bound(extent) or 0) < 1


def _before_phase(phase: int) -> Callable[[int, int, int], bool]:
    """Outer-level statements that may read results of phases before ``phase``."""

    def fits(o: int, i: int, p: int) -> bool:
        return i < 0 and p < phase

    return fits


def print_kernel(kernel: Kernel, symbol: str, options: PrintOptions | None = None) -> str:
    """The C++ definition of ``kernel`` as ``extern "C" int symbol(void* const* args)``."""
    return _Printer(kernel, symbol, options or PrintOptions()).body()
