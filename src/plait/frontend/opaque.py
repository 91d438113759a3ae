"""Calls with no table entry: an ``opaque`` node that PyTorch runs, or a capture error.

Under ``fullgraph=True`` a call with no rule is a :class:`GraphCaptureError`. Otherwise it becomes
an ``opaque`` node (counted; the compiled callable reports the counts) when the IR can express
it: at least one tensor argument, tensor outputs, static shapes, no mutation of its inputs, a
``torch.*`` name the IR can resolve, and every other argument a *literal* the node can carry.
Anything else is a capture error (``plait.compile`` then runs the program eagerly, recorded and
with a warning).

Literals travel as JSON (the node's ``literals``/``kwliterals`` attributes): the call's
positional arguments with ``{"t": i}`` for tensor operand ``i``, and its keyword arguments.

NOTE: a literal is accepted only when JSON gives back exactly the same value: bool, int, str,
None, floats whose bits survive (``inf`` and the default ``nan`` do, ``-nan`` does not), and
lists of those; tuples too for builtin torch functions, whose argument parser takes a list
wherever it takes a tuple. Dicts (``{"t": i}`` is the operand marker), ``torch.dtype``,
devices and other objects have no encoding the IR decodes, so they are refused.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> prog = capture_program(lambda x: x.cumsum(0), (torch.ones(3),), fullgraph=False)
    >>> [(n.op, n.attrs["literals"]) for n in prog.graph.nodes]
    [('opaque', '[{"t": 0}, 0]')]
"""

from __future__ import annotations

import json
import struct
import types
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import resolve_name

from plait.frontend.pytree import is_named_sequence, same_type
from plait.frontend.symints import TracedInt, TracedSize
from plait.frontend.writes import write_targets
from plait.ir.ops.extern import resolve_target

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

_HINT = (
    "plait.compile(fullgraph=False) runs a call with no capture rule as an 'opaque' node that "
    "PyTorch executes (counted and reported), when the IR can express it."
)
# NOTE: C functions: PyTorch's argument parser treats a list and a tuple alike.
_BUILTIN = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)


class _NotLiteral(Exception):
    """An argument the opaque node cannot carry; the message says which and why."""


def _target(func: Any) -> str | None:
    name = resolve_name(func)
    if name is None:
        return None
    try:
        resolve_target(name)
    except Exception:
        return None
    return name


def _encode(x: Any, tensors: list[Any], tuples_ok: bool, typed: list[str] | None = None) -> Any:
    """``x`` as JSON data; tensors become ``{"t": i}`` (appended to ``tensors``). Dtypes and
    devices are encoded too (``{"dtype": name}``), named in ``typed``: only a random call
    (``random_call``/``random_factory``) decodes them."""
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return {"t": len(tensors) - 1}
    if isinstance(x, torch.Generator):
        raise _NotLiteral(
            "a Generator argument has no JSON encoding the IR decodes (plait replays the "
            "global random number generator only)"
        )
    if typed is not None and isinstance(x, torch.dtype):
        typed.append("dtype")
        return {"dtype": str(x).removeprefix("torch.")}
    if typed is not None and isinstance(x, torch.device):
        typed.append("device")
        return {"device": str(x)}
    if isinstance(x, TracedInt):
        return int.__int__(x)  # NOTE: opaque nodes are static-only: the size is type-guarded
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        back = json.loads(json.dumps(x))
        if struct.pack("<d", back) != struct.pack("<d", x):
            raise _NotLiteral(f"the float {x!r} does not survive a JSON round trip")
        return x
    if (type(x) in (tuple, torch.Size, TracedSize) or is_named_sequence(x)) and not tuples_ok:
        raise _NotLiteral("a tuple argument to a Python function would come back as a list")
    if type(x) in (list, tuple, torch.Size, TracedSize) or is_named_sequence(x):
        return [_encode(v, tensors, tuples_ok, typed) for v in x]
    raise _NotLiteral(f"a {type(x).__name__} argument has no JSON encoding the IR decodes")


def _call_spec(
    func: Any, args: tuple, kwargs: dict, typed: list[str] | None = None
) -> tuple[list[Any], dict[str, str]]:
    """The tensor operands and the node's ``literals``/``kwliterals`` attributes (left out when
    the call is tensors only, in order). ``typed`` (a list): dtypes and devices are encoded and
    named there."""
    tensors: list[Any] = []
    tuples_ok = isinstance(func, _BUILTIN)
    positional = [_encode(a, tensors, tuples_ok, typed) for a in args]
    in_keywords: list[Any] = []
    keywords = {k: _encode(v, in_keywords, tuples_ok, typed) for k, v in kwargs.items()}
    if in_keywords:
        raise _NotLiteral("a tensor keyword argument (the node passes literal keywords only)")
    attrs: dict[str, str] = {}
    if positional != [{"t": i} for i in range(len(tensors))]:
        attrs["literals"] = json.dumps(positional)
    if keywords:
        attrs["kwliterals"] = json.dumps(keywords)
    return tensors, attrs


def _why_not(cx: CaptureContext, func: Any) -> str | None:
    if cx.dynamic:
        return "opaque nodes need static shapes (dynamic=True)"
    if _target(func) is None:
        return "it has no torch.* name the IR can resolve"
    return None


def run_opaque(cx: CaptureContext, func: Any, args: tuple, kwargs: dict) -> Any:
    name = cx.current
    if cx.fullgraph:
        cx.fail("unsupported", f"no capture rule maps {name} to plait's IR", _HINT)
    why = _why_not(cx, func)
    typed: list[str] = []
    try:
        operands, literal_attrs = _call_spec(func, args, kwargs, typed)
    except _NotLiteral as exc:
        why = why or str(exc)
    if why is not None:
        cx.fail(
            "unsupported",
            f"no capture rule maps {name} to plait's IR, and it cannot be an opaque node: {why}",
        )
    tracers = [cx.tracer(a) for a in operands]
    cx.check_writable(write_targets(name, func, args, kwargs))
    versions = [t._plain._version for t in tracers]
    out, _ = cx.sample(func, args, kwargs)
    if [t._plain._version for t in tracers] != versions:
        cx.fail("unsupported", f"{name} updates its inputs in place; an opaque node cannot")
    # NOTE: a call that moved the generator is random: a random node, run in program order
    random = cx.rng.draws()
    if not random and not tracers:
        cx.fail("unsupported", f"{name} has no tensor argument; an opaque node needs one")
    if not random and typed:
        cx.fail(
            "unsupported",
            f"no capture rule maps {name} to plait's IR, and it cannot be an opaque node: "
            f"a {typed[0]} argument has no JSON encoding the IR decodes",
        )
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        cx.fail(
            "unsupported", f"{name} returns {type(out).__name__}; an opaque node returns tensors"
        )
    out_types = [cx.type_of_plain(o) for o in outs]
    target = _target(func)
    spelled = {"target": target, "out_types": "; ".join(str(t) for t in out_types)}
    if random and not tracers:
        values = cx.call("random_factory", **spelled, **literal_attrs)
    else:
        op = "random_call" if random else "opaque"
        values = cx.call(op, [cx.value(t) for t in tracers], **spelled, **literal_attrs)
    cx.opaque_counts[str(target)] += 1
    grad = cx.grad_enabled and any(t._rg for t in tracers)
    wrapped = [cx.new_output(v, o, tracers, grad) for v, o in zip(values, outs)]
    for w in wrapped:
        if w._root is not None:
            w._steps = None  # NOTE: an alias the IR cannot describe: never replayed or written
    if isinstance(out, (tuple, list)):
        return same_type(out, wrapped)
    return wrapped[0]
