"""Python attributes set on a tensor the program reads (``self.weight.gain = 2.0``,
``getattr(self.weight, "quant_scale", 1.0)``).

Capture runs the program on tracers, not on the caller's tensors: a parameter, a buffer, an
input or a constant is a :class:`~plait.frontend.capture_values.Tracer` of its own, whose
instance dict is empty. A read of an attribute the caller set on the tensor would raise
``AttributeError`` where eager finds it, or, through ``getattr`` with a default or
``hasattr``, bake the default into the graph. The tracer's ``__getattr__`` (called only where
ordinary lookup fails) answers from the caller's tensor instead:

- a parameter, buffer or constant tensor (the same object on every call): the value found in
  its instance dict, or its absence, is a root of the Python values guard (by value, as any
  value the program reads: :mod:`plait.frontend.pyvalues`), so setting, changing or deleting
  the attribute recompiles; so does a parameter or buffer replaced by another tensor (the
  module's slot is a root too, by the tensor it holds);
- an input tensor (a new object on each call): an attribute it holds cannot be guarded, so the
  capture is refused (``GraphCaptureError(kind="limitation")``: the loud eager fallback); one it
  lacks raises ``AttributeError`` as in eager, and the guards then require the call's tensor
  to lack it too (a later call's input that holds it recompiles, and is refused).

Views and tensors the program makes are the program's own: their attributes are as in eager
(the tracer's own instance dict, which holds none of plait's fields: those are slots).

The whole dict, ``vars(t)`` or ``t.__dict__`` (:func:`attribute_dict`), is read the same way:
an input tensor's holds nothing, guarded (a later call's input that holds an attribute
recompiles, and is refused), or the capture is refused; a parameter's, buffer's or constant's
is a root of the Python values guard by its contents, and the program gets a copy whose writes
are refused (eager's would set the tensor's attributes, which the compiled program would not).

Example:
    >>> import torch, plait
    >>> lin = torch.nn.Linear(2, 2)
    >>> lin.weight.gain = 3.0
    >>> class Scaled(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.lin = lin
    ...     def forward(self, x):
    ...         return self.lin(x) * getattr(self.lin.weight, "gain", 1.0)
    >>> m = Scaled()
    >>> f = plait.compile(m, options={"cache": False})
    >>> x = torch.ones(1, 2)
    >>> bool((f(x) == m(x)).all())
    True
    >>> lin.weight.gain = 5.0
    >>> bool((f(x) == m(x)).all()), len(f.specializations)
    (True, 2)
"""

from __future__ import annotations

from typing import Any

from plait.errors import GraphCaptureError
from plait.frontend.attr_reads import _LOCAL
from plait.frontend.capture_values import INSTANCE_DICT, CaptureValues
from plait.frontend.pyvalues import ABSENT, item_root, tensor_dict_root

_WHAT = {"param": "parameter", "buffer": "buffer", "const": "constant tensor", "user": "input"}
# NOTE: the name an input's absence read is recorded under when the program read its whole
# dict: the input holds no attribute at all (guard_build.input_attrs_guard)
ANY_ATTRIBUTE = "__dict__"


def lifted(tracer: Any) -> Any:
    """The lift of the caller's tensor behind ``tracer`` (a root lifted from one, or a tensor
    an op returned as that root itself: ``x.contiguous()`` is ``x`` in eager), or None.
    NOTE: slots read past ``Tracer.__getattr__`` (a slot not set yet raises)."""
    get = object.__getattribute__
    try:
        lift, root = get(tracer, "_lift"), get(tracer, "_root")
        if root is not None and get(tracer, "_plain") is get(root, "_plain"):
            lift, root = get(root, "_lift"), get(root, "_root")
    except AttributeError:
        return None
    return lift if root is None and getattr(lift, "origin", None) is not None else None


def missing_attribute(tracer: Any, name: str) -> tuple[Any, str | None]:
    """What ``getattr(tracer, name)`` finds on the caller's tensor behind ``tracer`` (see the
    module doc), and None; or None and the name of the class that lacks it (the caller raises
    ``AttributeError``, in its ``__getattr__``)."""
    lift = lifted(tracer)
    if name.startswith("__") or lift is None:
        return None, type(tracer).__name__
    origin = lift.origin
    namespace = object.__getattribute__(origin, "__dict__")
    found = namespace.get(name, ABSENT)
    what = f"{_WHAT.get(lift.kind, 'tensor')} {lift.name}"
    if lift.kind == "user":
        if found is not ABSENT:
            raise GraphCaptureError(
                "Python state",
                f"the program reads the Python attribute {name!r} set on {what}: an "
                "argument is a new tensor on each call, whose attributes the compiled program "
                "cannot guard; pass the value as an argument",
                kind="limitation",
            )
        # NOTE: eager raises AttributeError too; a later call's input that holds it must not
        # reuse this graph (the capture's absence read is guarded: guard_build.input_attrs_guard)
        tracer._cx.absent_attrs.add((lift.ref, name))
    else:
        rec = getattr(_LOCAL, "rec", None)
        if rec is not None:
            show = f"the attribute {name} of {what}"
            desc = None if lift.kind == "const" else ["tensorattr", lift.name, name]
            rec._add(("item", id(namespace), name), item_root(namespace, name, show, desc))
            rec._alive.append(origin)
            if lift.kind != "const":
                _slot_read(rec, lift.name, "_parameters" if lift.kind == "param" else "_buffers")
    if found is ABSENT:
        return None, type(origin).__name__
    return found, None


def attribute_dict(tracer: Any) -> dict[str, Any]:
    """``vars(tracer)`` and ``tracer.__dict__`` as eager's tensor answers them (see the module
    doc): the tracer's own instance dict, or for a tensor of the caller's, what it holds."""
    own: dict[str, Any] = INSTANCE_DICT.__get__(tracer)
    lift = lifted(tracer)
    if lift is None:
        return own
    origin = lift.origin
    namespace = object.__getattribute__(origin, "__dict__")
    cx = CaptureValues.active
    if cx is None or cx is not tracer._cx:
        return own  # NOTE: a tracer kept past its capture: no capture reads this
    if cx.continued:
        return namespace  # NOTE: the call goes on eagerly (frontend.continuation): eager's own
    what = f"{_WHAT.get(lift.kind, 'tensor')} {lift.name}"
    if lift.kind == "user":
        if namespace:
            raise GraphCaptureError(
                "Python state",
                f"the program reads the Python attributes of {what} (vars() or __dict__), "
                f"which holds {', '.join(map(repr, list(namespace)[:3]))}: an argument is a new "
                "tensor on each call, whose attributes the compiled program cannot guard; pass "
                "the values as arguments",
                kind="limitation",
            )
        # NOTE: as eager's, empty; a later call's input that holds an attribute must not reuse
        # this graph (the capture's read is guarded: guard_build.input_attrs_guard)
        cx.absent_attrs.add((lift.ref, ANY_ATTRIBUTE))
        return own
    rec = getattr(_LOCAL, "rec", None)
    if rec is not None:
        show = f"the attributes of {what}"
        desc = None if lift.kind == "const" else ["tensordict", lift.name]
        rec._add(("tensordict", id(namespace)), tensor_dict_root(namespace, show, desc))
        rec._alive.append(origin)
        if lift.kind != "const":
            _slot_read(rec, lift.name, "_parameters" if lift.kind == "param" else "_buffers")
    if not namespace:
        return own
    return _AttributesCopy({**namespace, **own})


class _AttributesCopy(dict):
    """A copy of the Python attributes of a parameter, buffer or constant tensor: a write to it
    would not reach the tensor (eager's would), so it is refused (the loud eager fallback)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise GraphCaptureError(
            "Python state",
            "the program writes the Python attributes of a parameter, buffer or constant tensor "
            "through vars() or __dict__, which the compiled program would not do on each call",
            kind="limitation",
        )

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse


def _slot_read(rec: Any, path: str, table: str) -> None:
    """The slot a parameter or buffer whose attribute the program read is held in, by the
    tensor it holds: a tensor set there in its place (``m.w = nn.Parameter(...)``, whose
    attributes are the ones eager reads) recompiles. Keyed when the capture ends (the slot
    holds a tracer while it runs)."""
    owner, _, leaf = path.rpartition(".")
    for m in rec.tree:
        if rec.paths.get(id(m)) == owner:
            slots = object.__getattribute__(m, "__dict__")[table]
            where = f"self.{path}" if path else "self"
            desc = ["table", owner, table, leaf]
            rec._add(("item", id(slots), leaf), item_root(slots, leaf, where, desc), late=True)
            return


__all__ = ["ANY_ATTRIBUTE", "attribute_dict", "lifted", "missing_attribute"]
