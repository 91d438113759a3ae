"""What planning and lowering share: where a value lives (:class:`Loc`) and a kernel bound to
the IR values it reads and writes (:class:`Lowered`).

The planner (:mod:`plait.codegen.fusion`) decides a ``Loc`` for every value; lowering
(:mod:`plait.codegen.lower`, :mod:`plait.codegen.reductions`) reads them to build kernels. Both
import this module and not each other's.

Example:
    >>> Loc("inline").kind, Loc("buffer", strides=(4, 1)).strides
    ('inline', (4, 1))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plait.codegen.kir import Kernel
from plait.ir.graph import Value
from plait.symbolic.poly import Size


@dataclass
class Loc:
    """Where a value lives: a graph ``input``, a ``buffer`` (materialized by a kernel, an extern or
    a fallback), a strided ``view`` of one (``base``, ``offset``, ``strides`` in elements), or
    ``inline`` (recomputed by each kernel that reads it)."""

    kind: str
    base: Value | None = None
    offset: Size = 0
    strides: tuple[Size, ...] = ()


@dataclass
class Lowered:
    """A kernel plus the IR values bound to its buffers (in buffer order) and the nodes it ran."""

    kernel: Kernel
    bindings: list[Value]
    covered: set[int] = field(default_factory=set)
