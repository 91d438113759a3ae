"""Result layouts: the dense-layout check, and strides as a saved plan holds them.

A saved plan (:func:`extern_layouts`, what the artifact cache stores) records each extern
result's strides as ints. Symbolic strides (:mod:`plait.symbolic.poly`) are always a dense layout
of the symbolic shape, so they are saved as their dim order (:func:`encode_strides`) and rebuilt
from the shape (:func:`decode_strides`): the saved plan of a symbolic program holds no size.

Example:
    >>> from plait.symbolic import symbol
    >>> from plait.symbolic.poly import from_dim
    >>> s0 = from_dim(symbol("s0"))
    >>> shape = (3, s0, 4)
    >>> encode_strides((12, 4, 1)), encode_strides((4 * s0, 1, s0))
    ((12, 4, 1), (-1, -3, -2))
    >>> decode_strides(shape, (-1, -3, -2))
    (4*s0, 1, s0)
"""

from __future__ import annotations

from collections.abc import Sequence

from plait.codegen.index import contiguous_strides
from plait.codegen.plan import ExternStep, Plan, SavedLayouts
from plait.codegen.views import sizes_of
from plait.ir.graph import Value
from plait.ir.types import TensorType
from plait.symbolic.poly import Poly, Size, hint


def dense(shape: tuple[Size, ...], strides: tuple[Size, ...]) -> bool:
    """Whether ``strides`` lay ``shape`` out without gaps or overlaps (a permutation of
    contiguous strides; symbolic ones checked exactly, in the order of their hints)."""
    dims = sorted(
        ((s, n) for s, n in zip(strides, shape) if n != 1),
        key=lambda p: (hint(p[0]), hint(p[1]), str(p[0]), str(p[1])),
    )
    expected: Size = 1
    for s, n in dims:
        if s != expected:
            return False
        expected = expected * n
    return True


def encode_strides(strides: Sequence[Size]) -> tuple[int, ...]:
    """Strides as a saved plan holds them: ints; symbolic (dense) strides as their dim order,
    each dim's place from the outermost as ``-1 - place`` (a stride is never negative)."""
    if all(isinstance(s, int) for s in strides):
        return tuple(strides)  # type: ignore[arg-type]
    order = sorted(range(len(strides)), key=lambda d: (-hint(strides[d]), d))
    return tuple(-1 - order.index(d) for d in range(len(strides)))


def decode_strides(shape: Sequence[Size], saved: Sequence[int]) -> tuple[Size, ...]:
    """Saved strides back (see :func:`encode_strides`): the dense strides of ``shape`` in the
    saved dim order."""
    if not saved or all(int(x) >= 0 for x in saved):
        return tuple(int(x) for x in saved)
    order = sorted(range(len(saved)), key=lambda d: -1 - int(saved[d]))
    out: list[Size] = [0] * len(saved)
    acc: Size = 1
    for d in reversed(order):
        out[d] = acc
        n = shape[d]
        acc = acc * (n if isinstance(n, Poly) else max(n, 1))
    return tuple(out)


def restored_strides(v: Value, saved: Sequence[int]) -> tuple[Size, ...]:
    """A saved plan's strides for result ``v``."""
    if all(int(x) >= 0 for x in saved):
        return tuple(int(x) for x in saved)
    return decode_strides(sizes_of(v.type), saved)


def extern_layouts(plan: Plan) -> SavedLayouts:
    """The result strides each extern step of ``plan`` settled on, keyed by the node's position
    in ``plan.graph.nodes`` (positions survive the IR's text round trip; ids need not), with
    the oneDNN calls refused at compile time (``.refused``): the plan to save."""
    position = {n.id: i for i, n in enumerate(plan.graph.nodes)}
    layouts = {
        position[s.node.id]: [_saved_strides(v, x) for v, x in zip(s.outputs, s.out_strides)]
        for s in plan.steps
        if isinstance(s, ExternStep)
    }
    return SavedLayouts(layouts, plan.refused)


def _saved_strides(v: Value, strides: Sequence[Size]) -> tuple[int, ...]:
    """``strides`` for a saved plan; symbolic ones that the saved dim order would not give back
    exactly are saved contiguous (the runner conforms such a result)."""
    saved = encode_strides(strides)
    if not isinstance(v.type, TensorType) or all(isinstance(s, int) for s in strides):
        return saved
    shape = sizes_of(v.type)
    if decode_strides(shape, saved) == tuple(strides):
        return saved
    return encode_strides(contiguous_strides(shape))
