"""Progress on long work (benchmarks, OpInfo sweeps, fuzzing): rich bars on a terminal, plain
lines elsewhere (logs, CI, output piped to a file), nothing when quiet. Everything goes to
stderr: stdout carries results.

It imports nothing of plait, and ``rich`` only when it is installed and a terminal is attached.

Example:
    >>> p = Progress(mode="quiet")
    >>> with p.task("repetitions", total=3) as advance:
    ...     for _ in range(3):
    ...         advance()
    >>> list(p.track(range(3), "items"))
    [0, 1, 2]
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

MODES = ("auto", "rich", "plain", "quiet")
T = TypeVar("T")


class ProgressModeError(ValueError):
    """A progress mode not in :data:`MODES`: code ``PLAIT-C170``, classified by name in
    ``plait.errors`` (this module imports nothing else of plait)."""


class Progress:
    """``mode``: ``auto`` (rich on a terminal, else plain lines), ``rich``, ``plain``, ``quiet``.
    ``every``: in plain mode, the fewest seconds between two lines of one task (its first and
    last line always show), so that thousands of steps make a readable log."""

    def __init__(self, mode: str = "auto", every: float = 5.0) -> None:
        if mode not in MODES:
            raise ProgressModeError(f"progress mode {mode!r}; modes: {', '.join(MODES)}")
        self.start = time.perf_counter()
        self.mode = mode
        self.every = every
        self._rich: Any = None
        if mode in ("auto", "rich"):
            self._start_rich(mode)

    def _start_rich(self, mode: str) -> None:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress
        except ImportError:
            self.mode = "plain"
            return
        console = Console(stderr=True)
        if mode != "rich" and not console.is_terminal:
            self.mode = "plain"
            return
        self.mode = "rich"
        self._rich = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._rich.start()

    def log(self, message: str) -> None:
        """One line of its own (above the bars on a terminal)."""
        if self.mode == "quiet":
            return
        if self._rich is not None:
            self._rich.console.log(message)
        else:
            print(f"[{time.perf_counter() - self.start:7.1f}s] {message}", file=sys.stderr)

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """A step of ``total`` units; the context yields ``advance(n=1, note="")``."""
        started = time.perf_counter()
        if self._rich is not None:
            tid = self._rich.add_task(description, total=total)

            def advance(n: int = 1, note: str = "") -> None:
                label = f"{description} {note}".rstrip()
                self._rich.update(tid, advance=n, description=label)

            try:
                yield advance
            finally:
                self._rich.update(tid, completed=total)
            return
        done, shown = [0], [started]

        def advance_plain(n: int = 1, note: str = "") -> None:
            done[0] += n
            now = time.perf_counter()
            if done[0] < total and now - shown[0] < self.every:
                return
            shown[0] = now
            suffix = f": {note}" if note else ""
            self.log(f"{description}{suffix} ({done[0]}/{total})")

        self.log(f"{description} ...")
        yield advance_plain
        self.log(f"{description}: done in {time.perf_counter() - started:.1f} s")

    def track(self, items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
        """``items``, one unit of progress each (``total`` when ``items`` has no length)."""
        if total is None:
            total = len(items) if isinstance(items, Sized) else 0
        with self.task(description, total) as advance:
            for item in items:
                yield item
                advance()

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shown(items: list[T], description: str | None) -> Iterator[T]:
    """``items``, with a progress task named ``description`` on stderr (a bar on a terminal,
    plain lines elsewhere) when there is one: long work a user asked for inside a compile
    (tuning kernels); without a description, ``items`` as they are, silently.

    >>> list(shown([1, 2], None))
    [1, 2]
    """
    if description is None:
        yield from items
        return
    with Progress("auto") as progress:
        yield from progress.track(items, description)
