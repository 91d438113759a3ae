"""A module's state as graph inputs: parameters and buffers by their state_dict paths.

:class:`ModuleState` lists each distinct parameter and buffer tensor once (tied weights share one
entry, named by the first path), every slot that holds it, the submodules with their training
flags, and the parent→child edges, so that each call can fetch the *live* tensors (parameters
are shared with the module, never copied) and guard that the module was not restructured.

Example:
    >>> import torch
    >>> ms = ModuleState(torch.nn.Linear(2, 3))
    >>> [(e.path, e.kind) for e in ms.entries]
    [('weight', 'param'), ('bias', 'param')]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from plait.errors import GraphCaptureError, UnknownNameError
from plait.frontend.pyvalues import _MAX_DEPTH, _is_value_object


@dataclass
class StateEntry:
    path: str
    kind: str  # "param" | "buffer"
    slots: list[tuple[nn.Module, str]] = field(default_factory=list)

    def get(self) -> torch.Tensor:
        owner, attr = self.slots[0]
        table = owner._parameters if self.kind == "param" else owner._buffers
        t = table[attr] if attr in table else None  # noqa: SIM401  # NOTE: TorchScript: no .get
        if t is None:
            raise UnknownNameError(
                f"{self.path} is no longer a {'parameter' if self.kind == 'param' else 'buffer'}"
                " of the module (deleted or set to None)"
            )
        return t


class ModuleState:
    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.modules: list[tuple[str, nn.Module]] = list(module.named_modules())
        self.edges: list[tuple[nn.Module, str, nn.Module]] = []
        self.entries: list[StateEntry] = []
        by_id: dict[int, StateEntry] = {}
        for prefix, mod in self.modules:
            for key, child in mod._modules.items():
                if child is not None:
                    self.edges.append((mod, key, child))
            for kind, table in (("param", mod._parameters), ("buffer", mod._buffers)):
                for attr, t in table.items():
                    if t is None:
                        continue
                    entry = by_id.get(id(t))
                    if entry is None:
                        entry = StateEntry(f"{prefix}.{attr}" if prefix else attr, kind)
                        by_id[id(t)] = entry
                        self.entries.append(entry)
                    entry.slots.append((mod, attr))
        self.layout = self._layout()
        # NOTE: each slot of a tensor several slots hold (tied weights), with that tensor: one
        # entry (one graph input) stands for them all, read from its first slot, so a slot set
        # to another tensor unties what these entries cannot follow (the guards and
        # structure_intact check it)
        self.tied: list[tuple[dict[str, Any], str, torch.Tensor]] = [
            (table, attr, table[attr])
            for e in self.entries
            if len(e.slots) > 1
            for table, attr in self._tables(e)
        ]
        # NOTE: ``status["current"] is self`` until structure_intact finds the module changed
        # (the engine then reads its state again): the guards of the programs captured with
        # these entries check it with the submodule edges, and fail from then on
        self.status: dict[str, Any] = {"current": self}

    def fetch(self) -> list[torch.Tensor]:
        """The live tensors, in entry order."""
        return [e.get() for e in self.entries]

    def training_flags(self) -> tuple[bool, ...]:
        return tuple(m.training for _, m in self.modules)

    def structure_intact(self) -> bool:
        """Whether the entries still name the module's parameters and buffers: the captured
        submodules, each tied tensor in all its slots, and in each module the same parameter
        and buffer names holding tensors (a slot set to None, deleted or registered, or one
        slot of tied weights set to another tensor, changes the entries). Once not, these
        entries are not :attr:`current`: the state is read by another ``ModuleState``'s
        entries from then on, in another order."""
        intact = (
            all(p._modules.get(k) is c for p, k, c in self.edges)
            and all(table.get(attr) is t for table, attr, t in self.tied)
            and self._layout() == self.layout
        )
        if not intact:
            self.status.clear()
        return intact

    @property
    def current(self) -> bool:
        return self.status.get("current") is self

    def _layout(self) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        return [
            (
                tuple(k for k, t in m._parameters.items() if t is not None),
                tuple(k for k, t in m._buffers.items() if t is not None),
            )
            for _, m in self.modules
        ]

    def module_path(self, i: int) -> str:
        name = self.modules[i][0]
        return "self" if not name else f"self.{name}"

    @contextmanager
    def restored_on_failure(self, made: Callable[[Any], bool]) -> Iterator[None]:
        """On a failure inside, each module attribute or buffer slot that now holds a value
        ``made`` tells (a tensor of the failed capture), alone or in what it holds
        (:func:`holds_made`), is put back as it was (removed where it was absent).

        NOTE: a capture that fails runs the program again (a retry, or the eager fallback): a
        value it memoized on a module (``self.cache = t`` after ``getattr(self, "cache",
        None)``, as Hugging Face's LongRoPE and dynamic RoPE do) must not reach that run, where
        its use is refused. Other side effects of the failed run stay, as in eager."""
        tables = [t for _, m in self.modules for t in (m.__dict__, m._buffers)]
        before = [dict(t) for t in tables]
        try:
            yield
        except BaseException:
            for table, old in zip(tables, before):
                for key in [k for k, v in table.items() if holds_made(v, made)]:
                    if key in old:
                        table[key] = old[key]
                    else:
                        del table[key]
            raise

    @contextmanager
    def swapped(
        self, tensors: Sequence[Any], keep: Callable[[], bool] = lambda: False
    ) -> Iterator[None]:
        """Put ``tensors[i]`` in every slot of entry ``i`` for the duration; restore after.

        NOTE: raises when the program assigned another tensor to a slot meanwhile (state the
        capture could not roll back), unless ``keep()`` (a call that went on eagerly: the
        assignment is eager's, and stays)."""
        saved = [(e, self._tables(e)) for e in self.entries]
        originals = [e.get() for e in self.entries]
        for (_, tables), t in zip(saved, tensors):
            for table, attr in tables:
                table[attr] = t
        reassigned: list[str] = []
        try:
            yield
        finally:
            for (entry, tables), t, orig in zip(saved, tensors, originals):
                for table, attr in tables:
                    if table.get(attr) is not t:
                        reassigned.append(entry.path)
                        if keep():
                            continue
                    table[attr] = orig
        if reassigned and not keep():
            raise GraphCaptureError(
                "module state",
                f"the program assigned new tensors to {sorted(set(reassigned))}; "
                "plait cannot capture changes to module attributes",
                kind="limitation",
            )

    def _tables(self, entry: StateEntry) -> list[tuple[dict, str]]:
        return [
            ((m._parameters if entry.kind == "param" else m._buffers), a) for m, a in entry.slots
        ]


def holds_made(value: Any, made: Callable[[Any], bool]) -> bool:
    """Whether ``value``, or anything it holds (the items of a list, tuple, set or dict, the
    attributes of a user object, a dataclass or a ``SimpleNamespace``, at any depth), is one
    ``made`` tells."""
    stack, seen = [(value, 0)], set()
    while stack:
        v, depth = stack.pop()
        if made(v):
            return True
        if depth > _MAX_DEPTH or id(v) in seen:
            continue
        seen.add(id(v))
        for item in opened(v):
            stack.append((item, depth + 1))
    return False


def opened(v: Any) -> Iterable[Any]:
    """What a value the program reads holds by its contents (its value key walks them): the
    items of a list, tuple or set, a dict's values, a user object's attributes; nothing of a
    tensor, a module or a library's object."""
    if isinstance(v, (list, tuple, set, frozenset)):
        return v
    if isinstance(v, dict):
        return dict.values(v)  # NOTE: a subclass's own values() may do more
    if isinstance(v, (torch.Tensor, nn.Module, type)) or not _is_value_object(v, type(v)):
        return ()
    namespace = getattr(v, "__dict__", None)
    return namespace.values() if type(namespace) is dict else ()


def backward_hooked(module: nn.Module) -> str | None:
    """The first module of the tree (``module`` itself included) with a backward hook or
    pre-hook of its own, named for a message (nn.Module wraps such a module's inputs in a
    backward-hook function, on each call with grad), or None."""
    for path, m in module.named_modules():
        if m.__dict__.get("_backward_hooks") or m.__dict__.get("_backward_pre_hooks"):
            return f"submodule {path}" if path else "the module"
    return None
