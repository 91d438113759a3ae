"""Does a compile pay for itself? The break-even of a specialization: its compile cost divided
by what it saves per call, measured on calls like the first ones.

Example:
    >>> import torch, plait
    >>> f = plait.compile(lambda x: (x * 2).relu().sum(1), options={"cache": False})
    >>> report = break_even(f, (torch.randn(64, 64),), calls=3)
    >>> report.compile_s > 0, report.calls
    (True, 3)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.manifest import BREAK_EVEN, COMPILE_STAGES, describe_break_even


@dataclass(frozen=True)
class BreakEven:
    """``compile_s`` (capture, passes and backend, from the manifest), the median seconds of an
    ``eager_s`` and a ``compiled_s`` call over ``calls`` calls, ``saving_s`` per call, and
    ``calls_to_break_even`` (``compile_s / saving_s``; inf when compiling saves nothing)."""

    compile_s: float
    eager_s: float
    compiled_s: float
    calls: int

    @property
    def saving_s(self) -> float:
        return self.eager_s - self.compiled_s

    @property
    def calls_to_break_even(self) -> float:
        return self.compile_s / self.saving_s if self.saving_s > 0 else math.inf

    def __str__(self) -> str:
        return describe_break_even(self.compile_s, self.eager_s, self.compiled_s)


def _median_seconds(fn: Callable[[], Any], calls: int) -> float:
    fn()  # NOTE: warm-up (first-call costs are the compile's, not a call's)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def break_even(
    compiled: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *, calls: int = 5
) -> BreakEven:
    """Measure the break-even of the specialization ``compiled(*args, **kwargs)`` runs (it is
    compiled first if it is not yet): the original program (``compiled``'s own) against the
    compiled one, ``calls`` calls each after a warm-up, under ``torch.no_grad()``. The measure is
    kept in the specialization's manifest (its ``break_even.*`` timings): ``plait.explain``
    prints it."""
    kw = dict(kwargs or {})
    engine = compiled._plait
    original = engine.fn
    with torch.no_grad():
        compiled(*args, **kw)
        spec = engine.specializations[-1]
        timings = spec.manifest.timings
        compile_s = sum(float(timings.get(k, 0.0)) for k in COMPILE_STAGES)
        eager = _median_seconds(lambda: original(*args, **kw), calls)
        fast = _median_seconds(lambda: compiled(*args, **kw), calls)
    timings[BREAK_EVEN + "eager_call_s"] = eager
    timings[BREAK_EVEN + "compiled_call_s"] = fast
    timings[BREAK_EVEN + "calls"] = float(calls)
    return BreakEven(compile_s, eager, fast, calls)
