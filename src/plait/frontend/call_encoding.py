"""A call's arguments as an IR node's operands and JSON attributes (``literals``,
``kwliterals``): tensors, by position or keyword, become ``{"t": i}`` for operand ``i``; every
other value is JSON data or a one-key tagged object (``{"tuple": [...]}``, ``{"dtype":
"float64"}``, ``{"slice": [...]}``, ``{"float": "<bits>"}``, ...) that
:func:`plait.ir.ops.extern.decode_literal` gives back exactly. Generators and other objects have
no encoding (:class:`NotLiteral`). Used by opaque nodes, ATen nodes and data-dependent calls.

Example:
    >>> import torch
    >>> tensors, attrs = call_spec((torch.ones(2), 3, torch.float64), {"dim": -1})
    >>> len(tensors), attrs["literals"], attrs["kwliterals"]
    (1, '[{"t": 0}, 3, {"dtype": "float64"}]', '{"dim": -1}')
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

from plait.frontend.symints import TracedInt, TracedSize, plain_int


class NotLiteral(Exception):
    """An argument the opaque node cannot carry; the message says which and why."""


# NOTE: torch objects named by an attribute of ``torch`` (``torch.float64``,
# ``torch.channels_last``, ``torch.strided``): the tag and how the object prints its name.
_NAMED = (
    (torch.dtype, "dtype"),
    (torch.memory_format, "memory_format"),
    (torch.layout, "layout"),
)


def _float(x: float) -> Any:
    back = json.loads(json.dumps(x))
    if struct.pack("<d", back) == struct.pack("<d", x):
        return x
    return {"float": struct.pack("<d", x).hex()}  # NOTE: -nan, a nan payload: by their bits


def _encode(x: Any, tensors: list[Any]) -> Any:
    """``x`` as JSON data that :func:`plait.ir.ops.extern.decode_literal` gives back exactly;
    tensors become ``{"t": i}`` (appended to ``tensors``)."""
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return {"t": len(tensors) - 1}
    if isinstance(x, torch.Generator):
        raise NotLiteral(
            "a Generator argument has no JSON encoding the IR decodes (plait replays the "
            "global random number generator only)"
        )
    for kind, tag in _NAMED:
        if isinstance(x, kind):
            name = str(x).removeprefix("torch.")
            if getattr(torch, name, None) is not x:
                raise NotLiteral(f"the {tag} {x!r} is not named by an attribute of torch")
            return {tag: name}
    if isinstance(x, torch.device):
        return {"device": str(x)}
    if isinstance(x, TracedInt):
        return plain_int(x)  # NOTE: opaque nodes are static-only: the size is type-guarded
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is float:
        return _float(x)
    if type(x) is complex:
        return {"complex": [_float(x.real), _float(x.imag)]}
    if x is Ellipsis:
        return {"ellipsis": 0}
    if type(x) is slice:
        return {"slice": [_encode(v, tensors) for v in (x.start, x.stop, x.step)]}
    if type(x) in (torch.Size, TracedSize):
        return {"size": [_encode(v, tensors) for v in x]}
    if type(x) is list:
        return [_encode(v, tensors) for v in x]
    if type(x) is tuple:
        return {"tuple": [_encode(v, tensors) for v in x]}
    if type(x) is dict and all(type(k) is str for k in x):
        return {"dict": [[k, _encode(v, tensors)] for k, v in x.items()]}
    raise NotLiteral(f"a {type(x).__name__} argument has no JSON encoding the IR decodes")


def call_spec(args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, str]]:
    """The tensor operands (positional ones first, then those passed by keyword) and the
    node's ``literals``/``kwliterals`` attributes (``literals`` left out when the call is its
    tensors only, in order)."""
    tensors: list[Any] = []
    positional = [_encode(a, tensors) for a in args]
    keywords = {k: _encode(v, tensors) for k, v in kwargs.items()}
    attrs: dict[str, str] = {}
    if positional != [{"t": i} for i in range(len(tensors))]:
        attrs["literals"] = json.dumps(positional)
    if keywords:
        attrs["kwliterals"] = json.dumps(keywords)
    return tensors, attrs
