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
kernel cache times again. A file there that is not a decision's (see
:meth:`TimedChoices._read`) is never trusted: the call is timed again.

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

    def _path(self, digest: str) -> Path | None:
        return None if self.root is None else self.root / digest[:2] / f"{digest}.json"

    def _read(self, digest: str) -> tuple[str | None] | None:
        """The stored decision, or None where there is none to trust: no file, or one that
        is not a small regular JSON file of a decision's form (read without following a link
        or waiting on a FIFO; a nesting too deep for the parser counts as malformed)."""
        path = self._path(digest)
        if path is None:
            return None
        try:
            doc = json.loads(read_regular(path, FILE_LIMIT).decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        reason = doc.get("refused") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or not (reason is None or isinstance(reason, str)):
            return None
        return (reason,)

    def _write(self, digest: str, decision: str | None) -> str | None:
        """Store ``decision`` unless another process stored one first (then that one)."""
        path = self._path(digest)
        if path is None:
            return decision
        try:
            assert self.root is not None
            private_subdir(self.root, digest[:2])
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps({"refused": decision}))
            try:
                os.link(tmp, path)  # NOTE: fails if the file exists: the first one wins
            except FileExistsError:
                stored = self._read(digest)
                decision = stored[0] if stored is not None else decision
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            pass  # NOTE: an unwritable cache: this process still remembers it
        return decision


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
