"""The two warm starts of a compiled callable in a new process (``options={"warm_start": ...}``).

``"capture"``, the default: capture runs, and the program takes the artifact cache's ordinary
path (a hit loads the compiled artifact). It cannot serve a stale program. ``"fingerprint"``
(opt-in): a snapshot of the captured program (:mod:`plait.cache.snapshots`) replaces capture when
the fingerprint of the model matches the one it was saved for, and is saved after each capture
whose artifact is cacheable; docs/cache.md lists what a fingerprint cannot see."""

from __future__ import annotations

from typing import Any

from plait.backends import Compiled
from plait.cache import Store
from plait.cache.snapshots import front_parts, load_snapshot, save_snapshot
from plait.errors import InvalidOptionError
from plait.frontend import CapturedProgram, ModuleState
from plait.guards.guard import GuardEnv
from plait.snapshots.deps import CodeRecorder
from plait.snapshots.fingerprint import Unpinnable

# NOTE: "capture": a warm start captures, then loads the compiled artifact (sound by
# construction); "fingerprint": a saved snapshot replaces capture when the fingerprint of the
# model matches (opt-in: docs/cache.md lists what a fingerprint cannot see)
WARM_STARTS = ("capture", "fingerprint")


def warm_start_option(value: Any) -> str:
    """The ``warm_start`` option, checked (a wrong value fails at ``plait.compile``)."""
    if value not in WARM_STARTS:
        raise InvalidOptionError(f"warm_start must be one of {WARM_STARTS}, got {value!r}")
    return str(value)


def from_snapshot(
    warm_start: str,
    store: Store | None,
    request: dict[str, Any],
    fn: Any,
    env: GuardEnv,
    paths: list[str],
    state: ModuleState | None,
) -> tuple[CapturedProgram | None, dict[str, Any] | None, str]:
    """The captured program saved for this call's front key, if one holds (else None), the
    front key's parts (None: no snapshot is read or saved, by default or because this program
    cannot have one) and what happened, for the manifest's ``cache.capture``."""
    if store is None:
        return None, None, "captured: no cache"
    if warm_start != "fingerprint":
        return None, None, "captured (the default warm start)"
    try:
        parts = front_parts(fn, env.spec, env.leaves, request, state)
    except Unpinnable as exc:
        return None, None, f"captured: {exc}"
    prog, note = load_snapshot(store, parts, env.spec, env.leaves, paths, state, env.state)
    return prog, parts, note


def save_after_capture(
    store: Store,
    parts: dict[str, Any],
    prog: CapturedProgram,
    recorder: CodeRecorder | None,
    compiled: Compiled,
    note: str,
) -> str:
    """After a capture: save the program for warm starts when its artifact is cacheable."""
    if recorder is None or compiled.manifest.cache.get("status") not in ("hit", "miss"):
        return note
    try:
        artifact = compiled.manifest.cache.get("key")
        read = frozenset(recorder.names)
        key = save_snapshot(store, parts, prog, recorder.deps(), artifact, read)
    except Unpinnable as exc:
        return f"{note}; no snapshot: {exc}"
    except (OSError, ValueError) as exc:
        return f"{note}; the snapshot could not be saved: {exc}"
    return f"{note}; snapshot {key[:16]}… saved"
