"""Capture without compiling (:func:`capture`, public as ``plait.capture``); the announcement of
what a capture could not express (a fallback, opaque nodes: :func:`report_fallbacks`, never
silent); the check of a call's argument kinds against the captured ones (:func:`check_kinds`);
and the process-wide capture lock every miss path holds."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.errors import CaptureFallbackWarning, CompiledInputError
from plait.frontend import CapturedProgram, capture_program
from plait.frontend.dynamic_dims import DynamicSpec
from plait.guards.guard import GuardEnv, GuardSet
from plait.ir import Graph

# NOTE: capture's context is process-wide (the frontend's active capture and guard sinks), so
# captures never overlap: every miss path (capture, compile, the specialization table) holds
# this lock first, then its callable's own lock; steady-state calls take neither.
CAPTURE_LOCK = threading.RLock()


@dataclass
class Captured:
    """One captured program: ``graph`` (plait IR), ``guards`` (what its behaviour depended
    on; ``print(captured.guards)``) and ``semantic_hash`` (minted here, once). A program that
    fell back (``fullgraph=False``) has ``graph is None`` and ``fallback_reason`` set."""

    graph: Graph | None
    guards: GuardSet
    semantic_hash: str | None
    fallback_reason: str | None = None
    opaque_counts: dict[str, int] = field(default_factory=dict)
    program: CapturedProgram | None = field(default=None, repr=False)


def _as_args(args: Any) -> tuple:
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)


def capture(
    fn: Callable[..., Any],
    args: Any,
    kwargs: dict | None = None,
    *,
    fullgraph: bool = True,
    dynamic: DynamicSpec = None,
) -> Captured:
    """Capture ``fn(*args, **kwargs)`` (``fn`` an ``nn.Module`` or a function) into plait IR.
    ``dynamic``: which input dims are symbolic (:mod:`plait.frontend.dynamic_dims`; ``None``
    and ``False``: none, ``True``: all, or a mapping such as ``{"x": {0: "batch"}}``).

    Example:
        >>> import torch, plait
        >>> c = plait.capture(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> [v.name for v in c.graph.inputs]
        ['input', 'weight', 'bias']
        >>> len(c.semantic_hash)
        64
    """
    with CAPTURE_LOCK:
        prog = capture_program(fn, _as_args(args), kwargs, fullgraph=fullgraph, dynamic=dynamic)
    report_fallbacks(prog, stacklevel=3)
    return Captured(
        prog.graph,
        prog.guards,
        prog.semantic_hash,
        prog.fallback_reason,
        dict(prog.opaque_counts),
        prog,
    )


def report_fallbacks(
    prog: CapturedProgram, stacklevel: int, region: str | None = None, tree: Any = None
) -> None:
    """NOTE: never a silent fallback: each fallback and each opaque node is announced once,
    when the specialization is captured. A region's warnings name it (``tree.warn``)."""
    what = "this program" if region is None else f"region {region}"
    messages = []
    if prog.fallback_reason is not None:
        messages.append(f"plait runs {what} eagerly (fallback): {prog.fallback_reason}")
    if prog.opaque_counts:
        calls = ", ".join(f"{k} x{v}" for k, v in sorted(prog.opaque_counts.items()))
        where = "" if region is None else f" in {what}"
        messages.append(f"plait runs calls with no IR op as opaque PyTorch nodes{where}: {calls}")
    for message in messages:
        if region is None:
            warnings.warn(message, CaptureFallbackWarning, stacklevel=stacklevel + 1)
        else:
            tree.warn(message)


def check_kinds(prog: CapturedProgram, env: GuardEnv, paths: list[str]) -> None:
    """A tensor where a non-tensor was captured (or the reverse) is a calling error."""
    structure = prog.guards.guards[0]
    captured_spec, kinds = structure.expected
    if env.spec != captured_spec:
        return
    for path, was, leaf in zip(paths, kinds, env.leaves):
        now = "tensor" if isinstance(leaf, torch.Tensor) else type(leaf).__name__
        if (was == "tensor") != (now == "tensor") and "NoneType" not in (was, now):
            raise CompiledInputError(
                f"argument {path!r} was a {'Tensor' if was == 'tensor' else was} when the program "
                f"was captured; got {'a Tensor' if now == 'tensor' else now}"
            )
