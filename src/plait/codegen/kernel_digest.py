"""A digest of a kernel's structure: everything a printer reads of a :class:`~plait.codegen.kir.
Kernel` (its loops, buffers, statements with their ids, reductions and stores; not the graph
nodes it computes), so two kernels
with one digest print the same text under the same print options. A rebuild of a saved program
takes the kernel text recorded under the digest instead of printing the kernel again
(:mod:`plait.runtime.program_doc`).

Statements are listed once each, in the order of a depth-first walk from the stores and
reductions, by identity (a shared statement is one entry; its uses name its position). Floats are
spelled by their bits (the sign of a NaN and of a zero included).

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> from plait.codegen.kir import KernelBuilder
    >>> def kernel(c):
    ...     b = KernelBuilder("k", outer=(Var("i0", 8),))
    ...     x, y = b.buffer("x", "f32", 8), b.buffer("y", "f32", 8, output=True)
    ...     i = Ix.var(b.outer[0])
    ...     b.store(y, i, b.op("add", [b.load(x, i), b.const(c, "f32")], "f32"))
    ...     return b.build(nodes=(0,))
    >>> structure_digest(kernel(1.0)) == structure_digest(kernel(1.0))
    True
    >>> structure_digest(kernel(0.0)) == structure_digest(kernel(-0.0))
    False
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from plait.codegen.kir import Kernel, Stmt


def structure_digest(kernel: Kernel) -> str:
    """SHA-256 (hex) of ``kernel``'s structure."""
    lines = [
        repr((kernel.name, kernel.outer, kernel.inner, kernel.buffers)),
        # NOTE: not its graph node ids, which printing never reads and a saved graph's text
        # does not keep
        repr(kernel.template),
    ]
    position: dict[int, int] = {}
    for p, ph in enumerate(kernel.phases):
        for r in ph.reduces:
            lines.append(f"r {p} {r.acc} {r.kind} {r.dtype} {_listed(r.value, position, lines)}")
        for st in ph.stores:
            lines.append(f"w {p} {st.buffer} {st.index!r} {_listed(st.value, position, lines)}")
    for st in kernel.final:
        lines.append(f"f {st.buffer} {st.index!r} {_listed(st.value, position, lines)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _listed(s: Stmt, position: dict[int, int], lines: list[str]) -> int:
    """``s``'s position among the statements listed (listed first, operands before it)."""
    # NOTE: keyed by identity: two statements that share an id still list apart
    found = position.get(id(s))
    if found is not None:
        return found
    args = [_listed(a, position, lines) for a in s.args]
    position[id(s)] = len(position)
    lines.append(f"s {s.id} {s.op} {s.dtype} {args} {_spelled(s.attr)}")
    return position[id(s)]


def _spelled(value: Any) -> str:
    if isinstance(value, float):
        return "float:" + struct.pack("<d", value).hex()
    if isinstance(value, tuple):
        return "(" + ", ".join(_spelled(v) for v in value) + ")"
    return f"{type(value).__name__}:{value!r}"
