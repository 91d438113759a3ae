"""The fingerprint of an ``nn.Module`` tree (:func:`module_fingerprint`): every submodule's path,
class and attributes, and its classes' bases, attributes and methods
(:mod:`plait.snapshots.fingerprint` describes each value). A set is described in sorted order; the
order it iterates in is collected aside where a :func:`plait.snapshots.set_order.collecting` is
active (the snapshot's front key collects it).

Example:
    >>> import torch
    >>> fp = module_fingerprint(torch.nn.Linear(2, 3))
    >>> fp[0]["class"], fp[0]["attrs"]["in_features"]
    ('torch.nn.modules.linear.Linear', ['int', '2'])
"""

from __future__ import annotations

import types
from typing import Any

from torch import nn

from plait.snapshots.fingerprint import Unpinnable, _class_fp, _fp, _qualified
from plait.snapshots.set_order import gate

_TABLES = ("_parameters", "_buffers", "_modules", "training", "_non_persistent_buffers_set")
# NOTE: PyTorch's hook tables, by the names this version gives them in every module
_HOOK_TABLES = frozenset(k for k in nn.Module().__dict__ if "hook" in k)


def _hooks(name: str, value: Any, what: str) -> None:
    """Forward and backward hooks run inside the program: a module that has any is captured."""
    if "state_dict" in name or not value:
        return
    raise Unpinnable(f"{what} has hooks ({name}): they run inside the program")


def module_fingerprint(module: nn.Module) -> list[dict[str, Any]]:
    """Every submodule's path, class and attributes, and its classes' bases, attributes and
    methods; raises :class:`Unpinnable` (hooks, tensor attributes, objects without a
    fingerprint, a class that is not the one its module defines now)."""
    for name in dir(nn.modules.module):
        table = getattr(nn.modules.module, name)
        # NOTE: the tables only: _global_is_full_backward_hook is a flag that stays set after
        # the last global full backward hook is removed
        if name.startswith("_global_") and "hook" in name and isinstance(table, dict):
            _hooks(name, table, "torch.nn (global)")
    out = []
    memo: dict[int, Any] = {}
    classes: dict[type, Any] = {}
    for path, m in module.named_modules():
        where = f"self.{path}" if path else "self"
        attrs: dict[str, Any] = {}
        for key, value in vars(m).items():
            if key in _TABLES:
                continue
            if key in _HOOK_TABLES:
                _hooks(key, value, where)
                continue
            what = f"{where}.{key}"
            with gate(key, reset=True):  # NOTE: code reaches it by its name
                if isinstance(value, types.MethodType) and value.__self__ is m:
                    # NOTE: a method set on the instance (`model.forward = MethodType(f, model)`)
                    attrs[key] = ["method of self", _fp(value.__func__, what, memo, 0)]
                else:
                    attrs[key] = _fp(value, what, memo, 0)
        cls = type(m)
        if cls not in classes:
            contents = _class_fp(cls, f"{where}'s class", memo, 0)
            classes[cls] = contents[2] if len(contents) > 2 else []
        out.append(
            {
                "path": path,
                "class": _qualified(cls),
                "attrs": dict(sorted(attrs.items())),
                "class_attrs": classes[cls],
            }
        )
    return out
