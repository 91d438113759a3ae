"""Keyword arguments spelled by PyTorch's parameter names, moved to the positions capture rules
read them from.

A capture rule is a Python function whose parameters are named for its own use
(``rule(cx, out, input, a, b, *, beta, alpha)`` for ``baddbmm``), while PyTorch accepts every
parameter before its ``*`` by its schema's name too: ``alibi.baddbmm(batch1=q, batch2=k)``
(Hugging Face's BLOOM), ``torch.add(x, other=y)``, ``torch.where(condition=c, input=a,
other=b)``. Before a rule runs, a call its signature cannot take is rewritten: keywords that
name the parameters right after the positional arguments, in the order of every ATen schema
(or the Python signature) the keywords fit, become positional arguments, and ``out=None`` (no
output tensor) is dropped. A call still unbound after that is not the rule's to lower: the
tracer runs it as ATen ops or an opaque node (``NoIROp``), never with its keywords misplaced.

Example:
    >>> import torch
    >>> from plait.frontend.call_keywords import positional_call
    >>> x = torch.ones(2)
    >>> args, kwargs = positional_call(torch.baddbmm, (x,), {"batch1": x, "batch2": x, "beta": 0.5})
    >>> len(args), sorted(kwargs)
    (3, ['beta'])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_SIGNATURES: dict[Any, inspect.Signature | None] = {}
_ORDERS: dict[Any, tuple[tuple[tuple[str, ...], frozenset[str]], ...]] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return _SIGNATURES[fn]
    except KeyError:
        pass
    except TypeError:  # NOTE: an unhashable callable
        return None
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    _SIGNATURES[fn] = sig
    return sig


def binds(fn: Callable[..., Any], leading: int, args: tuple, kwargs: dict) -> bool:
    """Whether ``fn(<leading placeholders>, *args, **kwargs)`` binds to ``fn``'s parameters
    (True where its signature cannot be read: the call is left as it is)."""
    sig = _signature(fn)
    if sig is None:
        return True
    try:
        sig.bind(*([None] * leading), *args, **kwargs)
    except TypeError:
        return False
    return True


def _orders(func: Any) -> tuple[tuple[tuple[str, ...], frozenset[str]], ...]:
    """Per signature of ``func`` (its Python one, or each ATen schema of its name other than
    the ``out=`` variants): the names of its positional parameters in order, and all its names.
    A method's ``self`` is its first positional argument; a function's is called ``input``."""
    try:
        return _ORDERS[func]
    except KeyError:
        pass
    sig = _signature(func)
    found: list[tuple[tuple[str, ...], frozenset[str]]] = []
    if sig is not None:
        params = list(sig.parameters.values())
        found.append(
            (
                tuple(p.name for p in params if p.kind in _POSITIONAL),
                frozenset(p.name for p in params),
            )
        )
    else:
        method = getattr(func, "__objclass__", None) is torch._C.TensorBase
        name = getattr(func, "__name__", "")
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}") if name else []
        for schema in schemas:
            if any(a.is_out for a in schema.arguments):
                continue
            names = [
                "input" if a.name == "self" and not method else a.name for a in schema.arguments
            ]
            positional = tuple(n for n, a in zip(names, schema.arguments) if not a.kwarg_only)
            found.append((positional, frozenset(names)))
    _ORDERS[func] = tuple(found)
    return _ORDERS[func]


def positional_call(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``func(*args, **kwargs)`` with ``out=None`` dropped and the keywords that PyTorch's
    signatures of ``func`` all place right after ``args`` moved there, in their order."""
    kwargs = {k: v for k, v in kwargs.items() if not (k == "out" and v is None)}
    fits = [pos for pos, names in _orders(func) if set(kwargs) <= names]
    if not fits:
        return args, kwargs
    moved = list(args)
    while kwargs:
        at = len(moved)
        slot = {pos[at] if at < len(pos) else None for pos in fits}
        name = slot.pop() if len(slot) == 1 else None
        if name is None or name not in kwargs:
            break
        moved.append(kwargs.pop(name))
    return tuple(moved), kwargs


def fit_rule(
    fn: Callable[..., Any], leading: int, func: Any, args: tuple, kwargs: dict
) -> tuple[tuple, dict, bool]:
    """The call as ``fn`` (a capture rule taking ``leading`` arguments of its own first) reads
    it, and whether it binds: as given where it does, else with its keywords placed by
    :func:`positional_call`."""
    if binds(fn, leading, args, kwargs):
        return args, kwargs, True
    if not kwargs:  # NOTE: positional arguments it does not take (a deprecated overload's)
        return args, kwargs, False
    args, kwargs = positional_call(func, args, kwargs)
    return args, kwargs, binds(fn, leading, args, kwargs)
