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

Example:
    >>> MemoryPlan([], 0, 0).records()["arena_bytes"]
    0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plait.codegen.kir import Kernel
from plait.codegen.plan import ExternStep, FallbackStep, KernelStep, Plan
from plait.codegen.views import shape_of
from plait.ir.graph import Value
from plait.ir.types import TensorType

ALIGN = 64


@dataclass
class BufferPlan:
    value: Value
    home: str
    nbytes: int
    first: int
    last: int
    offset: int = 0
    alias_of: Value | None = None
    epilogue_of: int | None = None

    def record(self) -> dict[str, Any]:
        t = self.value.type
        sized = not isinstance(t, TensorType) or t.is_static
        out: dict[str, Any] = {
            "value": self.value.name,
            "home": self.home,
            "bytes": self.nbytes if sized else "data-dependent",
            "live": [self.first, self.last],
        }
        if self.home == "arena":
            out["offset"] = self.offset
        if self.alias_of is not None:
            out["alias_of"] = self.alias_of.name
        if self.epilogue_of is not None:
            out["epilogue_of_node"] = self.epilogue_of
        return out


@dataclass
class MemoryPlan:
    buffers: list[BufferPlan]
    arena_bytes: int
    peak_live_bytes: int
    by_value: dict[Value, BufferPlan] = field(default_factory=dict)

    reuse: bool = True

    def records(self) -> dict[str, Any]:
        return {
            "reuse": self.reuse,
            "arena_bytes": self.arena_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "buffers": [b.record() for b in self.buffers],
        }


def nbytes(v: Value) -> int:
    """Bytes of ``v``; 0 for a data-dependent size (PyTorch allocates it, the plan counts it
    nowhere: such a buffer's record says ``"bytes": "data-dependent"``)."""
    t = v.type
    assert isinstance(t, TensorType)
    if not t.is_static:
        return 0
    n = 1
    for d in shape_of(t):
        n *= d
    return n * t.dtype.itemsize


def _reads(plan: Plan, step: Any) -> list[Value]:
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
        for v in _reads(plan, step):
            last[id(v)] = i
    buffers: dict[Value, BufferPlan] = {}
    for i, step in enumerate(plan.steps):
        written = _writes(step)
        if not isinstance(step, KernelStep):
            for v in written:
                home = "torch"
                buffers[v] = BufferPlan(v, home, nbytes(v), i, _last(v, i, last, outputs, end))
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
    arena = _assign_arena([b for b in ordered if b.home == "arena"])
    peak = _peak(ordered, buffers, end)
    return MemoryPlan(ordered, arena, peak, buffers, reuse)


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
    return lu.offset == 0 and shape_of(u.type) == shape_of(v.type) and lu.strides == lv.strides


def _assign_arena(items: list[BufferPlan]) -> int:
    placed: list[BufferPlan] = []
    size = 0
    for b in sorted(items, key=lambda b: (-b.nbytes, b.first)):
        need = _round(b.nbytes)
        clashes = sorted(
            (p.offset, p.offset + _round(p.nbytes))
            for p in placed
            if not (p.last < b.first or b.last < p.first)
        )
        offset = 0
        for lo, hi in clashes:
            if offset + need <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
        size = max(size, offset + need)
    return size


def _round(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def _peak(ordered: list[BufferPlan], buffers: dict[Value, BufferPlan], end: int) -> int:
    peak = 0
    for t in range(end + 1):
        live = sum(b.nbytes for b in ordered if b.alias_of is None and b.first <= t <= b.last)
        peak = max(peak, live)
    return peak
