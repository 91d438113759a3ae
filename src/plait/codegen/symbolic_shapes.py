"""Symbolic shapes in Stax: what compiles with symbolic dims, how a call binds its sizes, and the
representative sizes (hints) the planner's dry runs use.

A graph whose dims are sympy expressions over input symbols (``f32[s0, s1, 64]``) compiles to
one program for every size: kernels, the memory plan and extern calls take the sizes a call
binds. Each size *atom* (:mod:`plait.symbolic.poly`: a symbol, or a compound size such as
``floor(s0/2)``) is read from the call's inputs once per call: a symbol from the first input dim
that is exactly that symbol, a compound atom computed from the symbols (:func:`binding_code`).

The planner learns extern result layouts by running each extern once (a dry run): with
symbolic dims it runs them at representative sizes, the *hints*: the sizes of the call being
compiled (:func:`size_hints`, set by ``plait.compile``), or else a default that keeps every
dim of the graph nonnegative. A learned layout is kept only as the dim order it shows
(:func:`learned_strides`: the dense strides of the symbolic shape in that order, checked
against the dry run's strides); the runner conforms any result that comes back otherwise, so
a layout never depends on the hint for correctness, only for speed.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.symbolic import symbol
    >>> s0 = symbol("s0")
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((s0, 64), torch.float32))
    >>> gb.output(gb.call("relu", x))
    >>> graph = gb.build()
    >>> binding_code(graph)
    [('s0', 'a0.shape[0]')]
    >>> with size_hints({"s0": 5}):
    ...     hints_for(graph)
    {'s0': 5}
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sympy

from plait.codegen.datadep import touches_unbacked
from plait.codegen.errors import CodegenError
from plait.ir.graph import Graph, Node, Value
from plait.ir.types import TensorType
from plait.symbolic import UNBACKED_RE
from plait.symbolic.poly import Poly, Size, atoms_of, compound, evaluate, from_dim, to_text

# NOTE: the sizes of the call being compiled, by symbol name (plait.compile sets them around a
# compile): what the planner's dry runs use. Never part of an artifact's identity.
_HINTS: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar(
    "plait_size_hints", default=None
)
DEFAULT_HINTS = (8, 16, 4, 32, 2, 64, 128)
HINT_DEFAULT = 64  # NOTE: a size atom's hint when the compiling call's sizes do not give it


@contextlib.contextmanager
def size_hints(hints: Mapping[str, int]) -> Iterator[None]:
    """Compile with these representative sizes of the graph's symbols (by name) for the
    planner's dry runs."""
    token = _HINTS.set(dict(hints))
    try:
        yield
    finally:
        _HINTS.reset(token)


def is_symbolic(graph: Graph) -> bool:
    """Whether ``graph`` has a symbolic dim that is no data-dependent (unbacked) size."""
    return any(_symbolic_type(v.type) for v in _values(graph))


def _symbolic_type(t: Any) -> bool:
    return isinstance(t, TensorType) and any(
        not UNBACKED_RE.match(str(s))
        for d in t.shape
        if not isinstance(d, int)
        for s in d.free_symbols
    )


def _values(graph: Graph) -> Iterator[Value]:
    yield from graph.inputs
    for n in graph.nodes:
        yield from n.outputs


def check_symbolic(graph: Graph, target: str) -> None:
    """Refuse, naming the dim, what Stax cannot compile with symbolic shapes (C++ and Triton
    kernels alike take sizes): a node that also reads or makes a data-dependent size, a symbol
    no input dim binds."""
    first = next((v for v in _values(graph) if _symbolic_type(v.type)), None)
    if first is None:
        return
    for node in graph.nodes:
        if touches_unbacked(node) and any(
            _symbolic_type(v.type) for v in (*node.input_values(), *node.outputs)
        ):
            raise CodegenError(
                "a call of data-dependent size on values of symbolic size is not compiled "
                "symbolically (specialize the sizes)",
                node_id=node.id,
                op=node.op,
            )
    symbol_sources(graph)


def symbol_sources(graph: Graph) -> dict[str, tuple[int, int]]:
    """Each symbol of ``graph``'s shapes -> (input position, dim) of the first input dim that is
    exactly it: where a call reads its size."""
    sources: dict[str, tuple[int, int]] = {}
    for i, v in enumerate(graph.inputs):
        if isinstance(v.type, TensorType):
            for d, dim in enumerate(v.type.shape):
                if isinstance(dim, sympy.Symbol) and not UNBACKED_RE.match(str(dim)):
                    sources.setdefault(str(dim), (i, d))
    needed = sorted(_symbols(graph))
    missing = [s for s in needed if s not in sources]
    if missing:
        raise CodegenError(
            f"symbols {missing} are no input's dim: a call could not bind them (every symbol "
            "must be some input's size)"
        )
    return sources


def _symbols(graph: Graph) -> set[str]:
    out: set[str] = set()
    for atom in graph_atoms(graph):
        expr = compound(atom)
        names = [str(s) for s in expr.free_symbols] if expr is not None else [atom]
        out |= {n for n in names if not UNBACKED_RE.match(n)}
    return out


def graph_atoms(graph: Graph) -> list[str]:
    """The size atoms of ``graph``'s types and of its nodes' size attributes, sorted."""
    sizes: list[Size] = []
    for v in _values(graph):
        if _symbolic_type(v.type):
            assert isinstance(v.type, TensorType)
            sizes.extend(from_dim(d) for d in v.type.shape)
    for node in graph.nodes:
        sizes.extend(attr_sizes(node))
    return sorted(a for a in atoms_of(sizes) if not UNBACKED_RE.match(a))


def attr_sizes(node: Node) -> list[Size]:
    """The symbolic sizes among ``node``'s attributes (a slice bound, a view's shape) and its
    scalar operands."""
    out: list[Size] = []
    for value in node.attrs.values():
        _collect_sizes(value, out)
    for operand in node.inputs:  # NOTE: a size used as a scalar operand (x / x.shape[0])
        _collect_sizes(operand, out)
    return out


def _collect_sizes(v: Any, out: list[Size]) -> None:
    # NOTE: a module-level function, not a recursive closure (a reference cycle per call)
    if isinstance(v, sympy.Expr) and v.free_symbols:
        out.append(from_dim(v))
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect_sizes(x, out)


def hints_for(graph: Graph) -> dict[str, int]:
    """Representative values of ``graph``'s size atoms: the compiling call's sizes
    (:func:`size_hints`) where given, else the first default under which every dim of the
    graph is nonnegative."""
    atoms = graph_atoms(graph)
    symbols = sorted({s for s in _symbols(graph)})
    given = _HINTS.get() or {}
    for default in DEFAULT_HINTS:
        values = {s: int(given.get(s, default)) for s in symbols}
        out = _with_compounds(atoms, values)
        if out is not None and all(
            evaluate(from_dim(d), out) >= 0
            for v in _values(graph)
            if _symbolic_type(v.type)
            for d in v.type.shape  # type: ignore[union-attr]
        ):
            return out
        if all(s in given for s in symbols):
            break
    raise CodegenError(
        f"no representative sizes for symbols {symbols} keep every dim nonnegative: compile "
        "under plait.codegen.symbolic_shapes.size_hints"
    )


def _with_compounds(atoms: Sequence[str], values: dict[str, int]) -> dict[str, int] | None:
    out = dict(values)
    for a in atoms:
        expr = compound(a)
        if expr is None:
            continue
        value = expr.subs({s: values[str(s)] for s in expr.free_symbols})
        if not value.is_Integer:
            return None
        out[a] = int(value)
    return out


def atom_hints(atoms: Sequence[str]) -> dict[str, int]:
    """Representative values of size ``atoms`` for choices that decide only speed (a Triton
    kernel's block sizes): the compiling call's sizes (:func:`size_hints`), compound atoms
    computed from them, ``HINT_DEFAULT`` where unknown."""
    given = _HINTS.get() or {}
    out: dict[str, int] = {}
    for a in atoms:
        expr = compound(a)
        if expr is None:
            out[a] = int(given.get(a, HINT_DEFAULT))
            continue
        value = expr.subs({s: int(given.get(str(s), HINT_DEFAULT)) for s in expr.free_symbols})
        out[a] = int(value) if value.is_Integer else HINT_DEFAULT
    return out


def concrete(sizes: Sequence[Size], hints: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(evaluate(s, hints) for s in sizes)


def learned_strides(
    shape: Sequence[Size], strides: Sequence[int], hints: Mapping[str, int]
) -> tuple[Size, ...] | None:
    """The symbolic strides of the dense layout whose dim order ``strides`` (a dry run's, at
    ``hints``) show, when they evaluate to exactly those; None otherwise (the result is then
    planned contiguous and conformed at run time)."""
    sizes = concrete(shape, hints)
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    out: list[Size] = [0] * len(shape)
    acc: Size = 1
    for d in reversed(order):
        out[d] = acc
        n = shape[d]
        acc = acc * (n if isinstance(n, Poly) else max(n, 1))
    candidate = tuple(out)
    # NOTE: size-1 dims take any stride in PyTorch: compare only where it matters
    if any(
        sizes[d] != 1 and evaluate(candidate[d], hints) != strides[d] for d in range(len(shape))
    ):
        return None
    return candidate


# --- how a call binds its sizes (the runner's code) ---------------------------------------------
def size_local(atom: str) -> str:
    """The runner's local holding a size atom's value."""
    return f"z_{atom}"


def python_size(x: Size) -> str:
    """A size as Python code over the runner's size locals."""
    return to_text(x, size_local) if isinstance(x, Poly) else str(x)


def binding_code(graph: Graph) -> list[tuple[str, str]]:
    """``(atom, Python expression)`` in evaluation order: symbols read from the inputs
    (``a0.shape[1]``), then compound atoms computed from them."""
    sources = symbol_sources(graph)
    out = [(s, f"a{i}.shape[{d}]") for s, (i, d) in sorted(sources.items())]
    for a in graph_atoms(graph):
        expr = compound(a)
        if expr is not None:
            out.append((a, _python(expr)))
    return out


def _python(e: sympy.Expr) -> str:
    """A size expression as Python integer code (floor and ceiling as floor division)."""
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return size_local(str(e))
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        n, d = _python(sympy.expand(num)), _python(sympy.expand(den))
        if isinstance(e, sympy.floor):
            return f"(({n}) // ({d}))"
        return f"(-((-({n})) // ({d})))"
    if isinstance(e, sympy.Mod):
        return f"(({_python(e.args[0])}) % ({_python(e.args[1])}))"
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(e, sympy.Max) else "min"
        return f"{fn}({', '.join(_python(a) for a in e.args)})"
    if e.is_Add:
        return "(" + " + ".join(_python(a) for a in e.args) + ")"
    if e.is_Mul and all(a.is_Integer or not a.is_number for a in e.args):
        return "(" + " * ".join(_python(a) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return f"(({_python(e.base)}) ** {int(e.exp)})"
    raise CodegenError(f"the size {e} is no integer expression Stax can compute")
