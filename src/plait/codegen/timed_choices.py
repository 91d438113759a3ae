"""Library choices made by timing, remembered per machine: the first compile on a machine that
times a call decides, and every later compile of that call there replays the decision (another
process, a rebuild after a refused cache entry, an exported artifact's load). Timings move with
the machine's load; without this, two compiles of one program on one machine could pick
different libraries and compute different bits (each within the contract).

A decision is keyed by the oracle's stage, the rival's name, the call's signature
(:mod:`plait.codegen.call_signature`) and the machine: its CPU, PyTorch's version and thread
count, and the oneDNN and MKL environment variables (they narrow the kernels those pick). It
lives in this process and in ``<kernel cache>/timed/`` (one small JSON file each, created once:
of two processes deciding at the same time, the first file written wins and both use it; of
two threads, the first decision remembered, even without a writable cache). Clearing the
kernel cache times again. A file there that is not a decision's (damaged, or not a small
regular file: see :meth:`TimedChoices._load`) is never trusted nor replaced: the call is timed
again and its decision goes beside it (:data:`SLOTS`), where every process finds it.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> store = TimedChoices(Path(tempfile.mkdtemp()))
    >>> store.decide(("timed", "MKL", ("linear", (8, 4))), lambda: "MKL was faster")
    'MKL was faster'
    >>> store.decide(("timed", "MKL", ("linear", (8, 4))), lambda: None)  # replayed
    'MKL was faster'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

import torch

from plait.ir.private_files import FILE_MODE, private_dir, private_subdir, read_regular

# NOTE: environment variables the timed libraries read to pick their kernels (oneDNN's
# ONEDNN_MAX_CPU_ISA, MKL's MKL_ENABLE_INSTRUCTIONS and MKL_CBWR, ...)
_LIBRARY_ENV = ("ONEDNN_", "DNNL_", "MKLDNN_", "MKL_")


def machine() -> tuple[str, ...]:
    """What a timing depends on besides the call: the CPU (model and feature flags), PyTorch,
    its thread count, and the timed libraries' environment variables."""
    from plait.codegen.build import cpu_info

    model, flags = cpu_info()
    cpu = model or platform.processor() or platform.machine()
    flags_sha = hashlib.sha256(flags.encode()).hexdigest()[:16]
    env = repr(sorted((k, v) for k, v in os.environ.items() if k.startswith(_LIBRARY_ENV)))
    return cpu, flags_sha, torch.__version__, env, str(torch.get_num_threads())


# NOTE: decisions made or replayed while recording (an export carries them), and decisions to
# replay before any remembered one (an artifact's load)
_RECORDING: ContextVar[dict[str, str | None] | None] = ContextVar("timed_recording", default=None)
_REPLAYING: ContextVar[Mapping[str, str | None] | None] = ContextVar("timed_replay", default=None)
DIGEST = re.compile(r"[0-9a-f]{64}")
# NOTE: a decision's file holds ``{"refused": null}`` or one refusal's sentence (~100 bytes)
FILE_LIMIT = 4096
# NOTE: files a decision may take, in order: a damaged one (a crash between a file's link and
# its data reaching the disk) is never replaced (a process that read it damaged could replace
# another's good one meanwhile); the decision goes in the next slot, first written wins there.
SLOTS = 4
DAMAGED: Literal["damaged"] = "damaged"


@contextlib.contextmanager
def recording() -> Iterator[dict[str, str | None]]:
    """Every decision the compiles inside make or replay, by digest (what an export carries)."""
    seen: dict[str, str | None] = {}
    token = _RECORDING.set(seen)
    try:
        yield seen
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def replaying(decisions: Mapping[str, str | None]) -> Iterator[None]:
    """The compiles inside take ``decisions`` (by digest) first: an artifact loaded on the
    machine that exported it runs the libraries its references were computed with. On another
    machine no digest matches (the machine is part of it) and the calls are timed there."""
    token = _REPLAYING.set(dict(decisions))
    try:
        yield
    finally:
        _REPLAYING.reset(token)


class TimedChoices:
    """Decisions by key, in memory and under ``root`` (see the module doc)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._known: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Forget every decision, here and under :attr:`root`."""
        with self._lock:
            self._known.clear()
        if self.root is not None:
            for path in self.root.glob("*/*.json"):
                path.unlink(missing_ok=True)

    def _digest(self, key: object) -> str:
        text = repr((machine(), key))
        return hashlib.sha256(text.encode()).hexdigest()

    def decide(self, key: object, measure: Callable[[], str | None]) -> str | None:
        """The remembered decision for ``key``, else ``measure()``'s, remembered."""
        digest = self._digest(key)
        replay = _REPLAYING.get()
        if replay is not None and digest in replay:
            decision = replay[digest]
        else:
            decision = self._decide(digest, measure)
        seen = _RECORDING.get()
        if seen is not None:
            seen[digest] = decision
        return decision

    def _decide(self, digest: str, measure: Callable[[], str | None]) -> str | None:
        with self._lock:
            if digest in self._known:
                return self._known[digest]
        stored = self._read(digest)
        if stored is not None:
            decision = stored[0]
        else:
            decision = self._write(digest, measure())
        with self._lock:
            # NOTE: the first decision remembered wins here too (another thread may have
            # decided while this one measured, its file unwritten where the cache is)
            return self._known.setdefault(digest, decision)

    def _slots(self, digest: str) -> Iterator[Path]:
        """Where ``digest``'s decision may be, in order (none without a cache directory)."""
        if self.root is None:
            return
        for slot in range(SLOTS):
            name = f"{digest}.json" if slot == 0 else f"{digest}.{slot}.json"
            yield self.root / digest[:2] / name

    def _read(self, digest: str) -> tuple[str | None] | None:
        """The decision of the first slot that holds one, past damaged ones (None: a free slot
        comes first, or none is left)."""
        for path in self._slots(digest):
            found = self._load(path)
            if found != DAMAGED:
                return found if isinstance(found, tuple) else None
        return None

    def _write(self, digest: str, decision: str | None) -> str | None:
        """Store ``decision`` in the first free slot, past damaged ones, unless another process
        stored one first (then that one)."""
        for path in self._slots(digest):
            found = self._load(path)
            if found is None:
                found = self._publish(path, decision)
            if isinstance(found, tuple):
                return found[0]
            if found is None:
                break  # NOTE: an unwritable cache: this process still remembers it
        return decision

    def _load(self, path: Path) -> tuple[str | None] | Literal["damaged"] | None:
        """The decision stored at ``path``, None where there is no file, :data:`DAMAGED` where
        the file is not a small regular JSON file of a decision's form (read without following
        a link or waiting on a FIFO; a nesting too deep for the parser counts as malformed)."""
        try:
            data = read_regular(path, FILE_LIMIT)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return DAMAGED
        try:
            doc = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            return DAMAGED
        reason = doc.get("refused") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not (reason is None or isinstance(reason, str)):
            return DAMAGED
        return (reason,)

    def _publish(
        self, path: Path, decision: str | None
    ) -> tuple[str | None] | Literal["damaged"] | None:
        """Link a new file holding ``decision`` at ``path``: ``(decision,)``, or what another
        process linked there first; None where the cache cannot be written."""
        try:
            assert self.root is not None
            private_subdir(self.root, path.parent.name)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps({"refused": decision}))
            try:
                os.link(tmp, path)  # NOTE: fails if the file exists: the first one wins
            except FileExistsError:
                return self._load(path)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            return None
        return (decision,)


_STORES: dict[Path | None, TimedChoices] = {}


def store() -> TimedChoices:
    """The store under the kernel cache directory (:func:`plait.codegen.build.cache_dir`, as
    it is now: ``PLAIT_CACHE_DIR`` may change in a process)."""
    from plait.codegen.build import cache_dir

    try:
        root: Path | None = private_dir(cache_dir() / "timed")
    except OSError:
        root = None
    if root not in _STORES:
        _STORES[root] = TimedChoices(root)
    return _STORES[root]
