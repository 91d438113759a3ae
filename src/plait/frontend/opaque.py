"""Calls with no table entry: an ``opaque`` node that PyTorch runs, or a capture error.

Under ``fullgraph=True`` a call with no rule is a :class:`GraphCaptureError`. Otherwise it becomes
an ``opaque`` node (counted; the compiled callable reports the counts) when the IR can express
it: positional tensor arguments only, tensor outputs, static shapes, no mutation of its inputs,
and a ``torch.*`` name the IR can resolve. Anything else is a capture error (``plait.compile``
then runs the program eagerly, recorded and with a warning).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import resolve_name

from plait.frontend.writes import write_targets
from plait.ir.ops.extern import resolve_target

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

_HINT = (
    "plait.compile(fullgraph=False) runs a call with no capture rule as an 'opaque' node that "
    "PyTorch executes (counted and reported), when the IR can express it."
)


def _target(func: Any) -> str | None:
    name = resolve_name(func)
    if name is None:
        return None
    try:
        resolve_target(name)
    except Exception:
        return None
    return name


def _why_not(cx: CaptureContext, func: Any, args: tuple, kwargs: dict) -> str | None:
    if kwargs:
        return f"it takes keyword arguments ({', '.join(kwargs)})"
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        return "the IR's opaque node passes tensor arguments only"
    if cx.dynamic:
        return "opaque nodes need static shapes (dynamic=True)"
    if _target(func) is None:
        return "it has no torch.* name the IR can resolve"
    return None


def run_opaque(cx: CaptureContext, func: Any, args: tuple, kwargs: dict) -> Any:
    name = cx.current
    if cx.fullgraph:
        cx.fail("unsupported", f"no capture rule maps {name} to plait's IR", _HINT)
    why = _why_not(cx, func, args, kwargs)
    if why is not None:
        cx.fail(
            "unsupported",
            f"no capture rule maps {name} to plait's IR, and it cannot be an opaque node: {why}",
        )
    tracers = [cx.tracer(a) for a in args]
    cx.check_writable(write_targets(name, func, args, kwargs))
    versions = [t._plain._version for t in tracers]
    out, _ = cx.sample(func, args, kwargs)
    if [t._plain._version for t in tracers] != versions:
        cx.fail("unsupported", f"{name} updates its inputs in place; an opaque node cannot")
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        cx.fail(
            "unsupported", f"{name} returns {type(out).__name__}; an opaque node returns tensors"
        )
    types = [cx.type_of_plain(o) for o in outs]
    target = _target(func)
    values = cx.call(
        "opaque",
        [cx.value(t) for t in tracers],
        target=target,
        out_types="; ".join(str(t) for t in types),
    )
    cx.opaque_counts[str(target)] += 1
    grad = cx.grad_enabled and any(t._rg for t in tracers)
    wrapped = [cx.new_output(v, o, tracers, grad) for v, o in zip(values, outs)]
    for w in wrapped:
        if w._root is not None:
            w._steps = None  # NOTE: an alias the IR cannot describe: never replayed or written
    if isinstance(out, (tuple, list)):
        return type(out)(*wrapped) if hasattr(type(out), "_fields") else type(out)(wrapped)
    return wrapped[0]
