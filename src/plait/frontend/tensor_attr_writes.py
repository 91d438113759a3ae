"""Python attributes the program sets on tensors (``x.seen = True``, ``self.weight.flag = 1``,
``y = x * 2; y.tag = "a"; return y``), set again after each compiled call.

Capture runs the program on tracers: an attribute it sets lands in the tracer's own instance
dict (plait's fields are slots), never on the caller's tensor. As Dynamo replays side effects,
each attribute the program leaves set on a tensor whose object outlives the call is written
again after every compiled call (:meth:`plait.frontend.program.CapturedProgram.run`), on that
call's own objects:

- an input tensor of the call (``("user", leaf)``), a parameter or buffer of the module
  (``("state", entry)``: the tensor its slot holds at that call) or a tensor the program
  reads of its environment (``("const", tensor)``): the attributes its tracer holds when the
  program returns (an input's write through ``vars(x)``/``x.__dict__`` too: its dict is then
  guarded empty, :mod:`plait.frontend.tensor_attrs`);
- a tensor the program returns (``("output", k)``: the ``k``-th leaf of the output, or of an
  input container the program writes back): the attributes its tracer holds.

A tensor an op returns as itself in eager (``x.contiguous()``, ``x.to(x.dtype)``: a tracer of
its own in capture) shares its input's dict (:func:`same_tensor`), so a write through it is a
write to the input, as in eager. A tensor the program makes and does not return (an
intermediate) is gone after the call in eager too: its attributes are nobody's.

Reads stay sound: the program reads its own write from the tracer's dict, which the compiled
call writes again (``x.n = 1; return x * x.n`` returns ``x * 1`` whatever ``x.n`` held
before, as eager does); a read of an attribute the caller's tensor holds is guarded or refused
as :mod:`plait.frontend.tensor_attrs` says (a later call finding the attribute the previous
call set recompiles where the program read it first).

What a compiled call cannot set again is the loud eager fallback
(:class:`~plait.errors.GraphCaptureError`, ``kind="limitation"``, warned): a value that is not
a constant (a tensor, a list, an object: a compiled call would set the same object on every
call; the constants are ``None``, bools, ints, floats, complex numbers, strings, bytes,
``torch.dtype``/``device``/``layout``/``memory_format`` and tuples or ``torch.Size`` of them, a
size read from a shape specialized), ``del x.attr`` and ``x.__dict__ = ...`` on an input,
parameter, buffer or constant tensor (eager removes attributes of the caller's tensor that
capture never saw), an attribute of a parameter, buffer or constant the program read (its
value guarded) and sets to another value (``self.w.calls = getattr(self.w, "calls", 0) + 1``,
or a write through ``vars(self.w)``: every later call would capture again, so it is refused as
a module attribute the program reads and changes is), and a call in which a tensor whose
attributes the program sets is also another of its tensors (``f(x, x)``, ``m(m.weight)``:
capture traced them as two; guarded for later calls by :func:`distinct_guard`).

Example:
    >>> import torch, plait
    >>> def g(x):
    ...     x.seen = True
    ...     return x * 2
    >>> f = plait.compile(g, options={"cache": False})
    >>> x = torch.ones(2)
    >>> _ = f(x)
    >>> x.seen
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from plait.errors import GraphCaptureError
from plait.frontend.capture_values import INSTANCE_DICT, CaptureValues, Tracer
from plait.frontend.symints import TracedInt, TracedSize
from plait.frontend.tensor_attrs import _WHAT, lifted
from plait.guards.guard import Guard

if TYPE_CHECKING:
    from plait.frontend.capture_values import Lift

# NOTE: values a compiled call may set again on each call (immutable, no identity of their own
# that eager's would lack)
_CONSTANTS = frozenset(
    {type(None), bool, int, float, complex, str, bytes}
    | {torch.dtype, torch.device, torch.layout, torch.memory_format}
)
_NOT_CONSTANT = object()
_SLOTS = frozenset(Tracer.__slots__)
# NOTE: one attribute write: (where, ref, ((name, value), ...)), where "user" (ref: leaf),
# "state" (entry), "const" (the tensor) or "output" (the output's leaf position)
AttrWrite = tuple[str, Any, tuple[tuple[str, Any], ...]]


def same_tensor(made: Tracer, inputs: Sequence[Tracer], out: torch.Tensor) -> None:
    """``made`` (the tracer of ``out``) shares the dict of the input whose sample eager
    returned as it is (``x.contiguous()`` is ``x``): an attribute set through either is set
    on the one tensor eager has."""
    for s in inputs:
        if s._plain is out:
            INSTANCE_DICT.__set__(made, INSTANCE_DICT.__get__(s))
            return


def _refuse(tracer: Tracer, how: str) -> bool:
    """Raises where ``how`` (a deletion, a dict replaced) is done to a tensor of the caller's
    (an input, parameter, buffer or constant) while its capture runs; True where the call
    goes on eagerly (:mod:`plait.frontend.continuation`) and ``tracer`` stands for the
    caller's tensor, else False (a tensor the program makes: its own dict, as in eager)."""
    lift = lifted(tracer)
    cx = CaptureValues.active
    if lift is None or cx is None or cx is not tracer._cx:
        return False
    if cx.continued:
        return True
    cx.current = "the program's tensor attributes"
    what = f"{_WHAT.get(lift.kind, 'tensor')} {lift.name}"
    cx.limitation(
        f"the program {how} of {what}: eager changes the caller's tensor, whose other Python "
        "attributes capture never saw, which a compiled call could not do again"
    )


def delete_attribute(tracer: Tracer, name: str) -> None:
    """``del tracer.name`` (``Tracer.__delattr__``): refused on a tensor of the caller's (see
    the module doc), eager's own where the call goes on eagerly."""
    if name not in _SLOTS:
        _refuse(tracer, f"deletes the Python attribute {name!r}")
    object.__delattr__(tracer, name)  # NOTE: gone on eagerly, its dict is the caller's


def replace_attributes(tracer: Tracer, value: dict[str, Any]) -> None:
    """``tracer.__dict__ = value``: refused on a tensor of the caller's (see the module doc)."""
    if _refuse(tracer, "replaces the Python attributes (__dict__)"):
        INSTANCE_DICT.__set__(tracer._plain, value)  # NOTE: the call goes on eagerly
    INSTANCE_DICT.__set__(tracer, value)


def continued(tracer: Tracer) -> None:
    """The call goes on eagerly (:mod:`plait.frontend.continuation`) and ``tracer``'s sample
    is eager's tensor: the attributes set so far move to it, and both share one dict from
    now (an attribute set, read or deleted later is eager's)."""
    own = INSTANCE_DICT.__get__(tracer)
    target = INSTANCE_DICT.__get__(tracer._plain)
    if own is not target:
        target.update(own)
        INSTANCE_DICT.__set__(tracer, target)


def _constant(cx: Any, value: Any) -> Any:
    """``value`` as a compiled call sets it again, or ``_NOT_CONSTANT``; a size read from a
    shape is specialized (a symbolic one restarts the capture with it static)."""
    kind = type(value)
    if kind in _CONSTANTS:
        return value
    if kind is TracedInt:
        expr = value.expr
        if expr is not None and getattr(expr, "free_symbols", set()) & set(cx.unbacked):
            return _NOT_CONSTANT  # NOTE: a size the data decides (nonzero's row count)
        return cx.int(value)
    if kind in (tuple, torch.Size, TracedSize):
        items = [_constant(cx, v) for v in value]
        if any(v is _NOT_CONSTANT for v in items):
            return _NOT_CONSTANT
        return tuple(items) if kind is tuple else torch.Size(items)
    return _NOT_CONSTANT


def _items(cx: Any, own: dict[str, Any], what: str) -> tuple[tuple[str, Any], ...]:
    out = []
    for name, value in list(own.items()):
        v = _constant(cx, value)
        if v is _NOT_CONSTANT:
            cx.current = "the program's tensor attributes"
            cx.limitation(
                f"the program sets the Python attribute {name!r} of {what} to a "
                f"{type(value).__name__} (not a constant: None, a bool, int, float, str, a tuple "
                "of them, a dtype or device), which a compiled call could not set again on each "
                "call's tensor"
            )
        out.append((name, v))
    return tuple(out)


def _refuse_changed_reads(
    cx: Any, origin: torch.Tensor, items: tuple[tuple[str, Any], ...], what: str
) -> None:
    """A parameter's, buffer's or constant's attribute the program read (guarded by value:
    :mod:`plait.frontend.tensor_attrs`) and sets to another value (``self.w.n = getattr(self.w,
    "n", 0) + 1``) is refused, as a module attribute it reads and changes is
    (:mod:`plait.frontend.pyreads`): the next call would fail the guard and capture again, and
    so on for every call."""
    roots = cx.reads.roots if cx.reads is not None else {}
    namespace = INSTANCE_DICT.__get__(origin)
    whole = ("tensordict", id(namespace)) in roots  # NOTE: vars() read: guarded by contents
    for name, value in items:
        if not whole and ("item", id(namespace), name) not in roots:
            continue
        old = namespace.get(name, _NOT_CONSTANT)
        if old is value or (type(old) is type(value) and old == value):
            continue
        cx.current = "the program's tensor attributes"
        cx.limitation(
            f"the program changes the Python attribute {name!r} of {what}, which it read: a "
            "compiled call would capture the program again on every call (keep the value in "
            "the caller's code, or pass it as an argument)"
        )


def _where(lift: Lift) -> tuple[str, Any] | None:
    if lift.kind == "user":
        return ("user", lift.ref)
    if lift.kind in ("param", "buffer"):
        return ("state", lift.ref)
    if lift.kind == "const" and lift.origin is not None:
        return ("const", lift.ref)
    return None  # NOTE: a tensor the program makes (torch.tensor): as an output, if returned


def recorded(cx: Any, raw: Sequence[Any]) -> tuple[list[AttrWrite], list[tuple[str, Any]]]:
    """The attribute writes a compiled call makes again (see the module doc), and the
    caller's tensors among their targets (for :func:`distinct_guard`); ``raw``: the output's
    leaves, as capture returned them."""
    writes: list[AttrWrite] = []
    targets: list[tuple[str, Any]] = []
    dicts: set[int] = set()
    for lift in cx.lifts:
        where = _where(lift)
        if where is None or lift.attrs is None:
            continue
        dicts.add(id(lift.attrs))
        if lift.attrs:
            what = f"{_WHAT.get(lift.kind, 'tensor')} {lift.name}"
            items = _items(cx, lift.attrs, what)
            if where[0] != "user":
                _refuse_changed_reads(cx, lift.origin, items, what)
            writes.append((*where, items))
            targets.append(where)
    for k, leaf in enumerate(raw):
        if type(leaf) is not Tracer:
            continue
        own = INSTANCE_DICT.__get__(leaf)
        if own and id(own) not in dicts:  # NOTE: not an input returned as it is
            writes.append(("output", k, _items(cx, own, f"the output's tensor {k}")))
    return writes, targets


def _objects(
    targets: Sequence[tuple[str, Any]], leaves: Sequence[Any], state: Sequence[Any]
) -> list[Any]:
    out = []
    for where, ref in targets:
        out.append(leaves[ref] if where == "user" else state[ref] if where == "state" else ref)
    return out


def _apart(
    targets: Sequence[tuple[str, Any]],
    leaves: Sequence[Any],
    state: Sequence[Any],
    consts: Sequence[Any],
) -> bool:
    """No tensor whose attributes the program sets is also a constant the program read: the
    call's input tensors and state tensors are traced one tracer per object (an input passed
    twice, a parameter passed as an input: :mod:`plait.frontend.lifting`), a constant through
    one of its own."""
    counts = {id(t): 1 for t in [*leaves, *state] if isinstance(t, torch.Tensor)}
    for t in consts:
        if isinstance(t, torch.Tensor):
            counts[id(t)] = counts.get(id(t), 0) + 1
    return all(counts.get(id(t), 0) <= 1 for t in _objects(targets, leaves, state))


def distinct_guard(
    targets: Sequence[tuple[str, Any]],
    leaves: Sequence[Any],
    state: Sequence[Any],
    consts: Sequence[Any],
) -> Guard:
    """The tensors whose attributes the program sets are no constant it read too (a global
    tensor passed as an input): capture traced such a tensor as two, each with attributes of
    its own, where eager sets and reads one. Refused at capture."""
    consts = list(consts)
    if not _apart(targets, leaves, state, consts):
        raise GraphCaptureError(
            "inputs",
            "the program sets a Python attribute of a tensor that it also reads as a constant "
            "(a global, a closure, an attribute that is not a parameter or buffer): pass the "
            "tensor as an argument only",
            kind="limitation",
        )
    return Guard(
        "alias",
        "tensor attributes",
        "the tensors whose Python attributes the program sets are no constant it reads",
        True,
        lambda env: _apart(targets, env.leaves, env.state, consts),
    )


__all__ = [
    "AttrWrite",
    "continued",
    "delete_attribute",
    "distinct_guard",
    "recorded",
    "replace_attributes",
    "same_tensor",
]
