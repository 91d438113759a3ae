"""The callable ``plait.load`` returns: an exported program bound to its weights, behind its
guards, run by the native backend of this machine.

Each call binds its arguments to the exported signature, flattens them and checks the guards the
artifact carries (structure, every tensor's dtype, shape and device, the sizes the program
compared, plain arguments' values, ``requires_grad``): a call that fails one is refused with a
:class:`~plait.errors.CompiledInputError` naming each failed guard, expected and actual. The
program runs with gradients off (an exported program is an inference program: an input that
requires grad is refused, never silently detached) and autocast off (capture wrote its casts).

The program is built for the settings it was loaded under (thread count, matmul precision,
oneDNN and determinism flags: what a compile reads). A call under other settings builds it
again for those, from the IR, as ``plait.compile`` would recompile: each build is one entry of
:meth:`LoadedProgram.explain`, with its reason; past eight, a call fails loudly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.errors import CompiledInputError, RecompileLimitError
from plait.export.calling import Binder
from plait.frontend import pytree
from plait.frontend.output_views import Bases, in_eager_layout
from plait.guards.guard import GuardEnv, GuardSet
from plait.manifest import Explanation, Manifest, SpecializationReport

BUILD_LIMIT = 8
# NOTE: an executor takes the program's inputs, in the graph's input order, and returns its outputs
Executor = Callable[[list[Any]], Sequence[Any]]


@dataclass
class Build:
    """The program as built for one set of call settings (``settings``: their guards)."""

    executor: Executor
    settings: GuardSet
    manifest: Manifest
    reason: str | None = None
    program: Any = None  # the StaxProgram, where Stax runs it
    calls: int = 0


def of_input(kind: str, ref: Any, leaves: Sequence[Any]) -> torch.Tensor:
    """An output leaf that is input leaf ``ref`` (``kind`` ``leaf``) or a view of one
    (``alias``: ``(i, size, stride, offset, dtype)``)."""
    if kind == "leaf":
        return leaves[ref]
    i, size, stride, offset, dtype = ref
    base = leaves[i].detach()
    if dtype is not None:
        base = base.view(dtype)
    return base.as_strided(size, stride, base.storage_offset() + offset)


@dataclass
class Bindings:
    """Where each program input comes from (a leaf of the call, by index, or a weight), and
    how each output leaf comes back (``("output", (index, tracer, fresh, layout))``,
    ``("leaf", i)``, ``("alias", (i, size, stride, offset, dtype))``, ``("view", ...)`` (a view
    of another output, as :mod:`plait.frontend.output_views` reads it) or ``("value", v)``)."""

    inputs: list[tuple[int | None, Any]]
    out_spec: Any
    out_leaves: list[tuple[str, Any]]


@dataclass
class LoadedProgram:
    """An exported program, loaded: call it as the exported callable was called.

    ``semantic_hash`` names the program (minted at capture, carried unchanged); ``digest`` the
    artifact (what ``trust=`` names); ``native`` says whether the artifact's kernels were loaded
    or the kernels were built here from the IR, and why; ``references`` are the stored reference
    cases and ``contract`` the numerical contract they are judged under
    (:func:`plait.verify`). :meth:`explain` (and ``plait.explain``) reports each build.
    """

    name: str
    digest: str
    semantic_hash: str
    format_version: int
    binder: Binder
    guards: GuardSet
    bindings: Bindings
    make_build: Callable[[str | None], Build]
    native: dict[str, Any]
    references: Any
    contract: Any
    notes: list[str] = field(default_factory=list)
    builds: list[Build] = field(default_factory=list)
    current: Build | None = None  # NOTE: the build the latest call's settings chose
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.builds:
            self.builds.append(self.make_build(None))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            try:
                spec, leaves, _ = self.binder.flatten(args, kwargs)
            except TypeError as exc:
                raise CompiledInputError(str(exc)) from None
            env = GuardEnv(spec, leaves)
            if not self.guards.holds(env):
                raise CompiledInputError(self._mismatch(env))
            build = self.current or self.builds[-1]
            if not build.settings.holds(env):
                build = self._for_settings(env)
            build.calls += 1
            return self._run(build.executor, leaves)

    def _mismatch(self, env: GuardEnv) -> str:
        failed = self.guards.explain(env) or ["a guard failed"]
        text = f"{self.name}: this call does not match the exported program: " + "; ".join(failed)
        if any(".requires_grad == False" in f for f in failed):
            text += (
                " (an exported program is an inference program: gradients do not flow through "
                "it; pass the tensor's .detach())"
            )
        return text

    def _for_settings(self, env: GuardEnv) -> Build:
        with self._lock:
            for build in reversed(self.builds):
                if build.settings.holds(env):
                    self.current = build
                    return build
            reason = "; ".join(self.builds[-1].settings.explain(env)) or "settings changed"
            if len(self.builds) >= BUILD_LIMIT:
                raise RecompileLimitError(
                    f"{self.name}: built {BUILD_LIMIT} times for changing settings; this call's "
                    f"differ again ({reason}): set them once, before the first call"
                )
            build = self.make_build(reason)
            self.builds.append(build)
            self.current = build
            return build

    def _run(self, executor: Executor, leaves: Sequence[Any]) -> Any:
        values = [leaves[i] if i is not None else weight for i, weight in self.bindings.inputs]
        results = list(executor(values))
        tensors = {id(v) for v in leaves if isinstance(v, torch.Tensor)}
        by_tracer: dict[int, Any] = {}
        handed_out: set[int] = set()
        views = [ref for kind, ref in self.bindings.out_leaves if kind == "view"]
        bases = Bases(views, results, tensors, handed_out) if views else None
        out: list[Any] = []
        for kind, ref in self.bindings.out_leaves:
            if kind == "value":
                out.append(ref)
            elif kind in ("leaf", "alias"):
                out.append(of_input(kind, ref, leaves))
            elif kind == "view":
                assert bases is not None
                out.append(bases.view(ref))
            else:
                index, tracer, fresh, layout = ref
                if tracer in by_tracer:
                    out.append(by_tracer[tracer])
                    continue
                if bases is not None and index in bases.layouts:
                    by_tracer[tracer] = bases.base(index)  # NOTE: the base other outputs view
                    out.append(by_tracer[tracer])
                    continue
                t = in_eager_layout(results[index], layout)
                # NOTE: a result eager gives memory of its own never comes back as an input's
                # memory or as another output's
                if fresh and isinstance(t, torch.Tensor) and id(t) in tensors | handed_out:
                    t = t.clone()
                by_tracer[tracer] = t
                handed_out.add(id(t))
                out.append(t)
        return pytree.unflatten(self.bindings.out_spec, out)

    def input_outputs(self, leaves: Sequence[Any]) -> dict[int, torch.Tensor]:
        """The output leaves (by position) that are the call's input ``leaves`` or views of
        them, as eager PyTorch gives them: what a stored reference output must be rebuilt as."""
        return {
            j: of_input(kind, ref, leaves)
            for j, (kind, ref) in enumerate(self.bindings.out_leaves)
            if kind in ("leaf", "alias")
        }

    def explain(self) -> Explanation:
        """Each build of the program, with its guards, the reason it was built and its
        manifest (the native kernels' fate is its ``cache`` entry)."""
        reports = []
        for i, b in enumerate(self.builds):
            texts = [*self.guards.texts(), *b.settings.texts()]
            reports.append(
                SpecializationReport(i, b.reason, texts, b.manifest, self.guards.evaluator)
            )
        return Explanation(f"loaded artifact {self.name}", reports)

    def __plait_explanation__(self) -> Explanation:
        return self.explain()
