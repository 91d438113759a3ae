"""A progress display for long steps (compiles, repetitions): rich bars on a terminal, one
plain line per step elsewhere (logs, CI, ``make bench`` piped to a file), nothing when quiet.

Example:
    >>> p = Progress(mode="quiet")
    >>> with p.task("repetitions", total=3) as advance:
    ...     for _ in range(3):
    ...         advance()
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any


class Progress:
    """``mode``: ``auto`` (rich on a terminal, else plain lines), ``rich``, ``plain``, ``quiet``.
    Everything goes to stderr: stdout carries the results table."""

    def __init__(self, mode: str = "auto") -> None:
        self.start = time.perf_counter()
        self.mode = mode
        self._rich: Any = None
        if mode in ("auto", "rich"):
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
            else:
                console = Console(stderr=True)
                if mode == "rich" or console.is_terminal:
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
                else:
                    self.mode = "plain"

    def log(self, message: str) -> None:
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
        done = [0]

        def advance_plain(n: int = 1, note: str = "") -> None:
            done[0] += n
            if note:
                self.log(f"{description}: {note} ({done[0]}/{total})")

        self.log(f"{description} ...")
        yield advance_plain
        self.log(f"{description}: done in {time.perf_counter() - started:.1f} s")

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
