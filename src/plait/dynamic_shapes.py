"""Dynamic shapes in the specialization engine (:class:`DynamicShapes`, a base of
``plait.api``'s engine): which dims a capture makes symbolic (``dynamic=``; automatic dynamic
for ``dynamic=None``), what a specialization reports about them, the automatic record kept in the
artifact cache, and what happens when Stax cannot compile a program's symbolic sizes.

Automatic dynamic: the first call captures static; a call that misses every specialization
marks the input dims whose sizes differ from a captured static size, and the capture that
follows makes them symbolic. That specialization's manifest (``options.dynamic_dims``) and its
recompile reason name each dim, its symbol and the sizes seen. The dims are remembered in the
artifact cache under the callable's front key without sizes, so a new process (at any size)
captures them symbolic from its first call and finds the compiled artifact there. A mark under a
cheap key (the callable's class or name, its inputs' ranks and dtypes) says that such a record
may exist: a callable without one does not describe its module to find out.

Never silent: where Stax (the default backend) cannot compile the symbolic program, automatic
dynamic specializes every size from then on, and a ``dynamic=`` the user gave runs the
reference interpreter; both warn (:class:`~plait.errors.CaptureFallbackWarning`) and say so in
the manifest.

Example:
    >>> import torch, plait
    >>> f = plait.compile(lambda x: (x * 2).relu(), options={"cache": False})
    >>> for n in (4, 8, 16):
    ...     _ = f(torch.randn(n, 3))
    >>> len(f.specializations), f.specializations[1].manifest.options["dynamic_dims"]
    (2, {'x.shape[0]': {'symbol': 's0', 'sizes_seen': [4, 8]}})
"""

from __future__ import annotations

import contextlib
import inspect
import json
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from plait.backends import Compiled
from plait.cache import Store
from plait.cache.key import canonical_json, text_digest
from plait.cache.snapshots import front_parts
from plait.errors import CaptureFallbackWarning
from plait.frontend import CapturedProgram, ModuleState
from plait.frontend.dynamic_dims import AutomaticDims, DimPolicy
from plait.guards import GuardEnv
from plait.snapshots.code_digest import code_digest as digest_of_code
from plait.snapshots.fingerprint import Unpinnable


class SymbolicRefused(Exception):
    """Stax, chosen by default, could not compile a program with symbolic sizes."""


def warn_symbolic(what: str) -> None:
    message = f"plait: Stax cannot compile this program with symbolic sizes; {what}"
    warnings.warn(message, CaptureFallbackWarning, stacklevel=6)


def symbol_sizes(prog: CapturedProgram, env: GuardEnv) -> dict[str, int]:
    """The sizes this call gives the program's symbols (by name)."""
    plan = prog.guard_plan
    if plan is None:
        return {}
    out = {}
    for sym in plan.bindings:
        i, d, _ = plan.symbols[sym]
        leaf = env.leaves[i]
        if isinstance(leaf, torch.Tensor) and d < leaf.dim():
            out[str(sym)] = int(leaf.shape[d])
    return out


class DynamicShapes:
    """The dynamic-shape part of a specialization engine (see the module doc)."""

    automatic: AutomaticDims | None
    dynamic: Any
    fn: Any
    backend: str | None
    region: bool
    state: ModuleState | None

    def _capture(
        self, args: tuple, kwargs: dict, record: bool, seconds: dict[str, float]
    ) -> tuple[CapturedProgram, Any]:
        raise NotImplementedError

    def _compile(
        self,
        prog: CapturedProgram,
        state: Sequence[torch.Tensor],
        store: Store | None,
        env: GuardEnv,
        backend: str | None = None,
        why: str = "requested",
    ) -> Compiled:
        raise NotImplementedError

    def _capture_dynamic(self) -> Any:
        """The ``dynamic=`` of the next capture: automatic dynamic's dims, or the user's."""
        if self.automatic is not None:
            return self.automatic.policy()
        return self.dynamic

    def _dynamic_record(self) -> Any:
        """``dynamic=`` as the front key names it: what the next capture makes symbolic."""
        chosen = self._capture_dynamic()
        if self.automatic is not None and chosen is None:
            return None  # NOTE: a static capture keeps the key it always had
        return DimPolicy.of(chosen).record()

    def _without_symbols(
        self,
        prog: CapturedProgram,
        refused: SymbolicRefused,
        args: tuple,
        kwargs: dict,
        state: Sequence[torch.Tensor],
        env: GuardEnv,
    ) -> tuple[CapturedProgram, Compiled]:
        """NOTE: never silent. Stax could not compile ``prog`` with its symbolic sizes: under
        automatic dynamic, sizes specialize from now on (captured again, static); with
        ``dynamic=`` given, the reference interpreter runs it. Warned and recorded."""
        if self.automatic is not None:
            self.automatic.refused = str(refused)
            warn_symbolic(f"every size specializes from now on: {refused}")
            prog, _ = self._capture(args, kwargs, False, {})
            compiled = self._compile(prog, state, None, env)
            compiled.manifest.options["dynamic_refused"] = str(refused)
            return prog, compiled
        warn_symbolic(f"the reference interpreter runs it: {refused}")
        why = f"stax cannot compile these symbolic shapes: {refused}"
        return prog, self._compile(prog, state, None, env, backend="eager", why=why)

    def _report_dynamic(
        self,
        prog: CapturedProgram,
        compiled: Compiled,
        reason: str | None,
        store: Store | None,
        env: GuardEnv,
    ) -> str | None:
        """Automatic dynamic: record the dims a symbolic specialization took (symbol, sizes
        seen) in its manifest and recompile reason, and remember them in the cache."""
        symbolic = prog.symbolic_dims()
        if self.automatic is None or not symbolic:
            return reason
        report = self.automatic.report(symbolic)
        compiled.manifest.options["dynamic_dims"] = report
        if store is not None:
            self._save_automatic(store, env)
        if reason is None or not report:
            return reason
        made = "; ".join(
            f"{src} is symbolic {r['symbol']} (sizes seen: {', '.join(map(str, r['sizes_seen']))})"
            for src, r in report.items()
        )
        return f"{reason}; automatic dynamic: {made}"

    def _automatic_key(self, env: GuardEnv) -> str | None:
        """The cache key of this callable's automatic dynamic record: its front key with every
        tensor's sizes left out (a new process, at new sizes, finds the dims seen changing)."""
        leaves = [
            torch.empty((1,) * x.dim(), dtype=x.dtype, device="meta").requires_grad_(
                x.requires_grad
            )
            if isinstance(x, torch.Tensor)
            else x
            for x in env.leaves
        ]
        request = {
            "automatic_dynamic": True,
            "backend": self.backend,
            "region": self.region,
            "code": code_digest(self.fn),
        }
        try:
            parts = front_parts(self.fn, env.spec, leaves, request, self.state)
        except Unpinnable:
            return None
        return text_digest(canonical_json(parts))

    def _automatic_index(self, env: GuardEnv) -> str | None:
        """The key of a mark that some callable of this one's class (or name) called with
        inputs of these ranks and dtypes has an automatic record: found in a few microseconds,
        where the record's own key describes the whole module (milliseconds). The mark only
        says where to look; the record is read under its own key."""
        fn = self.fn
        owner = type(fn) if isinstance(fn, torch.nn.Module) else fn
        name = getattr(owner, "__qualname__", None)
        if name is None or "<" in name:
            return None
        leaves = [
            [x.dim(), str(x.dtype), x.requires_grad]
            if isinstance(x, torch.Tensor)
            else type(x).__qualname__
            for x in env.leaves
        ]
        index = {
            "automatic_dynamic_index": True,
            "callable": [getattr(owner, "__module__", None), name],
            "inputs": leaves,
            "backend": self.backend,
            "region": self.region,
        }
        return text_digest(canonical_json(index))

    def _load_automatic(self, store: Store, env: GuardEnv) -> None:
        index = self._automatic_index(env)
        try:
            # NOTE: the mark's header first: most callables have no record, and a read of a
            # missing entry would drop the store's read ahead
            if index is None or store.read_meta(index) is None:
                return
            key = self._automatic_key(env)
            known = key is not None and store.read_meta(key) is not None
            payload = store.get(key) if known and key is not None else None
        except Exception:  # NOTE: a damaged record: the program starts static, as with none
            payload = None
        if payload is not None and self.automatic is not None:
            with contextlib.suppress(ValueError):
                self.automatic.merge_json(json.loads(bytes(payload)))

    def _save_automatic(self, store: Store, env: GuardEnv) -> None:
        key = self._automatic_key(env)
        index = self._automatic_index(env)
        if key is None or index is None or self.automatic is None:
            return
        payload = json.dumps(self.automatic.to_json(), sort_keys=True).encode()
        with contextlib.suppress(OSError, ValueError):
            store.put(key, payload, {"kind": "automatic dynamic dims"})
            store.put(index, b"{}", {"kind": "automatic dynamic mark"})


def code_digest(fn: Any) -> str:
    """A digest of the code ``fn`` runs first (a module's ``forward``, a function's body, nested
    functions' included; :func:`plait.snapshots.code_digest.code_digest`): an automatic dynamic
    record is kept per version of that code, so a function edited under its old name does not
    inherit the sizes its old version saw.

    Example:
        >>> code_digest(lambda x: x + 1) == code_digest(lambda x: x + 1)
        True
    """
    target = type(fn).forward if isinstance(fn, torch.nn.Module) else fn
    target = getattr(target, "__func__", target)
    code = getattr(inspect.unwrap(target), "__code__", None)
    return "" if code is None else digest_of_code(code).hex()[:16]
