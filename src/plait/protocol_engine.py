"""The artifact protocol's half of a compiled callable's engine (the public half is
:mod:`plait.compiled_callables`; :mod:`plait.conformance` drives both): the specializations with
the user calls each ran, the guards one fails for a call, a call pinned to one specialization,
and the specialization a call would make.

NOTE: a mixin of ``plait.api._Engine``; it reads the engine's attributes (``adapter``,
``specializations``, ``fetch``, ``fn``, ``lock``) and calls its ``_tree_lock``, ``_admitted``,
``_recapture`` and ``_run``. Example (a pinned call never captures another specialization):
    >>> import torch, plait
    >>> f = plait.compile(lambda x: x + 1, backend="eager", options={"cache": False})
    >>> use = f.specialize(torch.ones(2))
    >>> float(f.call_specialization(use.key, torch.ones(2))[0]), use.calls
    (2.0, 0)
    >>> f.guard_failures(use.key, torch.ones(2)), len(f.specializations)
    ([], 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from plait.capturing import CAPTURE_LOCK
from plait.errors import CompiledInputError, RecompileLimitError, UnknownKeyError
from plait.frontend import InputAdapter
from plait.guards.guard import GuardEnv
from plait.specialization import Specialization, SpecializationMissError, SpecializationUse


class ProtocolEngine:
    """The artifact protocol methods of the compiled callable's engine (see the module's
    NOTE)."""

    adapter: InputAdapter
    specializations: list[Specialization]
    fetch: Callable[[], Sequence[torch.Tensor]]
    fn: Any
    lock: Any

    def _tree_lock(self) -> Any:
        raise NotImplementedError

    def _admitted(
        self, env: GuardEnv
    ) -> tuple[Specialization, GuardEnv, Sequence[torch.Tensor]] | None:
        raise NotImplementedError

    def _recapture(
        self, env: GuardEnv, paths: list[str], args: tuple, kwargs: dict
    ) -> tuple[Specialization, GuardEnv, Sequence[torch.Tensor]] | None:
        raise NotImplementedError

    def _run(
        self,
        s: Specialization,
        env: GuardEnv,
        state: Sequence[torch.Tensor],
        args: tuple,
        kwargs: dict,
    ) -> Any:
        raise NotImplementedError

    def _flatten(self, args: tuple, kwargs: dict) -> tuple[Any, list[Any], list[str]]:
        try:
            return self.adapter.flatten(args, kwargs)
        except TypeError as exc:
            raise CompiledInputError(str(exc)) from None

    def uses(self) -> list[SpecializationUse]:
        return [SpecializationUse.of(i, s) for i, s in enumerate(list(self.specializations))]

    def _by_key(self, key: str) -> Specialization:
        for s in list(self.specializations):
            if s.key == key:
                return s
        known = [s.key for s in self.specializations]
        raise UnknownKeyError(f"{self.adapter.name}: no specialization {key!r}; known: {known}")

    def _pinned_env(
        self, key: str, args: tuple, kwargs: dict
    ) -> tuple[Specialization, GuardEnv, Sequence[torch.Tensor], list[str]]:
        s = self._by_key(key)
        spec, leaves, _ = self._flatten(args, kwargs)
        state = self.fetch()
        env = GuardEnv(spec, leaves, self.fn, state)
        failed = [] if s.guards.holds(env) else s.guards.explain(env) or ["a guard failed"]
        return s, env, state, failed

    def guard_failures(self, key: str, args: tuple, kwargs: dict) -> list[str]:
        return self._pinned_env(key, args, kwargs)[3]

    def call_specialization(self, key: str, args: tuple, kwargs: dict) -> Any:
        s, env, state, failed = self._pinned_env(key, args, kwargs)
        if failed:
            raise SpecializationMissError(
                f"{self.adapter.name}: specialization {s.key} does not admit this call (it "
                f"would compile another): {'; '.join(failed)}"
            )
        return self._run(s, env, state, args, kwargs)

    def specialize(self, args: tuple, kwargs: dict) -> SpecializationUse:
        spec, leaves, paths = self._flatten(args, kwargs)
        env = GuardEnv(spec, leaves, self.fn, self.fetch())
        with self._tree_lock(), CAPTURE_LOCK, self.lock:
            found = self._admitted(env) or self._recapture(env, paths, args, kwargs)
        if found is None:
            raise RecompileLimitError(
                f"{self.adapter.name}: reached the recompile limit; no specialization to make"
            )
        s = found[0]
        return SpecializationUse.of(self.specializations.index(s), s)
