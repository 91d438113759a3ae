"""The callables ``plait.compile`` returns: :class:`CompiledFunction` and :class:`CompiledModule`
(a module wrapper that shares the module's tables), both speaking the artifact protocol the
conformance gate drives. They hold an :class:`Engine`, the compile-and-dispatch machinery
(``plait.api``'s), through the few calls they make of it.

Example:
    >>> import torch, plait
    >>> f = plait.compile(lambda x: x * 2, backend="eager")
    >>> type(f).__name__, float(f(torch.ones(1))[0])
    ('CompiledFunction', 2.0)
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from torch import nn

from plait import wrapper_hooks
from plait.ambient_modes import capture_running, foreign_mode
from plait.autograd.function import transforms_active
from plait.errors import CaptureFallbackWarning
from plait.specialization import Specialization, SpecializationUse


class Engine(Protocol):
    """What a compiled callable asks of the engine that captures, compiles and dispatches."""

    specializations: list[Specialization]
    recompile_reasons: list[str]

    def __call__(self, args: tuple, kwargs: dict) -> Any: ...

    def call_target(self, *args: Any, **kwargs: Any) -> Any: ...

    def uses(self) -> list[SpecializationUse]: ...

    def guard_failures(self, key: str, args: tuple, kwargs: dict) -> list[str]: ...

    def call_specialization(self, key: str, args: tuple, kwargs: dict) -> Any: ...

    def specialize(self, args: tuple, kwargs: dict) -> SpecializationUse: ...


def _inlined(engine: Engine, args: tuple, kwargs: dict) -> Any:
    """A compiled callable called while another's capture traces (``plait.compile(outer)``
    calling a compiled block): the callable's program as written, which the running capture
    traces into its own graph, as if the inner had never been compiled. Nothing of the call
    is recorded on the inner's engine: called on its own later, it compiles its own program."""
    return engine.call_target(*args, **kwargs)


def _eager_reason() -> str | None:
    """Why this call must run the program as written, if it must: a ``torch.func`` transform
    (compiled programs have no transform rules) or a mode that is not plait's
    (:mod:`plait.ambient_modes`: it sees, and may change, every torch call of the eager
    program, none of a compiled one's)."""
    if transforms_active():
        return (
            "a torch.func transform (grad, vjp, jacrev, vmap) is active, and compiled programs "
            "have no transform rules"
        )
    mode = foreign_mode()
    if mode is not None:
        return f"{mode} is active, and it sees none of a compiled program's torch calls"
    return None


def _run_eagerly(engine: Engine, why: str, args: tuple, kwargs: dict) -> Any:
    """The call under a ``torch.func`` transform or a foreign mode: the program as written,
    warned; the transform or the mode gives eager's values through the user's own code. (A
    helper of its own: the common call keeps its frames, which capture's warnings count.)"""
    warnings.warn(
        f"plait runs this call eagerly (fallback): {why}", CaptureFallbackWarning, stacklevel=3
    )
    return engine.call_target(*args, **kwargs)


class _Copyable:
    """``copy.deepcopy``, ``copy.copy`` and pickling of a compiled callable: the module or
    function is copied (or pickled) and compiled again with the same arguments; the engine
    (locks, native guard evaluators, compiled programs) is never copied."""

    _compile_kwargs: dict[str, Any]
    # NOTE: plait.api's ``recompiled`` (``plait.compile`` of the copy), set by that module,
    # which sits above this one; pickles refer to it by its name
    recompile: Callable[..., Any] | None = None

    def _target(self) -> Any:
        raise NotImplementedError

    def _own_state(self) -> dict[str, Any]:
        return {}

    def __reduce_ex__(self, protocol: Any) -> Any:
        assert _Copyable.recompile is not None, "plait.api sets it on import"
        return (_Copyable.recompile, (self._target(), self._compile_kwargs, self._own_state()))

    def __copy__(self) -> Any:
        assert _Copyable.recompile is not None, "plait.api sets it on import"
        return _Copyable.recompile(self._target(), self._compile_kwargs, self._own_state())


class _ArtifactProtocol:
    """The public artifact protocol of compiled callables: what :mod:`plait.conformance`
    drives (docs/conformance.md), the specializations with the user calls each ran, and calls
    pinned to one of them."""

    _plait: Engine

    def specialization_uses(self) -> list[SpecializationUse]:
        """Every specialization, with the user calls it ran and their settings."""
        return self._plait.uses()

    def guard_failures(self, key: str, *args: Any, **kwargs: Any) -> list[str]:
        """The guards of specialization ``key`` that this call (under the current settings)
        fails; empty when that specialization would run it."""
        return self._plait.guard_failures(key, args, kwargs)

    def call_specialization(self, key: str, *args: Any, **kwargs: Any) -> Any:
        """Run this call with specialization ``key`` and no other: never captures or compiles,
        and is not counted as a user call. Raises :class:`SpecializationMissError` when its
        guards refuse the call (under the current settings)."""
        return self._plait.call_specialization(key, args, kwargs)

    def specialize(self, *args: Any, **kwargs: Any) -> SpecializationUse:
        """The specialization a call with these arguments runs under the current settings,
        captured and compiled as a call would when there is none; the program is not run."""
        return self._plait.specialize(args, kwargs)


class CompiledFunction(_Copyable, _ArtifactProtocol):
    """A compiled function: call it like the original. ``specializations`` and
    ``recompile_reasons`` record what was captured and why."""

    def __init__(
        self, fn: Callable[..., Any], engine: Engine, compile_kwargs: dict[str, Any] | None = None
    ) -> None:
        functools.update_wrapper(self, fn)
        self._plait = engine
        self._fn = fn
        self._compile_kwargs = dict(compile_kwargs or {})

    def _target(self) -> Any:
        return self._fn

    def __reduce_ex__(self, protocol: Any) -> Any:
        # NOTE: a function compiled by the decorator is the module's global of its name:
        # pickled by reference (and copied as itself), as functions are
        owner = sys.modules.get(getattr(self, "__module__", None) or "")
        if getattr(owner, getattr(self, "__qualname__", ""), None) is self:
            return self.__qualname__
        return super().__reduce_ex__(protocol)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if capture_running():
            return _inlined(self._plait, args, kwargs)
        why = _eager_reason()
        if why is not None:
            return _run_eagerly(self._plait, why, args, kwargs)
        return self._plait(args, kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    @property
    def specializations(self) -> list[Specialization]:
        return self._plait.specializations

    @property
    def recompile_reasons(self) -> list[str]:
        return self._plait.recompile_reasons


_SHARED = (
    "_parameters",
    "_buffers",
    "_non_persistent_buffers_set",
    "_modules",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


_OWN_ATTRIBUTES = ("__class__", "_is_full_backward_hook")


class CompiledModule(_Copyable, _ArtifactProtocol, nn.Module):
    """A compiled ``nn.Module`` that behaves as the module: it shares its parameters, buffers
    and submodules (``state_dict()`` keys are the module's own), ``train()``/``eval()`` switch
    the module, and attribute reads and writes go to it. Forward hooks registered on the
    original module run inside the captured program."""

    _orig_mod: nn.Module
    _plait: Engine

    def __init__(
        self, module: nn.Module, engine: Engine, compile_kwargs: dict[str, Any] | None = None
    ) -> None:
        # NOTE: no nn.Module.__init__: the wrapper takes the module's own tables (shared, not
        # copied) and keeps empty hook tables of its own; `training` lives on the module.
        fresh = nn.Module().__dict__
        for key, value in fresh.items():
            if key != "training":
                object.__setattr__(self, key, value)
        for key in _SHARED:
            object.__setattr__(self, key, module.__dict__[key])
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_plait", engine)
        object.__setattr__(self, "_compile_kwargs", dict(compile_kwargs or {}))

    def _target(self) -> Any:
        return self._orig_mod

    def _own_state(self) -> dict[str, Any]:
        """The wrapper's own tables (its hooks), not the module's (shared) nor the engine."""
        skip = {*_SHARED, "_orig_mod", "_plait", "_compile_kwargs", "training"}
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if capture_running():
            return _inlined(self._plait, args, kwargs)
        why = _eager_reason()
        if why is not None:
            return _run_eagerly(self._plait, why, args, kwargs)
        return self._plait(args, kwargs)

    # NOTE: the module's calls run the global module hooks; the wrapper's call runs only its
    # own hooks (plait.wrapper_hooks), so each global hook runs once per module, as in eager
    _call_impl = wrapper_hooks.call_impl
    _get_backward_hooks = wrapper_hooks.get_backward_hooks
    _get_backward_pre_hooks = wrapper_hooks.get_backward_pre_hooks

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_orig_mod"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        # NOTE: a class swap (FSDP2's fully_shard) is the wrapper's own; so is the kind of the
        # backward hooks in its own table (register_full_backward_hook sets it, and
        # nn.Module's call runs the wrapper's hooks only if the wrapper says they are full)
        if name in _OWN_ATTRIBUTES:
            object.__setattr__(self, name, value)
            return
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    # NOTE: container modules (Sequential, ModuleList, ModuleDict) keep their protocol.
    def __getitem__(self, key: Any) -> Any:
        return self._orig_mod[key]  # type: ignore[index]

    def __len__(self) -> int:
        return len(self._orig_mod)  # type: ignore[arg-type]

    def __iter__(self) -> Any:
        return iter(self._orig_mod)  # type: ignore[call-overload]

    def _get_name(self) -> str:
        return f"CompiledModule[{self._orig_mod._get_name()}]"

    @property
    def specializations(self) -> list[Specialization]:
        return self._plait.specializations

    @property
    def recompile_reasons(self) -> list[str]:
        return self._plait.recompile_reasons
