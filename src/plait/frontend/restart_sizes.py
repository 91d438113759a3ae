"""Which symbolic sizes a dynamic capture makes static when an IR op's type rule rejects its
operands (``s1`` against a weight's ``8``): the capture starts again with them static
(:meth:`plait.frontend.capture_values.CaptureValues.restart`).

Example:
    >>> import sympy, torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    >>> x = GraphBuilder().input("x", TensorType((s0, s1), torch.float32))
    >>> sorted(map(str, sizes_to_make_static({s0: 2, s1: 8}, [x], "s1 != 3", None)))
    ['s1']
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from plait.ir import TensorType, Value

# NOTE: attributes that are sizes a type rule compares with an operand's dims
_SIZE_ATTRS = frozenset({"normalized_shape", "sizes", "shape", "size", "output_size"})


def sizes_to_make_static(bindings: dict[Any, int], operands: Any, why: str, attrs: Any) -> set:
    """The symbols (of ``bindings``: each symbol's size in the samples) of ``operands`` to make
    static after a type rule rejected them saying ``why``. Sizes equal to a static dim of
    another operand or to an int of the attributes (``normalized_shape``, split sizes) that the
    rule's message names go first, then those it names, then those equal to a static size;
    failing that, every symbolic size of the operands (none: an empty set)."""
    types = [
        o.type for o in flat(operands) if isinstance(o, Value) and isinstance(o.type, TensorType)
    ]
    syms = {
        s
        for t in types
        for d in t.shape
        if not isinstance(d, int)
        for s in d.free_symbols
        if s in bindings
    }
    statics = {d for t in types for d in t.shape if isinstance(d, int)}
    sizes = [v for k, v in (attrs or {}).items() if k in _SIZE_ATTRS]
    statics |= {v for v in flat(sizes) if type(v) is int}
    matching = {s for s in syms if bindings[s] in statics}
    # NOTE: the sizes the rule's message names are the dims it could not relate (ViT's
    # patch count ``floor(s2/8)**2 + 1`` against its position table's 5 names the height,
    # not the batch; a conv's ``s1 != 3`` names the channels, not a height of 64 that
    # equals the weight's 64 output channels): an equal static size alone is a coincidence
    # more often than not. A guess too narrow only restarts the capture once more; one too
    # wide costs a specialization per size of a dim that never needed to be static.
    named = {s for s in syms if re.search(rf"(?<!\w){re.escape(str(s))}(?!\w)", why)}
    return (matching & named) or named or matching or syms


def flat(xs: Any) -> Iterator[Any]:
    """The leaves of nested lists and tuples."""
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from flat(x)
        else:
            yield x
