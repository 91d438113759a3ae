"""The public name of each torch callable a capture sees (``torch.add``, ``torch.Tensor.add``,
``torch.nn.functional.relu``): the name :func:`torch.overrides.resolve_name` gives it, from an
index built the way PyTorch builds its own, without the rest of that table.

PyTorch's table (``torch.overrides._get_overridable_functions``) also sorts every function into
overridable and ignored ones, which builds its testing overrides (a lambda for each of about
1,500 functions): 10-15 ms on the first capture of a process, most of a name lookup's cost.
The names come from the same walk over the same namespaces, so they are the same strings
(``tests/capture/test_op_names.py`` compares the two indexes on the running PyTorch).

Example:
    >>> import torch
    >>> op_name(torch.add), op_name(torch.Tensor.add), op_name(torch.nn.functional.relu)
    ('add', 'Tensor.add', 'nn.functional.relu')
"""

from __future__ import annotations
import __future__

import functools
import types
import warnings
from typing import Any

import torch


def _namespaces() -> list[tuple[str, Any, list[str]]]:
    """The namespaces PyTorch names its overridable functions by, in its order (a later
    namespace's name wins for a function two of them hold)."""
    return [
        ("torch", torch, list(torch.__all__)),
        ("torch.functional", torch.functional, list(torch.functional.__all__)),
        ("torch.nn.functional", torch.nn.functional, dir(torch.nn.functional)),
        ("torch.nn.init", torch.nn.init, dir(torch.nn.init)),
        ("torch.Tensor", torch.Tensor, dir(torch.Tensor)),
        ("torch.linalg", torch.linalg, dir(torch.linalg)),
        ("torch.fft", torch.fft, dir(torch.fft)),
        ("torch.special", torch.special, dir(torch.special)),
    ]


@functools.cache
def name_index() -> dict[Any, str]:
    """Each callable of the namespaces, and each descriptor's ``__get__``/``__set__``, by its
    dotted name (``torch.overrides``'s index of names)."""
    index: dict[Any, str] = {}
    skipped = (types.ModuleType, __future__._Feature)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: a deprecated attribute warns when it is read
        for prefix, namespace, names in _namespaces():
            if namespace is torch.Tensor:
                for name in names:
                    func = getattr(namespace, name)
                    if getattr(object, name, None) == func or name == "__weakref__":
                        continue
                    _index(index, prefix, name, func, skipped)
                continue
            for name in names:
                if name.startswith("__") or name == "unique_dim":
                    continue
                _index(index, prefix, name, getattr(namespace, name), skipped)
    return index


def _index(index: dict[Any, str], prefix: str, name: str, func: Any, skipped: tuple) -> None:
    if isinstance(func, skipped):
        return
    if callable(func):
        index[func] = f"{prefix}.{name}"
    elif hasattr(func, "__get__"):
        index[func.__get__] = f"{prefix}.{name}.__get__"
        index[func.__set__] = f"{prefix}.{name}.__set__"


def public_name(func: Any) -> str | None:
    """``func``'s dotted public name (``torch.overrides.resolve_name``'s answer), or None."""
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(func)
    return name_index().get(func)


def op_name(func: Any) -> str:
    """The name a capture gives a torch call: its public name without the ``torch.`` prefix
    (``torch.functional.*`` is re-exported as ``torch.*``), else its qualified name."""
    name = public_name(func)
    if name is None:
        name = getattr(func, "__qualname__", None) or repr(func)
    return name.removeprefix("torch.").removeprefix("functional.").replace(".__get__", "")
