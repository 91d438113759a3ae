"""Which arguments a torch call writes in place, decided *before* the call runs.

NOTE: parameters are traced through their own memory (cloning every weight would double the
model's memory during capture), so a write to one must be refused before PyTorch performs it.
The frontend also checks the parameters' version counters after capture as a last line.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

_NOT_INPLACE = {"__index__", "__int__", "__invert__", "__iter__", "__init__"}
_INPLACE_ARG: dict[Any, int | None] = {}


def inplace_index(func: Any) -> int | None:
    """Position of an ``inplace`` parameter in ``func``'s signature (cached), else None."""
    try:
        return _INPLACE_ARG[func]
    except (KeyError, TypeError):
        pass
    index: int | None = None
    try:
        params = list(inspect.signature(func).parameters)
        index = params.index("inplace") if "inplace" in params else None
    except (TypeError, ValueError):
        index = None
    with contextlib.suppress(TypeError):  # an unhashable callable is simply not cached
        _INPLACE_ARG[func] = index
    return index


def write_targets(name: str, func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors ``func(*args, **kwargs)`` (named ``name``) may write in place."""
    last = name.rsplit(".", 1)[-1]
    dunder = last.startswith("__") and last.endswith("__")
    if (
        (last.endswith("_") and not dunder)
        or last == "__setitem__"
        or (dunder and last.startswith("__i") and last not in _NOT_INPLACE)
    ):
        return list(args[:1])
    if last == "batch_norm":
        if name.startswith("nn.functional"):
            return [
                a
                for a in (*args[1:3], kwargs.get("running_mean"), kwargs.get("running_var"))
                if a is not None
            ]
        return [a for a in args[3:5] if a is not None]
    index = inplace_index(func)
    if index is not None:
        flag = kwargs.get("inplace", args[index] if len(args) > index else False)
        if flag:
            return list(args[:1])
    return []
