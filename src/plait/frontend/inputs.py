"""The calling convention of a captured program: bind a call to the signature, flatten it.

Arguments are bound to the callable's signature (defaults applied), so a wrong call fails the way
Python would, and every leaf gets a readable path (``x``, ``batch['ids']``, ``args[1]``) that
guards and error messages use.

NOTE: defaults are applied only where that cannot change what the program sees: for a plain
function or ``forward``. A decorated one (``functools.wraps``: Hugging Face's models) shows the
signature of the function it wraps, not what the wrapper does with a missing argument (it may
fill it in itself: a default passed back collided with it), so its calls are passed on as made.

Example:
    >>> adapter = InputAdapter(lambda x, scale=2.0: x)
    >>> spec, leaves, paths = adapter.flatten((1,), {})
    >>> leaves, paths
    ([1, 2.0], ['x', 'scale'])
    >>> import functools
    >>> wrapped = InputAdapter(functools.wraps(lambda x, scale=2.0: x)(lambda *a, **k: a[0]))
    >>> wrapped.flatten((1,), {})[1:]
    ([1], ['x'])
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from plait.errors import CompiledInputError, InvalidOptionError
from plait.frontend import pytree
from plait.frontend.input_writes import InputObjects


class InputAdapter:
    """Binds each call to ``fn``'s signature as it is at that call: a function's defaults
    rebound (``f.__defaults__ = ...``) or a module's ``forward`` replaced after compiling bind
    as eager binds them. ``passthrough``: no signature, calls passed on as made (a region's)."""

    def __init__(self, fn: Callable[..., Any], passthrough: bool = False) -> None:
        self._fn = fn
        self._passthrough = passthrough
        self._seen: tuple[Any, ...] = ()
        self.signature: inspect.Signature | None = None
        self.name = type(fn).__name__
        self.defaults = False
        # NOTE: (count, binding state, hooks see the call, spec, default leaves, paths) of the
        # last call made of positional plain tensors alone (flatten's fast path)
        self._positional: tuple[Any, ...] | None = None
        self._refresh()

    def _target(self) -> Any:
        return self._fn.forward if isinstance(self._fn, nn.Module) else self._fn

    def _refresh(self) -> None:
        """Read the signature again when the target's function or defaults objects changed
        (NOTE: by identity: a default tensor compared with == would not give a bool)."""
        target = self._target()
        func, last = getattr(target, "__func__", target), self._seen
        if (
            len(last) == 2  # NOTE: the common case, checked without building the state
            and func is last[0]
            and getattr(func, "__defaults__", None) is last[1]
            and not getattr(func, "__kwdefaults__", None)
        ):
            return
        seen = _binding_state(target)
        if len(seen) == len(last) and all(a is b for a, b in zip(seen, last)):
            return
        self._seen = seen
        self.name = getattr(target, "__qualname__", type(self._fn).__name__)
        if self._passthrough:
            return
        try:
            self.signature = inspect.signature(target)
        except (TypeError, ValueError):
            self.signature = None
        try:
            self.defaults = inspect.unwrap(target) is target  # see the module's NOTE
        except ValueError:  # NOTE: a cycle of __wrapped__: a wrapper all the same
            self.defaults = False

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Named arguments in signature order (defaults applied unless the callable is a
        wrapper); raises TypeError like the callable would."""
        self._refresh()
        if self.signature is None:
            return {"args": tuple(args), "kwargs": dict(kwargs)}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise CompiledInputError(f"{self.name}(): {exc}") from None
        if not self.defaults:
            return _as_made(self.signature, dict(bound.arguments), kwargs)
        given = bound.arguments  # NOTE: apply_defaults binds a new dict
        bound.apply_defaults()
        if not _hooks_see_call(self._fn):
            return dict(bound.arguments)
        # NOTE: a module's forward hooks see its call as made (a forward pre-hook replaces the
        # positional arguments and keeps the keyword ones): how each argument was passed is
        # part of the call's structure, and the defaults stay leaves (guarded), not passed on
        named = dict(bound.arguments)
        if len(named) == len(given):
            return _as_made(self.signature, named, kwargs)
        params = self.signature.parameters
        defaulted = [n for n in named if n not in given and params[n].kind not in _VARIADIC]
        return _as_made(self.signature, named, kwargs, defaulted)

    def flatten(self, args: tuple, kwargs: dict) -> tuple[Any, list[Any], list[str]]:
        """The call's structure. A plain object (``pytree.state_rebuildable``: a key/value
        cache) is a container of its attributes, so its tensors are inputs and its other
        attributes are guarded by value; a region's calls keep objects whole (they run split).
        A container met twice in the call is an alias of the first (``pytree.flatten_call``).
        NOTE: a call with a cycle through an object keeps its objects whole."""
        tensors = (
            not kwargs and not self._passthrough and all(type(a) is torch.Tensor for a in args)
        )
        if tensors and self._positional is not None:
            count, seen, hooked, spec, tail, paths = self._positional
            self._refresh()
            if count == len(args) and seen is self._seen and hooked == _hooks_see_call(self._fn):
                return spec, [*args, *tail], list(paths)
        named = self.bind(args, kwargs)
        flat = None
        if not self._passthrough:
            with contextlib.suppress(InvalidOptionError):
                flat = pytree.flatten_call(named, pytree.always)
        if flat is None:
            flat = pytree.flatten_call(named)
        if tensors:
            self._remember(args, named, flat)
        return flat

    def _remember(
        self, args: tuple, named: dict[str, Any], flat: tuple[Any, list[Any], list[str]]
    ) -> None:
        """Keep a call of positional plain tensors' structure for the next such call: valid
        while the binding state and the hooks' view are the same, when each bound value is one
        of the tensors, a default that is an atom (immutable: a list default could change in
        place) or a mark, and the leaves are the tensors, then those defaults."""
        spec, leaves, paths = flat
        n = len(args)
        ids = {id(a) for a in args}
        if (
            all(
                id(v) in ids or type(v) in _ATOMS or (k in (BY_KEYWORD, DEFAULTED) and v == ())
                for k, v in named.items()
            )
            and len(leaves) >= n
            and all(a is b for a, b in zip(leaves, args))
            and all(type(v) in _ATOMS for v in leaves[n:])
        ):
            hooked = _hooks_see_call(self._fn)
            self._positional = (n, self._seen, hooked, spec, tuple(leaves[n:]), tuple(paths))
        else:
            self._positional = None

    def containers(self, args: tuple, kwargs: dict, spec: Any) -> list[Any]:
        """The caller's mutable containers (lists, dicts, opened objects) of a call flattened
        as ``spec``, in the order :meth:`call` records the ones it builds."""
        named = self.bind(args, kwargs)
        out: list[Any] = []
        for name, sub in spec:
            out += pytree.containers(sub, named[name])
        return out

    def call(
        self,
        fn: Callable[..., Any],
        spec: Any,
        leaves: list[Any],
        objects: InputObjects | None = None,
    ) -> Any:
        """Call ``fn`` with the arguments ``spec`` describes, leaves replaced by ``leaves``;
        ``objects`` records the containers built for it (:mod:`plait.frontend.input_writes`)."""
        named: dict[str, Any] = {}
        i = 0
        made = objects.made if objects is not None else []  # NOTE: aliases index the call's
        for name, sub in spec:
            n = _count(sub)
            named[name] = pytree.unflatten(sub, leaves[i : i + n], made)
            i += n
        if objects is not None:
            objects.started(leaves)
        if self.signature is None:
            return fn(*named["args"], **named["kwargs"])
        by_keyword = _call_form(named)
        bound = inspect.BoundArguments(self.signature, named)
        args, kwargs = list(bound.args), bound.kwargs
        if by_keyword:
            # NOTE: a call as made: what the caller named goes on by name
            names = list(self.signature.parameters)
            first = next(i for i, p in enumerate(names) if p in by_keyword)
            kwargs = {**{p: named[p] for p in names[first : len(args)] if p in by_keyword},
                      **kwargs}  # fmt: skip
            args = args[:first]
        return fn(*args, **kwargs)


def _hooks_see_call(fn: Any) -> bool:
    """Whether calling ``fn`` runs forward hooks that see how it was called: its own forward
    (pre-)hooks or the global ones (a hook registered later is a recompile: capture guards
    the hook tables)."""
    return isinstance(fn, nn.Module) and bool(
        fn._forward_pre_hooks
        or fn._forward_hooks
        or nn_module._global_forward_pre_hooks
        or nn_module._global_forward_hooks
    )


# NOTE: default values flatten's fast path may keep: immutable, and leaves of their own
_ATOMS = frozenset({type(None), bool, int, float, str, bytes})

# NOTE: in a wrapper's or a module's bound call, the arguments after this name were given by
# keyword (a name no parameter has; its value, (), has no leaves): the call's structure, and so
# its guard, says how each was passed, and the callable is called the same way
BY_KEYWORD = "**"
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
# NOTE: in a module's bound call, the arguments after this name are the defaults the caller did
# not pass: leaves (guarded by value), not passed on, so the module's hooks see the call as made
DEFAULTED = "*"


def _as_made(
    sig: inspect.Signature, named: dict[str, Any], kwargs: dict, defaulted: Sequence[str] = ()
) -> dict[str, Any]:
    """Bound arguments, marked where the caller passed one by name that could be positional
    (a decorator that fills in a missing keyword, Hugging Face's ``use_cache``, would otherwise
    meet it again, passed on by position; a module's forward hooks see it in ``kwargs``), and
    where a default was applied that the caller did not pass (``defaulted``)."""
    params = sig.parameters
    named_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
    given = [n for n in named if n in kwargs and params[n].kind in named_kinds] if kwargs else []
    if not given and not defaulted:
        return named
    out = {n: v for n, v in named.items() if n not in given and n not in defaulted}
    if given:
        out[BY_KEYWORD] = ()
        out.update((n, named[n]) for n in given)
    if defaulted:
        out[DEFAULTED] = ()
        out.update((n, named[n]) for n in defaulted)
    return out


def _call_form(named: dict[str, Any]) -> set[str]:
    """The names the caller gave by keyword, as :func:`_as_made` marked them; the marks and
    the defaults the caller did not pass are taken out of ``named`` (they are not passed on)."""
    if DEFAULTED not in named and BY_KEYWORD not in named:
        return set()
    names = list(named)
    if DEFAULTED in named:
        for n in names[names.index(DEFAULTED) :]:
            del named[n]
        names = names[: names.index(DEFAULTED)]
    if BY_KEYWORD not in named:
        return set()
    given = set(names[names.index(BY_KEYWORD) + 1 :])
    del named[BY_KEYWORD]
    return given


def _binding_state(target: Any) -> tuple[Any, ...]:
    """The objects a signature of ``target`` is read from: its function, its defaults, each
    keyword default and, for a ``functools.partial``, its arguments (compared by identity)."""
    func = getattr(target, "__func__", target)
    kwdefaults = getattr(func, "__kwdefaults__", None) or {}
    state = (func, getattr(func, "__defaults__", None), *kwdefaults.keys(), *kwdefaults.values())
    if isinstance(func, functools.partial):
        state += (func.func, func.args, *func.keywords.keys(), *func.keywords.values())
        state += _binding_state(func.func)
    return state


def _count(spec: Any) -> int:
    if spec == pytree.LEAF:
        return 1
    if spec[0] == "alias":
        return 0
    kids = spec[-1]
    return sum(_count(k) for k in kids)
