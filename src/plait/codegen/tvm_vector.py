"""Vector blocks of the TVM printer: a pointwise float32 kernel that calls the C library's
transcendentals is printed over chunks of vector lanes, its math calling glibc's vector math
library (libmvec) as the C++ kernels' vectorized loops do.

TVM's vectorizer turns every call in a vectorized loop into one call per lane (its own ``exp``,
``erf`` and ``tanh`` included): a GELU or a softmax's ``exp`` ran several times slower than the
C++ kernels, whose loops call libmvec (``_ZGVeN16v_erff``: 16 lanes per call with AVX-512). So
such a kernel's block is printed in vector form instead: its innermost loop walks chunks of
``lanes`` elements, each load a ``T.Ramp`` of consecutive elements (or one element broadcast),
each constant broadcast, each transcendental a call of libmvec's vector function (the same
functions the C++ kernels call), each store a ``T.Ramp``. Only what maps lane for lane is
printed so: float32 buffers and values (bools for comparisons and selections), the innermost
index contiguous (coefficient 1) or absent (broadcast), never inside a division, modulo or clamp;
the ops below. Anything else is printed as scalars (TVM vectorizes those it can).

Reduction kernels get vector blocks too, over chunks of their innermost reduced variable
(:func:`reduction_lanes`, :func:`store_lanes`): a float32 sum whose value calls a libmvec function
(softmax's sum of ``exp``) and a float32 max or min (one pass that propagates NaN, where TensorIR's
own max needs a second reduction for a NaN flag) accumulate one partial per lane in a vector
block, then combine the lanes; a phase's stores that call libmvec are a vector block. Earlier
reductions' results are broadcast.

Example:
    >>> vector_isa("fma avx2 avx512f")
    ('e', 16)
"""

from __future__ import annotations

from plait.codegen.index import Atom, Clamp, Div, Ix, Mod, Var
from plait.codegen.kir import Kernel, Reduce, Stmt, Store

# libmvec's float32 functions of one argument (glibc 2.35+), by the kernel IR's op names.
LIBMVEC = frozenset({"exp", "log", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan",
                     "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log1p", "log2",
                     "log10", "exp2", "erfc"})  # fmt: skip
_FLOAT_OPS = frozenset({"add", "sub", "mul", "div", "neg", "abs", "max", "min", "fmax", "fmin",
                        "sqrt", "floor", "ceil", "trunc", "rint", "where"})  # fmt: skip
_COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_LOGIC = frozenset({"and", "or", "not"})


def vector_isa(cpu_flags: str) -> tuple[str, int] | None:
    """libmvec's vector ABI letter and float32 lanes for a CPU's flags: AVX-512 (``e``, 16),
    AVX2 (``d``, 8), else None (no vector blocks)."""
    flags = set(cpu_flags.split())
    if "avx512f" in flags:
        return "e", 16
    if "avx2" in flags:
        return "d", 8
    return None


def vector_name(op: str, isa: tuple[str, int]) -> str:
    """libmvec's symbol of ``op`` on ``lanes`` float32 lanes (``_ZGVeN16v_expf``)."""
    letter, lanes = isa
    return f"_ZGV{letter}N{lanes}v_{op}f"


def _uses(atom: Atom, v: Var) -> bool:
    if isinstance(atom, Var):
        return atom == v
    assert isinstance(atom, (Div, Mod, Clamp))
    return any(_uses(a, v) for a, _ in atom.e.terms)


def lane_coefficient(ix: Ix, v: Var) -> int | None:
    """The coefficient of ``v`` in ``ix`` where ``v`` appears only as a plain term (0 where it
    does not appear), else None."""
    coef = 0
    for atom, c in ix.terms:
        if atom == v:
            coef = int(c)
        elif _uses(atom, v):
            return None
    return coef


def without(ix: Ix, v: Var) -> Ix:
    """``ix`` with ``v``'s term dropped."""
    return Ix.of({a: c for a, c in ix.terms if a != v}, ix.const)


def vector_lanes_for(k: Kernel, extents: list[int], isa: tuple[str, int] | None) -> int:
    """The lanes ``k`` (merged loops of ``extents``) is printed with: ``isa``'s, where its one
    block can be a vector block and calls a libmvec function; else 1."""
    if isa is None or k.inner or k.final or len(k.phases) != 1 or k.phases[0].reduces:
        return 1
    lanes = isa[1]
    if not k.outer or extents[-1] % lanes:
        return 1
    if any(b.dtype != "f32" for b in k.buffers):
        return 1
    v = k.outer[-1]
    stmts = k.stmts()
    if not any(s.op in LIBMVEC for s in stmts) or not all(_vector_stmt(s, v) for s in stmts):
        return 1
    if any(lane_coefficient(st.index, v) != 1 for st in k.phases[0].stores):
        return 1
    return lanes


def reduction_lanes(k: Kernel, r: Reduce, inner: list[int], isa: tuple[str, int] | None) -> int:
    """The lanes reduction ``r`` of ``k`` (inner loops of extents ``inner``) accumulates in (a
    vector block over chunks of the innermost reduced variable, then a combine over the lanes),
    or 1: a TensorIR reduction, which :mod:`plait.codegen.tvm_schedule` splits into lanes
    itself. Vector blocks for a float32 sum whose value calls libmvec and for a float32 max or
    min whose value maps lane for lane."""
    if isa is None or not k.inner or r.dtype != "f32" or r.kind not in ("sum", "max", "min"):
        return 1
    if inner[-1] % isa[1]:
        return 1
    stmts = _closure([r.value])
    if not all(_vector_stmt(s, k.inner[-1], k) for s in stmts):
        return 1
    if any(s.op in LIBMVEC for s in stmts):
        return isa[1]  # NOTE: libmvec's own lanes
    if r.kind == "sum":
        return 1
    # NOTE: a max or min: up to four vectors of partials, independent chains of compares
    return max(n for n in (isa[1], 2 * isa[1], 4 * isa[1]) if inner[-1] % n == 0)


def store_lanes(
    k: Kernel, stores: list[Store], inner: list[int], isa: tuple[str, int] | None
) -> int:
    """The lanes a reduction kernel's phase stores (over the outer and inner variables) are
    printed with: ``isa``'s where they call libmvec and map lane for lane over the innermost
    inner variable (float32 buffers, contiguous stores); else 1."""
    if isa is None or not k.inner or not stores or inner[-1] % isa[1]:
        return 1
    v = k.inner[-1]
    if any(k.buffers[st.buffer].dtype != "f32" or lane_coefficient(st.index, v) != 1
           for st in stores):  # fmt: skip
        return 1
    stmts = _closure([st.value for st in stores])
    if not any(s.op in LIBMVEC for s in stmts) or not all(_vector_stmt(s, v, k) for s in stmts):
        return 1
    return isa[1]


def rereads(k: Kernel) -> bool:
    """Whether a phase loads a buffer an earlier phase stored (the C++ printer's softmax keeps
    its exps in the output between phases; TVM's blocks are not ordered for it)."""
    stored: set[int] = set()
    for ph in k.phases:
        values = [r.value for r in ph.reduces] + [st.value for st in ph.stores]
        if any(s.op == "load" and s.attr[0] in stored for s in _closure(values)):
            return True
        stored |= {st.buffer for st in ph.stores}
    return False


def _closure(roots: list[Stmt]) -> list[Stmt]:
    seen: dict[int, Stmt] = {}
    todo = list(roots)
    while todo:
        s = todo.pop()
        if s.id not in seen:
            seen[s.id] = s
            todo.extend(s.args)
    return list(seen.values())


def _vector_stmt(s: Stmt, v: Var, k: Kernel | None = None) -> bool:
    if s.op == "load":
        if k is not None and k.buffers[s.attr[0]].dtype != "f32":
            return False
        return lane_coefficient(s.attr[1], v) in (0, 1)
    if s.op == "acc":
        # NOTE: an earlier reduction's result (reduction kernels only): broadcast
        return k is not None and s.dtype == "f32"
    if s.op == "const":
        return s.dtype in ("f32", "b")
    if s.op in _COMPARE:
        return s.args[0].dtype == "f32"
    if s.op in _LOGIC:
        return s.dtype == "b"
    return s.dtype == "f32" and (s.op in _FLOAT_OPS or s.op in LIBMVEC)
