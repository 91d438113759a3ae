"""Loop transforms on the kernel IR, before any printer: drop size-1 loops, split a loop whose
symbolic extent is a product that its indices divide, merge adjacent loops.

A loop over ``s0*s1`` (a reshape's merged dims) whose indices read ``i / s1`` and ``i % s1``
divides by a size known only at run time, for every element (a transposing copy in a symbolic
BERT's backward ran 2.7x slower than its static program's, whose divisors are constants): it
is split into loops over ``s0`` and ``s1``, and the divisions fold away.

Merging two loops ``a`` (outer) and ``b`` (inner) into one ``f`` substitutes ``a = f / eb`` and
``b = f % eb`` in every index; it is kept only when the kernel ends up with no more div/mod atoms
than before, i.e. when every access was contiguous across the pair (or broadcast along both). A
contiguous pointwise kernel thus becomes one flat loop, which vectorizes and parallelizes best.

``per_element=True`` (the C++ printer) splits static extents too and judges a pointwise kernel's
merges by the atoms of its innermost loop alone. A transposing copy (attention's heads merged
back, ``[B, H, T, D] -> [B, T, H*D]``) built over its output's rows and columns reads ``row / T``,
``row % T``, ``col / D``, ``col % D``; merged flat, every element computed four divisions and
gathered (196 us for 131072 floats in a GPT-2 block's backward). Split, the loads are affine,
the innermost loop runs along ``D`` contiguously, and the outer loops merge again (their
divisions run once per row, not per element).

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> from plait.codegen.kir import KernelBuilder
    >>> b = KernelBuilder("k", outer=(Var("i0", 3), Var("i1", 5)))
    >>> x, y = b.buffer("x", "f32", 15), b.buffer("y", "f32", 15, output=True)
    >>> i = Ix.var(b.outer[0]) * 5 + Ix.var(b.outer[1])
    >>> b.store(y, i, b.load(x, i))
    >>> [str(v) for v in merge_loops(b.build(nodes=())).outer]
    ['i0']
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace

from plait.codegen.index import Atom, Clamp, Div, Ix, Mod, Var, nonzero
from plait.codegen.kir import Kernel, Phase, Reduce, Stmt, Store, kernel_indices
from plait.symbolic.poly import Size, exact_quotient


def _count_divmod(kernel: Kernel) -> int:
    n = 0
    for ix in kernel_indices(kernel):
        n += sum(1 for a, _ in ix.terms if not isinstance(a, Var))
    return n


def substitute(
    kernel: Kernel, mapping: Mapping[Var, Ix], outer: tuple[Var, ...], inner: tuple[Var, ...]
) -> Kernel:
    """``kernel`` with every index rewritten by ``mapping`` and new loop variables."""
    memo: dict[int, Stmt] = {}
    done: dict[Ix, Ix] = {}  # NOTE: every index of the kernel shares its operands' substitutions

    def stmt(s: Stmt) -> Stmt:
        hit = memo.get(s.id)
        if hit is not None:
            return hit
        attr = s.attr
        if s.op == "load":
            attr = (attr[0], attr[1].subs(mapping, done))
        elif s.op == "index":
            attr = attr.subs(mapping, done)
        new = Stmt(s.id, s.op, tuple(stmt(a) for a in s.args), s.dtype, attr)
        memo[s.id] = new
        return new

    def store(st: Store) -> Store:
        return Store(st.buffer, st.index.subs(mapping, done), stmt(st.value))

    phases = [
        Phase(
            [Reduce(r.acc, r.kind, stmt(r.value), r.dtype) for r in ph.reduces],
            [store(st) for st in ph.stores],
        )
        for ph in kernel.phases
    ]
    final = [store(st) for st in kernel.final]
    return replace(kernel, outer=outer, inner=inner, phases=phases, final=final)


def drop_unit_loops(kernel: Kernel) -> Kernel:
    units = [v for v in (*kernel.outer, *kernel.inner) if v.extent == 1]
    if not units:
        return kernel
    mapping = {v: Ix.lit(0) for v in units}
    outer = tuple(v for v in kernel.outer if v.extent != 1)
    inner = tuple(v for v in kernel.inner if v.extent != 1)
    return substitute(kernel, mapping, outer, inner)


def _merge_pair(kernel: Kernel, which: str, j: int) -> Kernel:
    loops = kernel.outer if which == "outer" else kernel.inner
    a, b = loops[j], loops[j + 1]
    f = Var(a.name, a.extent * b.extent)
    fi = Ix.var(f)
    # NOTE: a zero extent makes the merged loop run zero times: its index is never evaluated.
    inner = nonzero(b.extent)
    mapping = {a: fi.div(inner), b: fi.mod(inner)}
    merged = (*loops[:j], f, *loops[j + 2 :])
    if which == "outer":
        return substitute(kernel, mapping, merged, kernel.inner)
    return substitute(kernel, mapping, kernel.outer, merged)


def _atoms(ix: Ix) -> Iterator[Atom]:
    """Every div, mod and clamp atom of ``ix``, nested ones included."""
    for a, _ in ix.terms:
        if not isinstance(a, Var):
            yield a
            yield from _atoms(a.e)


def _divisor(kernel: Kernel, v: Var, static: bool) -> Size | None:
    """A divisor ``k`` that an index applies to ``v`` itself (``v / k``, ``v % k``) and that
    divides ``v``'s extent exactly: symbolic ones, and with ``static`` constant ones smaller
    than the extent; None where there is none."""
    if isinstance(v.extent, int) and not static:
        return None
    for ix in kernel_indices(kernel):
        for a in _atoms(ix):
            if not isinstance(a, (Div, Mod)) or a.e != Ix.var(v):
                continue
            if isinstance(a.k, int):
                exact = isinstance(v.extent, int) and 1 < a.k < v.extent and v.extent % a.k == 0
                if static and exact:
                    return a.k
            elif exact_quotient(v.extent, a.k) is not None:
                return a.k
    return None


def split_loops(kernel: Kernel, static: bool = False) -> Kernel:
    """Split each loop ``v`` over ``q*k`` whose indices divide it by the symbolic ``k`` (with
    ``static``, by a constant too) into loops over ``q`` and ``k`` (``v = a*k + b``): the
    division and modulo fold away."""
    for which in ("outer", "inner"):
        j = 0
        while j < len(loops := kernel.outer if which == "outer" else kernel.inner):
            v = loops[j]
            k = _divisor(kernel, v, static)
            if k is None:
                j += 1
                continue
            quotient = exact_quotient(v.extent, k)
            assert quotient is not None
            a, b = Var(f"{v.name}q", quotient), Var(f"{v.name}r", k)
            mapping = {v: Ix.var(a) * k + Ix.var(b)}
            split = (*loops[:j], a, b, *loops[j + 1 :])
            outer, inner = (split, kernel.inner) if which == "outer" else (kernel.outer, split)
            kernel = substitute(kernel, mapping, outer, inner)
    return kernel


def _per_element_divmod(kernel: Kernel) -> tuple[int, int]:
    """The div/mod/clamp atoms of a pointwise kernel's indices that read its innermost loop
    variable (the index arithmetic run for every element; the rest runs once per row), and
    the div/mod atoms by a size known only at run time (a division the compiler cannot turn
    into a multiplication, kept out of even the outer loops)."""
    last = kernel.outer[-1] if kernel.outer else None
    inner = symbolic = 0
    for ix in kernel_indices(kernel):
        for a, _ in ix.terms:
            if isinstance(a, Var):
                continue
            inner += last in a.e.vars()
            symbolic += isinstance(a, (Div, Mod)) and not isinstance(a.k, int)
    return inner, symbolic


def merge_loops(kernel: Kernel, per_element: bool = False) -> Kernel:
    """Drop size-1 loops, split loops that symbolic divisors divide (with ``per_element``,
    constant ones too), then merge adjacent loops (innermost pairs first) where free: where the
    kernel's div/mod atoms do not grow, or with ``per_element`` in a pointwise kernel, its
    per-element ones and its divisions by run-time sizes (:func:`_per_element_divmod`).

    Example (a transposing copy, ``y[b, t, h*4 + d] = x[b, h, t, d]``):
        >>> from plait.codegen.index import Ix, Var
        >>> from plait.codegen.kir import KernelBuilder
        >>> b = KernelBuilder("k", outer=(Var("i0", 6), Var("i1", 8)))
        >>> x, y = b.buffer("x", "f32", 48), b.buffer("y", "f32", 48, output=True)
        >>> row, col = Ix.var(b.outer[0]), Ix.var(b.outer[1])
        >>> src = row.div(3) * 24 + col.div(4) * 12 + row.mod(3) * 4 + col.mod(4)
        >>> b.store(y, row * 8 + col, b.load(x, src))
        >>> k = merge_loops(b.build(nodes=()), per_element=True)
        >>> [v.extent for v in k.outer], k.stmts()[0].attr[1].coef(k.outer[-1])
        ([12, 4], 1)
    """
    kernel = split_loops(drop_unit_loops(kernel), static=per_element)
    if kernel.numel == 0:
        return kernel
    pointwise = per_element and not kernel.inner
    for which in ("outer", "inner"):
        j = len(kernel.outer if which == "outer" else kernel.inner) - 2
        while j >= 0:
            candidate = _merge_pair(kernel, which, j)
            if pointwise:
                now, then = _per_element_divmod(kernel), _per_element_divmod(candidate)
                keep = then[0] <= now[0] and then[1] <= now[1]
            else:
                keep = _count_divmod(candidate) <= _count_divmod(kernel)
            if keep:
                kernel = candidate
            j -= 1
    return kernel


# NOTE: at most this many pieces: each is the loop body printed once more
MAX_SEGMENTS = 8
# (op, the index on its right) -> the op with the index on its left
_MIRRORED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _offset_of(ix: Ix, v: Var) -> int | None:
    """``c`` where ``ix`` is ``v + c`` for an integer ``c``; None otherwise."""
    if ix.vars() != {v} or ix.terms != ((v, 1),) or not isinstance(ix.const, int):
        return None
    return ix.const


def _flip(op: str, c: int, k: int) -> int:
    """Where ``v + c <op> k`` changes its truth as ``v`` counts up."""
    return k - c if op in ("lt", "ge") else k - c + 1


def segments(kernel: Kernel, v: Var) -> list[tuple[Size, Size]]:
    """The ranges of the innermost loop variable ``v`` of a pointwise kernel on which every
    comparison of ``v + c`` with a constant and every clamp of ``v + c`` (``cat``, ``stack`` and
    ``constant_pad`` pick their input so) is decided: a loop printed once per range lets the
    C++ compiler fold the choice and the clamp, and read each input contiguously (the three-way
    ``cat`` of a GPT-2 block's query, key and value gradients: 424 -> 90 us, one thread). One
    range, the whole loop, where there is nothing to decide, the extent is symbolic or the
    ranges would exceed :data:`MAX_SEGMENTS`.

    Example (``cat([a, b], -1)`` of two 4-wide rows):
        >>> from plait.codegen.index import Ix, Var
        >>> from plait.codegen.kir import KernelBuilder
        >>> i, j = Var("i0", 3), Var("i1", 8)
        >>> b = KernelBuilder("k", outer=(i, j))
        >>> x, y = b.buffer("x", "f32", 12), b.buffer("y", "f32", 12)
        >>> out = b.buffer("out", "f32", 24, output=True)
        >>> row, col = Ix.var(i), Ix.var(j)
        >>> left = b.load(x, row * 4 + col.clamp(0, 3))
        >>> right = b.load(y, row * 4 + (col - 4).clamp(0, 3))
        >>> first = b.op("lt", [b.index(col), b.const(4, "i64")], "b")
        >>> b.store(out, row * 8 + col, b.op("where", [first, left, right], "f32"))
        >>> segments(b.build(nodes=()), j)
        [(0, 4), (4, 8)]
    """
    whole: list[tuple[Size, Size]] = [(0, v.extent)]
    if kernel.inner or not isinstance(v.extent, int):
        return whole
    points: set[int] = set()
    for s in kernel.stmts():
        if s.op in _MIRRORED and len(s.args) == 2:
            for ix, k, op in ((s.args[0], s.args[1], s.op), (s.args[1], s.args[0], None)):
                if ix.op != "index" or k.op != "const" or type(k.attr) is not int:
                    continue
                c = _offset_of(ix.attr, v)
                if c is not None:
                    points.add(_flip(op or _MIRRORED[s.op], c, k.attr))
        ixs = [s.attr[1]] if s.op == "load" else [s.attr] if s.op == "index" else []
        for ix in ixs:
            for a in _atoms(ix):
                if not isinstance(a, Clamp) or not isinstance(a.lo, int):
                    continue
                c = _offset_of(a.e, v)
                if c is not None and isinstance(a.hi, int):
                    points.update((a.lo - c, a.hi - c + 1))
    cuts = sorted(p for p in points if 0 < p < v.extent)
    if not cuts or len(cuts) >= MAX_SEGMENTS:
        return whole
    edges = [0, *cuts, v.extent]
    return list(itertools.pairwise(edges))
