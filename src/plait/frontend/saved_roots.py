"""A root of the Python values guard found again from its saved description
(:func:`plait.frontend.pyvalues.saved_form`), as a warm start does: :func:`resolve`.

Example:
    >>> root = resolve(["global", "math", "pi"], None)
    >>> root.show, root.read() > 3
    ('global math.pi', True)
"""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any

from torch import nn

from plait.errors import UnknownNameError
from plait.frontend.code_origin import find_function, is_pinned
from plait.frontend.library_reads import resolve_library
from plait.frontend.pyvalues import (
    Root,
    cell_root,
    dict_root,
    environ_root,
    find_class,
    func_root,
    item_root,
    names_root,
    namespace_root,
    table_names_root,
    tensor_dict_root,
    type_root,
    typeattr_root,
)


def resolve(desc: list[Any], module: nn.Module | None) -> Root:
    """The root ``desc`` describes in this process (a warm start); raises ``LookupError``."""
    kind = desc[0]
    if kind in ("attr", "classattr", "type", "dict", "table", "tablenames"):
        if module is None:
            raise UnknownNameError("a module attribute without a module")
        m = module.get_submodule(desc[1]) if desc[1] else module
        where = f"self.{desc[1]}" if desc[1] else "self"
        if kind == "dict":
            return dict_root(m, where, desc)
        if kind == "type":
            return type_root(m, f"type({where})", desc)
        if kind == "attr":
            namespace = object.__getattribute__(m, "__dict__")
            return item_root(namespace, desc[2], f"{where}.{desc[2]}", desc)
        if kind == "tablenames":
            return table_names_root(m, desc[2], f"{where}.{desc[2]} (names)", desc)
        if kind == "table":
            slots = object.__getattribute__(m, "__dict__")[desc[2]]
            return item_root(slots, desc[3], f"{where}.{desc[3]}", desc)
        return typeattr_root(type(m), desc[2], f"{where}.{desc[2]}", desc)
    if kind == "global":
        mod = sys.modules.get(desc[1])
        if mod is None:
            raise UnknownNameError(f"module {desc[1]} is not loaded")
        show = f"global {desc[1]}.{desc[2]}"
        return namespace_root(vars(mod), desc[2], show, desc, is_pinned(desc[1]))
    if kind == "environ":
        return environ_root()
    if kind == "builtin":
        return namespace_root(vars(builtins), desc[1], f"builtin {desc[1]}", desc)
    if kind == "names":
        mod = builtins if desc[1] is None else sys.modules.get(desc[1])
        if mod is None:
            raise UnknownNameError(f"module {desc[1]} is not loaded")
        return names_root(vars(mod), f"the names of {mod.__name__}", desc)
    if kind == "func":
        fn = find_function(desc[1], desc[2])
        if fn is None:
            raise UnknownNameError(f"{desc[1]}.{desc[2]} is not loaded")
        return func_root(fn, f"{desc[1]}.{desc[2]} (code, defaults)", desc)
    if kind == "cell":
        fn = find_function(desc[1], desc[2])
        if fn is None or fn.__closure__ is None or len(fn.__closure__) <= desc[3]:
            raise UnknownNameError(f"{desc[1]}.{desc[2]} has not that closure")
        name = fn.__code__.co_freevars[desc[3]]
        root = cell_root(fn.__closure__[desc[3]], f"{desc[1]}.{desc[2]}: closure variable {name}")
        root.desc = desc
        return root
    if kind == "attrpath":
        base = resolve(desc[1], module).read()
        if isinstance(base, types.ModuleType):
            show = f"{base.__name__}.{desc[2]}"
            return namespace_root(vars(base), desc[2], show, desc, is_pinned(base.__name__))
        cls = base if isinstance(base, type) else type(base)
        return typeattr_root(cls, desc[2], f"{cls.__qualname__}.{desc[2]}", desc)
    if kind == "typeattr":
        cls = find_class(desc[1], desc[2])
        if not isinstance(cls, type):
            raise UnknownNameError(f"{desc[1]}.{desc[2]} is not loaded")
        return typeattr_root(cls, desc[3], f"{desc[2]}.{desc[3]}", desc)
    if kind in ("tensorattr", "tensordict"):  # NOTE: a parameter's or buffer's (tensor_attrs)
        owner, _, leaf = desc[1].rpartition(".")
        tables = vars(module.get_submodule(owner)) if module is not None else {}
        found = [tables.get(k, {}).get(leaf) for k in ("_parameters", "_buffers")]
        found = [t for t in found if t is not None]
        if not found:
            raise UnknownNameError(f"no parameter or buffer {desc[1]}")
        if kind == "tensordict":
            return tensor_dict_root(vars(found[0]), f"the attributes of {desc[1]}", desc)
        return item_root(vars(found[0]), desc[2], f"the attribute {desc[2]} of {desc[1]}", desc)
    if kind in ("logger", "modprop", "getter"):
        return resolve_library(desc)
    raise UnknownNameError(f"unknown Python read {kind!r}")
