"""The torch-function → IR table: one rule per torch-level callable.

A rule is keyed by the callable object that ``__torch_function__`` receives (``torch.add``,
``torch.Tensor.add``, ``torch.Tensor.__add__``, ``F.relu``, ``torch.Tensor.shape.__get__``, ...).
Three kinds:

- ``op``: an *emitter* ``fn(cx, out, *args, **kwargs)`` that writes IR for the call. The tracer
  first runs the real PyTorch call on the sample values (``out`` is its result), then the
  emitter; it returns IR values (or :class:`Viewed` / :class:`InPlace` results) shaped like
  ``out``. ``inplace=True`` marks an in-place method: the emitter returns the functional value
  and the tracer rebinds the mutated tensor. ``grad=False`` marks a call whose result never
  requires grad (``detach``).
- ``meta``: ``fn(cx, *args, **kwargs)`` answers a metadata read (shape, dtype, ...) itself.
- ``data``: a read of tensor data; capture refuses it (``GraphCaptureError``) naming ``what``.

Example:
    >>> import torch
    >>> from plait.frontend import table
    >>> table.lookup(torch.Tensor.item).kind
    'data'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.errors import InvalidOptionError
from plait.frontend.views import ViewStep
from plait.ir import Value


@dataclass(frozen=True)
class Rule:
    kind: str  # "op" | "meta" | "data"
    fn: Callable[..., Any] | None = None
    inplace: bool = False
    what: str = ""
    grad: bool = True  # False: the result never requires grad, whatever its inputs


@dataclass(frozen=True)
class Viewed:
    """An op result that PyTorch returns as a view of ``source`` (shares its memory)."""

    value: Value
    source: Any
    steps: tuple[ViewStep, ...]
    # NOTE: eager makes a view or a copy by the source's strides (plait.frontend.stride_choices)
    by_strides: bool = False


@dataclass(frozen=True)
class InPlace:
    """An op that overwrites ``target`` with ``value`` and returns ``target``."""

    target: Any
    value: Value


class NoIROp(Exception):
    """Raised by an emitter, before it emits anything, for a combination of arguments its IR
    op cannot express (``max_pool2d(return_indices=True)``): the call becomes an ``opaque``
    node instead (or, where it cannot be one, the capture error naming this reason)."""


_RULES: dict[Any, Rule] = {}


def _register(funcs: Sequence[Any], rule: Rule) -> None:
    # NOTE: some spellings are one object (Tensor.__rtruediv__ is Tensor.__rdiv__): dedupe them.
    unique = {id(f): f for f in funcs if f is not None}
    for f in unique.values():
        if f in _RULES:
            raise InvalidOptionError(f"capture rule for {f!r} registered twice")
        _RULES[f] = rule


def op(
    *funcs: Any, inplace: bool = False, grad: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _register(funcs, Rule("op", fn, inplace, grad=grad))
        return fn

    return deco


def meta(*funcs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _register(funcs, Rule("meta", fn))
        return fn

    return deco


def data_read(what: str, *funcs: Any) -> None:
    _register(funcs, Rule("data", what=what))


def getter(name: str, which: str = "__get__") -> Any:
    """``Tensor.<name>.__get__``: the callable ``__torch_function__`` sees for a property read."""
    return getattr(getattr(torch.Tensor, name), which)


def lookup(func: Any) -> Rule | None:
    try:
        return _RULES.get(func)
    except TypeError:  # an unhashable callable
        return None


def covered() -> list[Any]:
    """Every torch callable with a rule (for docs and tests)."""
    return list(_RULES)
