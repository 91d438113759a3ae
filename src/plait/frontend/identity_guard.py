"""The identity guard: which input tensors are one object, the module's parameters and buffers,
or tensors the program reads from Python state, as at capture (``a is b``, ``x is self.weight``
and ``x is G`` read in the program as they did then).

Example:
    >>> identity_guard([0, 1], [(1, 0)], ["a", "b"]).text
    'inputs: b is a'
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import torch

from plait.errors import GraphCaptureError
from plait.frontend import pyvalues
from plait.guards.guard import Guard, GuardEnv, ReadIdentity


def identity_guard(
    tensors: Sequence[int],
    same: Sequence[tuple[int, int]],
    paths: Sequence[str],
    in_state: Sequence[tuple[int, int]] = (),
    state_paths: Sequence[str] = (),
    held: Sequence[torch.Tensor] = (),
) -> Guard:
    """The input tensors ``tensors`` (leaf indices) are the same objects where capture found
    them the same (``same``: (leaf, earlier leaf) pairs, traced as one tensor), the module's
    state tensors where it found them so (``in_state``: (leaf, state entry) pairs, traced as
    that parameter or buffer; ``state_paths`` names the entries), and distinct objects
    elsewhere: ``a is b`` and ``x is self.weight`` in the program read as they did at capture.
    ``held``: the tensors the program reads from Python state, which no input may be (capture
    refuses such a call: :func:`refuse_held_inputs`). A leaf reads as the earliest leaf it is,
    as ``-1 - entry`` for a state entry, or as ``ReadIdentity.HELD - c`` for ``held[c]``.

    >>> g = identity_guard([0, 1], [(1, 0)], ["a", "b"])
    >>> g.expected, g.text
    ((0, 0), 'inputs: b is a')
    >>> identity_guard([0], [], ["x"], [(0, 2)], ["a.w", "a.b", "c.w"]).text
    'inputs: x is c.w'
    """
    firsts = dict(same)
    entries = dict(in_state)
    expected = tuple(-1 - entries[i] if i in entries else firsts.get(i, i) for i in tensors)
    kept = tuple(held)

    def text(firsts: Sequence[int]) -> str:
        def name(j: int) -> str:
            if j <= ReadIdentity.HELD:
                return f"tensor {ReadIdentity.HELD - j} the program reads from Python state"
            return state_paths[-1 - j] if j < 0 else paths[j]

        pairs = [f"{paths[i]} is {name(j)}" for i, j in zip(tensors, firsts) if i != j]
        return f"inputs: {', '.join(pairs)}" if pairs else "input tensors are distinct objects"

    def read(env: GuardEnv) -> tuple[int, ...]:
        first: dict[int, int] = {}
        state = env.state if state_paths else ()
        out: list[int] = []
        for i in tensors:
            leaf = env.leaves[i]
            # NOTE: C-level scans first: most calls pass no state or held tensor
            if state and any(map(operator.is_, state, repeat(leaf))):
                out.append(-1 - next(k for k, t in enumerate(state) if t is leaf))
            elif kept and any(map(operator.is_, kept, repeat(leaf))):
                out.append(ReadIdentity.HELD - next(c for c, t in enumerate(kept) if t is leaf))
            else:
                out.append(first.setdefault(id(leaf), i))
        return tuple(out)

    native = ReadIdentity(tuple(tensors), expected, bool(state_paths), kept)
    return Guard("alias", "input tensors", text(expected), expected, read, fmt=text, native=native)


def held_tensors(consts: Sequence[torch.Tensor], keys: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors the program reads from Python state: its constant inputs and the tensors in
    the value keys of the Python values it read (by identity, at any depth), each once.

    >>> t = torch.ones(1)
    >>> held_tensors([t], [("tensor", pyvalues.Same(t), ())]) == [t]
    True
    """
    out = {id(t): t for t in consts}
    todo = list(keys)
    while todo:
        k = todo.pop()
        if isinstance(k, tuple):
            todo.extend(k)
        elif isinstance(k, pyvalues.Same) and isinstance(k.obj, torch.Tensor):
            out.setdefault(id(k.obj), k.obj)
    return list(out.values())


def refuse_held_inputs(
    tensors: Sequence[int], leaves: Sequence[Any], paths: Sequence[str], held: Sequence[Any]
) -> None:
    """Refuse a call passing a tensor the program also reads from Python state (``x is G``,
    ``x + G`` for a global ``G``): capture traces the input and the held tensor as two."""
    for i in tensors:
        if any(map(operator.is_, held, repeat(leaves[i]))):
            raise GraphCaptureError(
                "inputs",
                f"input {paths[i]} is a tensor the program also reads from Python state (a "
                "global, a closure or a plain attribute holds it), which capture would trace "
                "as two tensors: read it through the argument only, or pass a copy",
                kind="limitation",
            )
