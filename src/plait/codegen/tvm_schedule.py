"""The schedule of a TVM kernel: the C++ printer's decisions, made with TensorIR's schedule
primitives on the printed loop nests (:mod:`plait.codegen.tvm_script`), each a knob that tuning
may turn (:mod:`plait.codegen.tvm_tune`). The default (what runs untuned):

- Reductions are split into one partial result per vector lane (``rfactor``), combined after
  the loop, as the C++ printer's ``omp simd`` reductions accumulate (a sum's order is then a
  reduction's, which the numerical contract allows; a float max or min is a max and a NaN flag,
  :mod:`plait.codegen.tvm_script`). Reductions the printer accumulated in vector lanes itself
  (:mod:`plait.codegen.tvm_vector`), and those whose block holds a local scalar, are left as
  printed.
- Phases are fused: every block moves under the outer loops of the kernel's last block
  (``compute_at``, ``reverse_compute_at``), so each outer point runs its phases in order while
  its row is in cache, as the C++ kernels do (a kernel printed fused, ``TvmSource.fused``, is
  so already).
- Vectors of 512 bits (16 float32 lanes): each partial result, and each store block's innermost
  loop of its own, where the extent divides evenly and the block calls no C library function
  (those stay scalar: there is no vector libm here) and holds no local scalar (a chain of
  bfloat16 roundings, :mod:`plait.codegen.tvm_script`: TVM's vectorizer keeps one for all the
  lanes).
- The outer loops are fused into one, parallel on TVM's thread pool when the kernel's work
  (elements times phases) reaches the threshold the C++ printer uses for OpenMP.
- Each reduction's initialisation is moved out of its loop (``decompose_reduction``).

Knobs (tuning samples them): the lanes of each vector and partial result (1: scalar), whether
phases are fused, whether the outer loop is parallel, and how far loops are unrolled.

A primitive the kernel does not admit (an index TVM cannot vectorize, a block it cannot move) is
skipped, on a copy of the schedule: the kernel stays correct, only slower there.

Example:
    >>> SCHEDULE_VERSION
    'plait-tvm-schedule-1'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from plait.codegen.tvm_script import TvmSource

SCHEDULE_VERSION = "plait-tvm-schedule-1"
VECTOR_BITS = 512
_MIN_LANES = 4
_ITEMSIZE = {"f64": 8, "f32": 4, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1}
UNROLL_STEPS = (0, 16, 64)
# NOTE: a knob: (the schedule, its name, the candidates, the default's index) -> the value
Choose = Callable[[Any, str, Sequence[int], int], int]


def lanes_for(extent: int, itemsize: int = 4) -> int:
    """The vector width (a power of two dividing ``extent``, at most 512 bits), or 1.

    Example:
        >>> lanes_for(768), lanes_for(3072, 8), lanes_for(7)
        (16, 8, 1)
    """
    lanes = VECTOR_BITS // (8 * itemsize)
    while lanes >= _MIN_LANES:
        if extent % lanes == 0:
            return lanes
        lanes //= 2
    return 1


def lane_choices(extent: int, itemsize: int) -> tuple[list[int], int]:
    """The vector widths a knob may take for ``extent`` (1: scalar) and the default's index."""
    default = lanes_for(extent, itemsize)
    choices = [n for n in (4, 8, 16, 32, 64) if extent % n == 0 and n * itemsize <= 256]
    choices = sorted({1, default, *choices})
    return choices, choices.index(default)


def default_choice(sch: Any, name: str, candidates: Sequence[int], default: int) -> int:
    return candidates[default]


def sampled_choice(sch: Any, name: str, candidates: Sequence[int], default: int) -> int:
    """A knob sampled uniformly by the schedule (recorded in its trace, which replays it)."""
    if len(candidates) == 1:
        return candidates[0]
    n = len(candidates)
    rv = sch.sample_categorical(candidates=list(candidates), probs=[1.0 / n] * n)
    return int(sch.get(rv))


class _Scheduler:
    def __init__(self, sch: Any, src: TvmSource, choose: Choose) -> None:
        self.sch = sch
        self.src = src
        self.choose = choose
        self.m = len(src.outer)
        self.blocks = [sch.get_sblock(name) for name in src.blocks]
        self.names = {id(b): sch.get(b).name_hint for b in self.blocks}
        self.itemsize = max(_itemsize(s) for s, _ in src.buffers)

    def attempt(self, step: Callable[[Any], object]) -> bool:
        """Run ``step`` on a copy of the schedule; keep the copy where it succeeded."""
        trial = self.sch.copy()
        try:
            step(trial)
        except Exception:  # NOTE: TVM's schedule errors: the step is skipped
            return False
        self.sch = trial
        return True

    def name(self, block: Any) -> str:
        return self.names[id(block)]

    def is_reduction(self, block: Any) -> bool:
        return "_acc" in self.name(block)

    def printed_in_lanes(self, block: Any) -> bool:
        """A reduction the printer accumulated in vector lanes itself, or their combine."""
        return "_vector" in self.name(block) or "_combine" in self.name(block)

    def calls_libm(self, block: Any) -> bool:
        return "call_pure_extern" in self.sch.get(block).script()

    def holds_scalars(self, block: Any) -> bool:
        """A block with local scalars (:mod:`plait.codegen.tvm_script`): TVM's vectorizer
        keeps one scalar for all the lanes of a vectorized loop (wrong values)."""
        return 'scope="local"' in self.sch.get(block).script()

    def lanes(self, knob: str, loop: Any, itemsize: int) -> int:
        choices, default = lane_choices(int(self.sch.get(loop).extent), itemsize)
        return self.choose(self.sch, knob, choices, default)

    # --- the steps ----------------------------------------------------------------------------
    def split_reduction(self, block: Any) -> Any | None:
        """The block of one partial result per vector lane, or None where the reduction stays
        sequential."""
        dtype = self.name(block).split("_")[2]
        loops = self.sch.get_loops(block)
        if len(loops) <= self.m or self.calls_libm(block) or self.printed_in_lanes(block):
            return None
        if self.holds_scalars(block):
            return None
        lanes = self.lanes(f"partial:{self.name(block)}", loops[-1], _ITEMSIZE.get(dtype, 8))
        if lanes == 1:
            return None
        made: list[Any] = []

        def step(s: Any) -> None:
            _, lane = s.split(s.get_loops(block)[-1], factors=[None, lanes])
            made.append(s.rfactor(lane, factor_axis=0))

        return made[0] if self.attempt(step) else None

    def fuse_phases(self, anchor: Any, others: list[Any]) -> set[int]:
        """Move ``others`` under the anchor's innermost outer loop; the ones moved."""
        moved: set[int] = set()
        progress = True
        while progress:
            progress = False
            for b in others:
                if id(b) in moved:
                    continue
                for how in ("compute_at", "reverse_compute_at"):

                    def step(s: Any, how: str = how, b: Any = b) -> None:
                        loop = s.get_loops(anchor)[self.m - 1]
                        getattr(s, how)(b, loop, preserve_unit_loops=True)

                    if self.attempt(step):
                        moved.add(id(b))
                        progress = True
                        break
        return moved

    def vectorize_partial(self, partial: Any, moved: bool) -> None:
        def step(s: Any) -> None:
            loops = s.get_loops(partial)[self.m :]
            if moved and len(loops) > 1:
                # NOTE: moved, its loops follow its block variables: the lane first
                s.reorder(*loops[1:], loops[0])
            s.vectorize(s.get_loops(partial)[-1])

        self.attempt(step)

    def vectorize_store(self, block: Any, alone: bool) -> None:
        loops = self.sch.get_loops(block)
        if not loops or self.calls_libm(block) or (len(loops) <= self.m and not alone):
            return
        if self.holds_scalars(block):
            return
        if "_vector" in self.name(block):  # NOTE: printed over vector lanes already
            return
        lanes = self.lanes(f"vector:{self.name(block)}", loops[-1], self.itemsize)
        if lanes == 1:
            return

        def step(s: Any) -> None:
            _, lane = s.split(s.get_loops(block)[-1], factors=[None, lanes])
            s.vectorize(lane)

        self.attempt(step)

    def parallel(self, anchor: Any, threshold: int) -> None:
        src = self.src
        work = math.prod(src.outer) * max(1, math.prod(src.inner)) * max(1, src.phases)
        if not self.m or math.prod(src.outer) <= 1:
            return
        if not self.choose(self.sch, "parallel", (0, 1), int(work >= threshold)):
            return

        def step(s: Any) -> None:
            loops = s.get_loops(anchor)[: self.m]
            s.parallel(s.fuse(*loops) if len(loops) > 1 else loops[0])

        self.attempt(step)

    def unroll(self, anchor: Any) -> None:
        steps = self.choose(self.sch, "unroll", UNROLL_STEPS, 0)
        if steps and self.m:

            def step(s: Any) -> None:
                s.annotate(s.get_loops(anchor)[0], "pragma_auto_unroll_max_step", steps)
                s.annotate(s.get_loops(anchor)[0], "pragma_unroll_explicit", 1)

            self.attempt(step)

    def decompose(self, block: Any) -> None:
        def step(s: Any) -> None:
            s.decompose_reduction(block, s.get_loops(block)[self.m])

        if len(self.sch.get_loops(block)) > self.m:
            self.attempt(step)


def schedule(sch: Any, src: TvmSource, parallel_threshold: int, choose: Choose) -> Any:
    """Apply the schedule to ``sch`` (a TensorIR schedule of the parsed kernel), each knob as
    ``choose`` says; the resulting schedule (a copy)."""
    s = _Scheduler(sch, src, choose)
    blocks = s.blocks
    partials = {}
    for b in blocks:
        if s.is_reduction(b):
            p = s.split_reduction(b)
            if p is not None:
                partials[id(b)] = p
    anchor = blocks[-1]
    others: list[Any] = []
    for b in blocks[:-1]:
        if id(b) in partials:
            others.append(partials[id(b)])
        others.append(b)
    # NOTE: a kernel printed fused shares its outer loops already
    fuse = s.m and len(blocks) > 1 and not src.fused and s.choose(s.sch, "fuse", (0, 1), 1)
    moved = s.fuse_phases(anchor, list(reversed(others))) if fuse else set()
    for b in blocks:
        if id(b) in partials:
            s.vectorize_partial(partials[id(b)], id(partials[id(b)]) in moved)
        elif not s.is_reduction(b):
            s.vectorize_store(b, alone=len(blocks) == 1)
    s.parallel(anchor, parallel_threshold)
    s.unroll(anchor)
    for b in blocks:
        if id(b) in partials:
            s.decompose(partials[id(b)])
        if s.is_reduction(b):
            s.decompose(b)
    return s.sch


def default_schedule(mod: Any, src: TvmSource, parallel_threshold: int) -> Any:
    """``mod`` (the parsed kernel) with the default schedule."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    return schedule(sch, src, parallel_threshold, default_choice).mod


def _itemsize(storage: str) -> int:
    digits = "".join(c for c in storage if c.isdigit())
    return max(1, int(digits or 8) // 8)
