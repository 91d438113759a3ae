"""How a module runs split (:class:`RegionPlan`): while its Python runs eagerly, each of its
submodules has its ``forward`` replaced on the instance by a dispatch to its region engine, so
``nn.Module.__call__`` runs the submodule's hooks eagerly, as written, and then the region.

NOTE: the dispatch slots are installed only for the duration of the call and only for the
thread that runs it (another thread calling the same submodule meanwhile runs it as written);
a region's capture sees its submodules as written (the slots below it are taken out while it
runs), and each slot is restored as it was, the instance dict's key removed where it had none.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from plait.ambient_modes import foreign_mode
from plait.frontend import CapturedProgram
from plait.regions.tree import RegionTree

_LOCAL = threading.local()  # .active: the plans this thread runs, innermost last


_SLOT = "forward"  # NOTE: nn.Module._call_impl calls self.forward between its hooks


_ABSENT = object()  # NOTE: the slot was not in the instance dict (the class's forward showed)


def _active() -> list[RegionPlan]:
    active = getattr(_LOCAL, "active", None)
    if active is None:
        active = _LOCAL.active = []
    return active


class RegionPlan:
    """One module split into regions: while it runs eagerly (:meth:`run`), the calls its Python
    makes to its submodules go to their region engines."""

    def __init__(self, tree: RegionTree, module: nn.Module, path: str) -> None:
        self.tree = tree
        self.module = module
        self.path = path
        self.runs = 0  # NOTE: none yet: the call that made it went on eagerly, its regions wait

    def _dispatcher(self, module: nn.Module, prev: Any) -> Callable[..., Any]:
        original = _bound_forward(module, prev)

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            # NOTE: another thread, or a mode of the user's (its Python sees every torch call
            # of the module as written, none of a compiled region's): the module as written
            if self not in _active() or foreign_mode() is not None:
                return original(*args, **kwargs)
            return self._call_region(module, args, kwargs)

        dispatch._plait_region = True  # type: ignore[attr-defined]
        dispatch._plait_original = prev  # type: ignore[attr-defined]
        return dispatch

    def run(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``call(*args, **kwargs)``: the module's Python, eagerly, with regions dispatched."""
        tree = self.tree
        with tree.lock:
            measure = tree.measuring() if self.module is tree.root else contextlib.nullcontext()
            with measure:
                installed = self._install()
                self.runs += 1
                active = _active()
                active.append(self)
                try:
                    with tree.counting(self.path):
                        out = call(*args, **kwargs)
                finally:
                    active.pop()
                    _restore(installed)
            if self.module is tree.root:
                tree.refresh_manifests()
            return out

    def _install(self) -> list[tuple[nn.Module, Any]]:
        """Every submodule (at any depth) dispatches its forward to its region while the
        module runs: ``nn.Module.__call__`` runs the hooks, eagerly, then ``self.forward``."""
        installed = []
        for m in self.module.modules():
            if m is self.module or getattr(m, "_compiled_call_impl", None) is not None:
                continue  # NOTE: one the user compiled (Module.compile) keeps its own
            if isinstance(m, torch.jit.ScriptModule):
                continue  # NOTE: TorchScript runs its own forward; no capture can run it
            prev = m.__dict__.get(_SLOT, _ABSENT)
            if getattr(prev, "_plait_region", False):
                continue  # NOTE: another thread's plan cannot be running (the tree's lock)
            installed.append((m, prev))
            m.__dict__[_SLOT] = self._dispatcher(m, prev)
        return installed

    def _call_region(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        tree = self.tree
        engine = tree.engine_for(module)
        # NOTE: the region reads its module's forward as written (its own slot is taken out
        # while it runs): the forward an instance attribute or the class holds is a Python
        # value its capture reads and its guards check (a forward replaced on the instance,
        # as accelerate's hooks do, or on the class, is a new specialization, and an
        # identical block with a forward of its own never takes another block's program).
        own = _hide(module)
        try:
            hooked = _hooked_below(module)
            if hooked is not None:
                # NOTE: a hook's Python must run on each call: the module is split instead, so
                # that the hooked submodule is a region of its own with its hooks run eagerly
                return engine.split_call(args, kwargs, hooked)
            # NOTE: the region's capture and guards must see its submodules as written: the
            # dispatch slots of this and enclosing plans are taken out below it while it runs.
            hidden = _hide_below(module)
            split = engine.split_calls
            try:
                with tree.counting(None):
                    out = engine.region_call(args, kwargs)
            finally:
                _restore(hidden)
            if engine.split_calls == split:  # NOTE: it ran as the region (not split, for an object)
                engine.ran_whole()
            return out
        finally:
            _restore(own)


# NOTE: arguments a region's guards compare by value; any other object is compared by identity
_VALUES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def object_argument(leaves: list[Any], paths: list[str], region: bool = True) -> str | None:
    """Why a call cannot be compiled: a tensor argument that is not strided (sparse, nested,
    oneDNN's: compiled programs take strided tensors); in a region call, also an argument that
    is an object (a key-value cache, a config) its Python may change (``cache.update(...)``),
    which a compiled call would not. None when every argument is a tensor or a plain value."""
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, torch.Tensor):
            if leaf.layout is not torch.strided or leaf.is_nested:
                kind = "nested" if leaf.is_nested else str(leaf.layout).removeprefix("torch.")
                return (
                    f"its call passes {path}, a {kind} tensor (compiled programs take strided ones)"
                )
            continue
        if region and not isinstance(leaf, _VALUES):
            return (
                f"its call passes {path}, a {type(leaf).__name__} object (its Python may change "
                "it on each call), so it runs split"
            )
    return None


def _hooked_below(module: nn.Module) -> str | None:
    """Why ``module`` cannot be one region now: a submodule with hooks (they would run only at
    capture inside a region); None when there is none."""
    for name, m in module.named_modules():
        if m is module:
            continue
        for table in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks"):
            if m.__dict__.get(table):
                return f"its submodule {name} has hooks (they run eagerly, on each call)"
        if m.__dict__.get("_backward_hooks"):
            return f"its submodule {name} has hooks (they run eagerly, on each call)"
    return None


def _bound_forward(module: nn.Module, prev: Any) -> Callable[..., Any]:
    """The forward ``module`` had before a dispatch slot replaced it: its own (an instance
    attribute) or its class's."""
    if prev is _ABSENT:
        return type(module).forward.__get__(module)
    return prev


def call_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module``'s own forward (never a dispatch slot): what a region engine captures and
    runs eagerly. Its hooks ran already, eagerly, in ``nn.Module.__call__``.

    NOTE: read as ``module.forward``, through the module (its dispatch slot is out while its
    region runs), so that capture records the read: the instance's own forward, else the
    class's, is guarded like any attribute the program reads."""
    slot = module.__dict__.get(_SLOT, _ABSENT)
    if getattr(slot, "_plait_region", False):  # NOTE: not from a region call (slot out)
        return _bound_forward(module, slot._plait_original)(*args, **kwargs)
    return module.forward(*args, **kwargs)


def _hide(module: nn.Module) -> list[tuple[nn.Module, Any]]:
    """Take out ``module``'s own dispatch slot (restored by :func:`_restore`)."""
    slot = module.__dict__.get(_SLOT)
    if slot is None or not getattr(slot, "_plait_region", False):
        return []
    if slot._plait_original is _ABSENT:
        del module.__dict__[_SLOT]
    else:
        module.__dict__[_SLOT] = slot._plait_original
    return [(module, slot)]


def _hide_below(module: nn.Module) -> list[tuple[nn.Module, Any]]:
    hidden = []
    for m in module.modules():
        if m is module:
            continue
        slot = m.__dict__.get(_SLOT)
        if slot is not None and getattr(slot, "_plait_region", False):
            hidden.append((m, slot))
            if slot._plait_original is _ABSENT:
                del m.__dict__[_SLOT]
            else:
                m.__dict__[_SLOT] = slot._plait_original
    return hidden


def _restore(saved: list[tuple[nn.Module, Any]]) -> None:
    """Each slot as it was: the instance dict's own key removed where it had none, so that the
    module reads as it did at capture."""
    for m, value in reversed(saved):
        if value is _ABSENT:
            m.__dict__.pop(_SLOT, None)
        else:
            m.__dict__[_SLOT] = value


def can_split(module: Any, prog: CapturedProgram) -> bool:
    """Whether a fallback of ``module``'s call is split into regions: a module with submodules
    whose capture fell back for a reason a submodule's capture may not share (not autocast)."""
    if not isinstance(module, nn.Module) or prog.has_graph:
        return False
    err = prog.fallback_error
    if getattr(err, "operation", None) == "torch.autocast":
        return False
    if any(is_lazy(t) for t in (*module.parameters(), *module.buffers())):
        return False  # NOTE: a lazy module's first call shapes it; the next call captures whole
    return any(True for _ in module.children())
