"""The regional half of a compiled callable's engine (:mod:`plait.regions` holds the tree and
the plans): a region's name and lock, a region refused or split into its submodules, the engines
of child regions, and the artifact identical blocks share.

NOTE: a mixin of ``plait.api._Engine``; it reads the engine's attributes (``tree``, ``region``,
``path``, ``fn``, ``regions``, ``refused``, ``hooked``, ``share``, ``requested``) and calls its
``_eager``. Example (a module whose forward branches on data compiles its children):
    >>> import torch, plait
    >>> class Gate(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         return self.a(x) if x.sum() > 0 else self.b(x)
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     m = plait.compile(Gate(), backend="eager", options={"cache": False})
    ...     _ = m(torch.ones(2, 4)), m(torch.ones(2, 4))  # NOTE: the first goes on eagerly
    >>> [(r["module"], r["status"]) for r in plait.explain(m).regions["regions"]]
    [('a', 'compiled')]
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from plait.errors import CaptureFallbackWarning
from plait.frontend import CapturedProgram
from plait.guards.guard import Evaluators, GuardEnv
from plait.regions import RegionPlan
from plait.specialization import Specialization


class RegionEngine:
    """The region methods of the compiled callable's engine (see the module's NOTE)."""

    tree: Any
    region: bool
    path: str
    fn: Any
    regions: RegionPlan | None
    refused: str | None
    hooked: str | None
    split_calls: int
    share: bool
    requested: tuple
    guard_evaluators: Evaluators | None
    _refusal_warned: bool
    _unsupported_warned: bool = False

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def _region_name(self) -> str | None:
        return f"{self.path} ({type(self.fn).__name__})" if self.region else None

    def _tree_lock(self) -> Any:
        """NOTE: taken before the capture lock, as a regional run takes them: a capture never
        runs while another thread's regional run has dispatch slots set."""
        return self.tree.lock if self.tree is not None else contextlib.nullcontext()

    def _refuse(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """A region whose capture or compile raised: it runs eagerly from now on, split into
        its own regions, warned once and reported as a boundary."""
        if not self._refusal_warned:
            self._refusal_warned = True
            self.refused = reason
            assert self.tree is not None
            self.tree.warn(f"plait runs region {self._region_name()} eagerly: {self.refused}")
            module = self.fn
            if self.regions is None and isinstance(module, nn.Module):
                assert self.tree is not None
                if any(True for _ in module.children()):
                    self.regions = RegionPlan(self.tree, module, self.path)
        return self._eager(args, kwargs)

    def unsupported_call(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """A call with an argument no compiled program takes (``reason``): a region runs split,
        a whole program eagerly, warned once."""
        if self.tree is not None and self.region:
            return self.split_call(args, kwargs, reason)
        if not self._unsupported_warned:
            self._unsupported_warned = True
            warnings.warn(f"plait runs this call eagerly: {reason}", CaptureFallbackWarning, 3)
        return self._eager(args, kwargs)

    def split_call(self, args: tuple, kwargs: dict, reason: str) -> Any:
        """This call of a region runs its module's Python eagerly with its submodules as
        regions (``reason``: a submodule has hooks, an argument is an object); reported as a
        boundary and as the region's status while its calls run so, warned once."""
        assert self.tree is not None
        if self.hooked is None and not self.split_calls:
            self.tree.warn(f"plait runs region {self._region_name()} split: {reason}")
        self.split_calls += 1
        if self.hooked != reason:
            self._ran_otherwise(reason)
        module = self.fn
        if self.regions is None and isinstance(module, nn.Module):
            if any(True for _ in module.children()):
                self.regions = RegionPlan(self.tree, module, self.path)
            self.tree.version += 1
        return self._eager(args, kwargs)

    def ran_at_capture(self) -> None:
        """This call's Python ran at capture, refused and gone on eagerly (its regions, where
        it has any, run from its next call on): a region's ops ran uncounted
        (:meth:`plait.regions.op_counts.OpCounts.uncounted`)."""
        if self.tree is not None and self.region:
            self.tree.uncounted()

    def ran_whole(self) -> None:
        """A call of this region ran as the region again (its hooks were removed): what
        ``plait.explain`` reports of it follows."""
        if self.hooked is not None:
            self._ran_otherwise(None)

    def _ran_otherwise(self, reason: str | None) -> None:
        """The region's calls run split now (``reason``) or as the region again (None): its
        status, boundary and ops are reported anew (the ops measured again on the next call
        of the root's plan, if this one is not measuring them)."""
        self.hooked = reason
        assert self.tree is not None
        self.tree.ran_otherwise()

    def _make_region(self, module: nn.Module, path: str, share: bool) -> Any:
        """A region engine with this engine's backend and options; identical blocks keep
        their parameters as inputs (one artifact for all), unless freeze was requested."""
        backend, dynamic, mode, options = self.requested
        options = dict(options)
        if share:
            options.setdefault("freeze", False)
        # NOTE: a region's calls are its parent's (a new object each call recompiles it): past
        # its limit it runs eagerly, split, warned and reported, unless "raise" was requested
        options.setdefault("on_recompile_limit", "eager")
        engine: Any = type(self)  # NOTE: the engine class this mixin is part of
        return engine(
            module, backend, False, dynamic, mode, options, tree=self.tree, path=path, share=share
        )

    def _shared_specialization(
        self,
        prog: CapturedProgram,
        env: GuardEnv,
        state: Sequence[torch.Tensor],
        reason: str | None,
        settings: dict[str, Any],
    ) -> Specialization | None:
        """A specialization of this block on the artifact an identical block compiled for the
        same program, when there is one and the guards of both hold for this call."""
        if not self.share or self.tree is None:
            return None
        compiled = self.tree.shared_artifact(self, prog, settings)
        if compiled is None:
            return None
        spec = Specialization(prog, compiled, reason, settings, evaluators=self.guard_evaluators)
        if not spec.guards.holds(GuardEnv(env.spec, env.leaves, self.fn, state)):
            return None
        self.tree.counts["artifacts_shared"] += 1
        return spec
