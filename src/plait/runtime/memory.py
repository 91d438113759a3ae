"""The static memory plan: liveness over the schedule, in-place epilogues, arena offsets.

Every materialized value gets one of these homes:

- ``input``: a graph input (the caller's tensor, never written);
- ``output``: a graph output a kernel writes: a fresh tensor each call (the caller owns it);
- ``torch``: allocated by PyTorch inside an extern or fallback call, fresh each call (the only
  home of a value of data-dependent size: ``nonzero``'s result, counted in no byte total);
- ``arena``: an intermediate a kernel writes: a fixed offset in one arena reused across calls;
- ``inplace``: written by a kernel over the buffer of a value it reads for the last time, at the
  very index it writes (all its reads of that buffer are at the store's index). This is how an
  epilogue (bias, activation, residual add, normalization) runs on an extern's result;
- ``fresh``: with the plan turned off (``StaxOptions(memory_plan=False)``), an intermediate a
  kernel writes, allocated per call in its planned layout and held until the call returns.

Arena offsets come from a greedy best-fit over lifetimes (largest first); the arena's size is the
plan's peak. ``peak_live_bytes`` also counts buffers PyTorch and the caller own.

With symbolic shapes, byte counts are size expressions (:mod:`plait.symbolic.poly`): homes and
in-place decisions are made once (they compare layouts, never sizes), and the arena's offsets are
the same best fit, computed per call from the sizes the call binds (:meth:`MemoryPlan.arena_at`,
remembered per set of sizes); the runner grows the arena to the largest seen.

Example:
    >>> MemoryPlan([], 0, 0).records()["arena_bytes"]
    0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plait.codegen.kir import Kernel
from plait.codegen.plan import ExternStep, FallbackStep, KernelStep, Plan
from plait.codegen.views import sizes_of
from plait.ir.graph import Value
from plait.ir.types import TensorType
from plait.symbolic import has_unbacked
from plait.symbolic.poly import Poly, Size, evaluate

ALIGN = 64


@dataclass
class BufferPlan:
    value: Value
    home: str
    nbytes: Size
    first: int
    last: int
    offset: int = 0
    alias_of: Value | None = None
    epilogue_of: int | None = None

    def record(self) -> dict[str, Any]:
        t = self.value.type
        sized = not isinstance(t, TensorType) or not has_unbacked(t.shape)
        nbytes = self.nbytes if isinstance(self.nbytes, int) else str(self.nbytes)
        out: dict[str, Any] = {
            "value": self.value.name,
            "home": self.home,
            "bytes": nbytes if sized else "data-dependent",
            "live": [self.first, self.last],
        }
        if self.home == "arena" and isinstance(self.nbytes, int):
            out["offset"] = self.offset
        if self.alias_of is not None:
            out["alias_of"] = self.alias_of.name
        if self.epilogue_of is not None:
            out["epilogue_of_node"] = self.epilogue_of
        return out


@dataclass
class MemoryPlan:
    """``arena_bytes`` and ``peak_live_bytes`` are 0 and None for a symbolic plan: they depend
    on the call's sizes (:meth:`arena_at`, :meth:`peak_at`)."""

    buffers: list[BufferPlan]
    arena_bytes: int
    peak_live_bytes: int | None
    by_value: dict[Value, BufferPlan] = field(default_factory=dict)

    reuse: bool = True
    symbolic: bool = False
    _fits: dict[tuple[tuple[str, int], ...], tuple[dict[int, int], int]] = field(
        default_factory=dict, repr=False
    )

    def records(self) -> dict[str, Any]:
        per_call = "per call: the best fit at the call's sizes (the arena grows to the largest)"
        return {
            "reuse": self.reuse,
            "arena_bytes": per_call if self.symbolic else self.arena_bytes,
            "peak_live_bytes": "per call" if self.symbolic else self.peak_live_bytes,
            "buffers": [b.record() for b in self.buffers],
        }

    def arena_at(self, sizes: Mapping[str, int]) -> tuple[dict[int, int], int]:
        """The arena at the size atoms' values ``sizes``: each arena buffer's offset (by
        ``id`` of its value) and the arena's bytes. Static plans give their planned offsets."""
        key = tuple(sorted(sizes.items()))
        hit = self._fits.get(key)
        if hit is not None:
            return hit
        arena = [b for b in self.buffers if b.home == "arena"]
        if not self.symbolic:
            hit = {id(b.value): b.offset for b in arena}, self.arena_bytes
        else:
            items = [(evaluate(b.nbytes, sizes), b.first, b.last) for b in arena]
            offsets, total = best_fit(items)
            hit = {id(b.value): o for b, o in zip(arena, offsets)}, total
        self._fits[key] = hit
        return hit

    def peak_at(self, sizes: Mapping[str, int]) -> int:
        """Peak live bytes at the size atoms' values ``sizes``."""
        if not self.symbolic:
            return self.peak_live_bytes or 0
        end = max((b.last for b in self.buffers), default=0)
        return _peak(self.buffers, end, sizes)


def nbytes(v: Value) -> Size:
    """Bytes of ``v`` (a size expression for symbolic dims); 0 for a data-dependent size
    (PyTorch allocates it, the plan counts it nowhere: such a buffer's record says
    ``"bytes": "data-dependent"``)."""
    t = v.type
    assert isinstance(t, TensorType)
    if has_unbacked(t.shape):
        return 0
    n: Size = 1
    for d in sizes_of(t):
        n = n * d
    return n * t.dtype.itemsize


def step_reads(plan: Plan, step: Any) -> list[Value]:
    """Base values a step reads (views resolve to the value they view)."""
    if isinstance(step, KernelStep):
        kernel = step.lowered.kernel
        return [v for v, b in zip(step.lowered.bindings, kernel.buffers) if not b.output]
    out = []
    operands = step.operands() if isinstance(step, ExternStep) else list(step.node.inputs)
    for o in operands:
        if not isinstance(o, Value):
            continue
        loc = plan.locs.get(o)
        if loc is not None and loc.base is not None:
            out.append(loc.base)
    return out


def _writes(step: Any) -> list[Value]:
    if isinstance(step, KernelStep):
        kernel = step.lowered.kernel
        return [v for v, b in zip(step.lowered.bindings, kernel.buffers) if b.output]
    outs = step.outputs if isinstance(step, ExternStep) else step.node.outputs
    return [v for v in outs if isinstance(v.type, TensorType)]


def _identity_reads(kernel: Kernel, buf_in: int, buf_out: int) -> bool:
    """Whether every load of ``buf_in`` is at the index where ``buf_out`` is stored."""
    stores = {st.index for ph in kernel.phases for st in ph.stores if st.buffer == buf_out}
    stores |= {st.index for st in kernel.final if st.buffer == buf_out}
    if len(stores) != 1:
        return False
    (index,) = stores
    loads = [s.attr[1] for s in kernel.stmts() if s.op == "load" and s.attr[0] == buf_in]
    return all(ix == index for ix in loads)


def plan_memory(plan: Plan, allow_inplace: bool = True, reuse: bool = True) -> MemoryPlan:
    """Liveness, homes and arena offsets for ``plan``'s schedule. ``reuse=False`` turns the plan
    off: no arena, nothing in place, each kernel intermediate allocated fresh per call (and
    counted live until the call returns, as the runner holds it)."""
    allow_inplace = allow_inplace and reuse
    end = len(plan.steps)
    outputs = {id(o) for o in plan.graph.outputs if isinstance(o, Value)}
    last: dict[int, int] = {}
    for i, step in enumerate(plan.steps):
        for v in step_reads(plan, step):
            last[id(v)] = i
    buffers: dict[Value, BufferPlan] = {}
    extern_out: list[BufferPlan] = []  # NOTE: extern results the plan gives an arena buffer
    for i, step in enumerate(plan.steps):
        written = _writes(step)
        if not isinstance(step, KernelStep):
            for v in written:
                stop = _last(v, i, last, outputs, end)
                size = nbytes(v)
                home = "arena" if reuse and _writes_out(step, v, size, outputs) else "torch"
                buffers[v] = BufferPlan(v, home, size, i, stop)
                if home == "arena":
                    extern_out.append(buffers[v])
            continue
        taken: set[int] = set()
        for v in written:
            stop = _last(v, i, last, outputs, end)
            home = "output" if id(v) in outputs else "arena" if reuse else "fresh"
            if home == "fresh":
                stop = end
            bp = BufferPlan(v, home, nbytes(v), i, stop)
            target = (
                _inplace_target(plan, step, v, i, buffers, last, outputs, taken)
                if allow_inplace
                else None
            )
            if target is not None:
                taken.add(id(target))
                bp.home, bp.alias_of = "inplace", target
                root = _root(buffers, target)
                root.last = max(root.last, stop)
                producer = _producer_step(plan, _root(buffers, target).value)
                if isinstance(producer, ExternStep):
                    bp.epilogue_of = producer.node.id
            buffers[v] = bp
    ordered = list(buffers.values())
    if any(isinstance(b.nbytes, Poly) for b in ordered):
        for b in extern_out:  # NOTE: an extern's result in the arena only at fixed offsets
            b.home = "torch"
        # NOTE: offsets per call (MemoryPlan.arena_at): a best fit depends on the sizes
        return MemoryPlan(ordered, 0, None, buffers, reuse, symbolic=True)
    arena = _assign_arena([b for b in ordered if b.home == "arena"])
    peak = _peak(ordered, end, {})
    return MemoryPlan(ordered, arena, peak, buffers, reuse)


def _writes_out(step: Any, v: Value, size: Any, outputs: set[int]) -> bool:
    """Whether extern ``step`` writes its result ``v`` into a buffer the plan gives it: a
    native call in the strides the plan expects (``ExternCall.native_result``), of a fixed
    size, not returned by the program."""
    if not isinstance(step, ExternStep) or not step.out_strides or id(v) in outputs:
        return False
    return isinstance(size, int) and step.call.native_result(step.out_strides[0])


def _last(v: Value, i: int, last: dict[int, int], outputs: set[int], end: int) -> int:
    if id(v) in outputs:
        return end
    return last.get(id(v), i)


def _root(buffers: dict[Value, BufferPlan], v: Value) -> BufferPlan:
    bp = buffers[v]
    while bp.alias_of is not None:
        bp = buffers[bp.alias_of]
    return bp


def _inplace_target(
    plan: Plan,
    step: KernelStep,
    v: Value,
    i: int,
    buffers: dict[Value, BufferPlan],
    last: dict[int, int],
    outputs: set[int],
    taken: set[int],
) -> Value | None:
    kernel = step.lowered.kernel
    bindings = step.lowered.bindings
    out_index = next(
        j for j, (b, buf) in enumerate(zip(bindings, kernel.buffers)) if b is v and buf.output
    )
    for j, (u, buf) in enumerate(zip(bindings, kernel.buffers)):
        if buf.output or id(u) in taken or u not in buffers:
            continue
        if id(u) in outputs or last.get(id(u)) != i or u.producer is None:
            continue
        root = _root(buffers, u)
        if root.home not in ("arena", "torch") or (root.home == "arena" and id(v) in outputs):
            continue
        if isinstance(_producer_step(plan, root.value), FallbackStep):
            continue  # NOTE: a fallback's result may alias its inputs: never write over it.
        ut, vt = u.type, v.type
        if not isinstance(ut, TensorType) or not isinstance(vt, TensorType) or ut.dtype != vt.dtype:
            continue
        if nbytes(u) != nbytes(v) or not _same_layout(plan, u, v):
            continue
        if _identity_reads(kernel, j, out_index):
            return u
    return None


def _producer_step(plan: Plan, v: Value) -> Any:
    for step in plan.steps:
        if isinstance(step, ExternStep) and v in step.outputs:
            return step
        if isinstance(step, FallbackStep) and v in step.node.outputs:
            return step
    return None


def _same_layout(plan: Plan, u: Value, v: Value) -> bool:
    """``v`` may take over ``u``'s buffer: same shape and strides (the index check does the
    rest)."""
    lu, lv = plan.locs[u], plan.locs[v]
    return lu.offset == 0 and sizes_of(u.type) == sizes_of(v.type) and lu.strides == lv.strides


def _assign_arena(items: list[BufferPlan]) -> int:
    offsets, size = best_fit([(int(b.nbytes), b.first, b.last) for b in items])
    for b, offset in zip(items, offsets):
        b.offset = offset
    return size


def best_fit(items: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets for buffers ``(bytes, first step, last step)`` in one arena, greedy best fit
    over lifetimes (largest first), and the arena's size."""
    offsets = [0] * len(items)
    placed: list[tuple[int, int, int, int]] = []  # (offset, bytes, first, last)
    size = 0
    for j in sorted(range(len(items)), key=lambda j: (-items[j][0], items[j][1])):
        nbytes, first, last = items[j]
        need = _round(nbytes)
        clashes = sorted(
            (o, o + _round(n)) for o, n, f, la in placed if not (la < first or last < f)
        )
        offset = 0
        for lo, hi in clashes:
            if offset + need <= lo:
                break
            offset = max(offset, hi)
        offsets[j] = offset
        placed.append((offset, nbytes, first, last))
        size = max(size, offset + need)
    return offsets, size


def _round(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def _peak(ordered: list[BufferPlan], end: int, sizes: Mapping[str, int]) -> int:
    peak = 0
    for t in range(end + 1):
        live = sum(
            evaluate(b.nbytes, sizes)
            for b in ordered
            if b.alias_of is None and b.first <= t <= b.last
        )
        peak = max(peak, live)
    return peak
