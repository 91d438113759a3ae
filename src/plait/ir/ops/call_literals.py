"""The JSON form of a call's arguments (opaque, aten and random nodes): resolving a ``torch.*``
target and decoding its literals into exactly the values the call was made with."""

from __future__ import annotations

import importlib
import json
import struct
from typing import Any

import torch

from plait.ir.ops.registry import (
    TypeRuleError,
)


def resolve_target(target: str) -> Any:
    """Look up a PyTorch callable by dotted path. NOTE: only ``torch.*`` is resolvable, so an
    artifact's text can name a PyTorch function but never make plait import arbitrary code."""
    if target != "torch" and not target.startswith("torch."):
        raise TypeRuleError(f"opaque: target {target!r} is not a torch callable")
    module_name, _, attr = target.rpartition(".")
    obj: Any = None
    while module_name:
        try:
            obj = importlib.import_module(module_name)
            break
        except ImportError:
            module_name, _, parent = module_name.rpartition(".")
            attr = f"{parent}.{attr}"
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeRuleError(f"opaque: {target!r} is not callable")
    return obj


def call_spec(literals: str, kwliterals: str) -> tuple[list[Any] | None, dict[str, Any]]:
    """Decode the JSON call spec: ``literals`` is the full positional argument list, where
    ``{"t": i}`` stands for tensor operand ``i``; ``kwliterals`` holds the keyword arguments
    (tensor operands there too). Values stay encoded; :func:`decode_literal` decodes them."""
    try:
        positional = json.loads(literals) if literals else None
        keywords = json.loads(kwliterals) if kwliterals else {}
    except json.JSONDecodeError as exc:
        raise TypeRuleError(f"opaque: malformed call spec: {exc}") from None
    if positional is not None and not isinstance(positional, list):
        raise TypeRuleError("opaque: literals must be a JSON list")
    if not isinstance(keywords, dict):
        raise TypeRuleError("opaque: kwliterals must be a JSON object")
    return positional, keywords


def _named(module: Any, kind: type, name: Any, what: str) -> Any:
    obj = getattr(module, str(name), None)
    if not isinstance(obj, kind):
        raise TypeRuleError(f"opaque: unknown {what} {name!r}")
    return obj


# NOTE: a literal is JSON data, or a one-key object whose key names what it encodes. Each tag
# gives back exactly the Python value the call was made with (a tuple stays a tuple: a Python
# function may tell it from a list).
_TAGS: dict[str, Any] = {
    "dtype": lambda b, t: _named(torch, torch.dtype, b, "dtype"),
    "device": lambda b, t: torch.device(str(b)),
    "memory_format": lambda b, t: _named(torch, torch.memory_format, b, "memory format"),
    "layout": lambda b, t: _named(torch, torch.layout, b, "layout"),
    "tuple": lambda b, t: tuple(decode_literal(v, t) for v in b),
    "size": lambda b, t: torch.Size(int(v) for v in b),
    "slice": lambda b, t: slice(*(decode_literal(v, t) for v in b)),
    "ellipsis": lambda b, t: ...,
    "complex": lambda b, t: complex(decode_literal(b[0], t), decode_literal(b[1], t)),
    "float": lambda b, t: struct.unpack("<d", bytes.fromhex(str(b)))[0],
    "dict": lambda b, t: {decode_literal(k, t): decode_literal(v, t) for k, v in b},
}


def decode_literal(spec: Any, tensors: list[Any]) -> Any:
    """An argument of an opaque (or random) call from its JSON form; ``{"t": i}`` is
    ``tensors[i]``.

    Example:
        >>> decode_literal({"tuple": [2, {"dtype": "float64"}, {"ellipsis": 0}]}, [])
        (2, torch.float64, Ellipsis)
    """
    if isinstance(spec, dict):
        if len(spec) != 1:
            raise TypeRuleError(f"opaque: a literal object has one key, got {sorted(spec)}")
        ((tag, body),) = spec.items()
        if tag == "t":
            if not isinstance(body, int) or not 0 <= body < len(tensors):
                raise TypeRuleError(f"opaque: no tensor operand {body!r}")
            return tensors[body]
        decode = _TAGS.get(tag)
        if decode is None:
            raise TypeRuleError(f"opaque: unknown literal {spec!r}")
        try:
            return decode(body, tensors)
        except (TypeError, ValueError, struct.error) as exc:
            raise TypeRuleError(f"opaque: malformed literal {spec!r}: {exc}") from None
    if isinstance(spec, list):
        return [decode_literal(s, tensors) for s in spec]
    return spec


def count_operands(spec: Any) -> int:
    """How many ``{"t": i}`` markers an encoded argument holds."""
    if isinstance(spec, dict):
        if set(spec) == {"t"}:
            return 1
        return sum(count_operands(v) for v in spec.values())
    if isinstance(spec, list):
        return sum(count_operands(v) for v in spec)
    return 0


def decode_call(
    tensors: list[Any], literals: str, kwliterals: str
) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of an opaque or random call."""
    positional, keywords = call_spec(literals, kwliterals)
    args = list(tensors) if positional is None else decode_literal(positional, tensors)
    return args, {k: decode_literal(v, tensors) for k, v in keywords.items()}


def run_call(tensors: list[Any], target: str, literals: str, kwliterals: str) -> Any:
    """An opaque or random call run: its result, a returned tuple without its ``None``s (no
    output of the node: capture rebuilds the tuple around them, as for MultiheadAttention's
    weights it was not asked for)."""
    args, keywords = decode_call(tensors, literals, kwliterals)
    out = resolve_target(target)(*args, **keywords)
    return [o for o in out if o is not None] if isinstance(out, (tuple, list)) else out
