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
(the tracer's own instance dict).

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
from plait.frontend.pyvalues import ABSENT, item_root

_WHAT = {"param": "parameter", "buffer": "buffer", "const": "constant tensor", "user": "input"}


def missing_attribute(tracer: Any, name: str) -> tuple[Any, str | None]:
    """What ``getattr(tracer, name)`` finds on the caller's tensor behind ``tracer`` (see the
    module doc), and None; or None and the name of the class that lacks it (the caller raises
    ``AttributeError``, in its ``__getattr__``)."""
    own = object.__getattribute__(tracer, "__dict__")
    lift = own.get("_lift")
    origin = getattr(lift, "origin", None)
    if name.startswith("__") or origin is None or own.get("_root") is not None:
        return None, type(tracer).__name__
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
        own["_cx"].absent_attrs.add((lift.ref, name))
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


__all__ = ["missing_attribute"]
