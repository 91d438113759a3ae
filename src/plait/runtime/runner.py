"""The straight-line runner: one generated Python function per program.

Everything that can be decided before a call is decided here, once: the schedule is unrolled into
Python statements, kernel arguments live in one preallocated pointer table (arena pointers are
written into it once; per call only the pointers of inputs, outputs and PyTorch-allocated results
are refreshed), extern and fallback callables are bound with their attributes, and constants are
globals of the generated function. A call then costs a few hundred nanoseconds per step.

The generated source is kept on the program (``StaxProgram.source``) for debugging.

With symbolic shapes the runner first binds the call's sizes (``z_s0 = a0.shape[0]``: each size
atom, :func:`plait.codegen.symbolic_shapes.binding_code`), checks each input against its shape at
those sizes, and, when they differ from the previous call's, rebinds: the sizes the kernels read
(one ``int64`` per atom, their pointers fixed in the table), the arena's offsets at those sizes
(:meth:`~plait.runtime.memory.MemoryPlan.arena_at`, the arena grown to the largest seen) and the
arena views externs receive. Shapes and strides of outputs, views and conformed results are
Python expressions of the bound sizes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import marshal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch

from plait.codegen.build import cached_blob, store_blob
from plait.codegen.plan import Plan
from plait.codegen.views import sizes_of
from plait.ir.graph import Value
from plait.ir.types import TensorType
from plait.runtime.memory import MemoryPlan
from plait.runtime.runner_calls import bad_sizes, unbound
from plait.runtime.runner_emit import RunnerEmitter
from plait.symbolic.poly import evaluate


@dataclass
class Runner:
    fn: Callable[..., list[Any]]
    source: str
    table: Any
    arena: torch.Tensor | None
    globals: dict[str, Any] = field(repr=False, default_factory=dict)

    @contextlib.contextmanager
    def returning_as_laid_out(self) -> Iterator[None]:
        """While it lasts, the extern results that only the return reads come back as PyTorch
        laid them out, not conformed to the plan's strides (``runner_emit.returned_only``): for
        a CUDA graph's capture, whose call copies them out into the plan's strides."""
        flag = self.globals.get("_RAW")
        if flag is None:
            yield
            return
        flag[0] = True
        try:
            yield
        finally:
            flag[0] = False


def build_runner(
    plan: Plan,
    memory: MemoryPlan,
    funcs: dict[int, Any],
    check_inputs: bool,
    profile: bool = False,
    launch: bool = False,
    trace: Callable[[int, tuple[Any, ...]], None] | None = None,
) -> Runner:
    """Generate and compile the program's Python runner (``profile``: accumulate each step's
    wall time into the global list ``_P``; ``launch``: ``funcs`` are Triton launchers, not
    C++ functions; ``trace``: a debug mode that calls ``trace(step index, tensors)`` after each
    step with the values it materialized (:func:`step_outputs`), which it may overwrite)."""
    em = RunnerEmitter(plan, memory, funcs, check_inputs, profile, launch, trace)
    em.emit()
    table = (ctypes.c_void_p * max(em.slots, 1))()
    base_addr = ctypes.addressof(table)
    if em.arena is not None:
        arena_ptr = em.arena.data_ptr()
        for slot, offset in em.fixed:
            table[slot] = arena_ptr + offset
    for name, value in list(em.g.items()):
        if name.startswith("A") and isinstance(value, int):
            em.g[name] = base_addr + value * ctypes.sizeof(ctypes.c_void_p)
    if em.symbolic:
        _symbolic_globals(em, memory, table)
    em.g["T"] = table
    em.g["_lock"] = threading.Lock()
    params = ", ".join(f"a{i}" for i in range(len(plan.graph.inputs)))
    body = "\n".join(em.lines) if em.lines else "        pass"
    source = f"def run({params}):\n    with _lock:\n{body}\n"
    code = runner_code(source)
    namespace = em.g
    exec(code, namespace)
    return Runner(namespace["run"], source, table, em.arena, namespace)


def _symbolic_globals(em: RunnerEmitter, memory: MemoryPlan, table: Any) -> None:
    """The sizes array, the bound-sizes key and the rebind of a symbolic runner."""
    sizes = (ctypes.c_int64 * max(len(em.binding), 1))()
    base = ctypes.addressof(sizes)
    for slot, index in em.size_slots:
        table[slot] = base + index * ctypes.sizeof(ctypes.c_int64)
    names = [a for a, _ in em.binding]
    arena: list[torch.Tensor | None] = [None]
    views: list[torch.Tensor] = []
    device = em.device

    def layout(v: Value, values: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        shape = tuple(evaluate(d, values) for d in sizes_of(v.type))
        return shape, tuple(evaluate(s, values) for s in em._strides(v))

    def rebind(key: tuple[int, ...]) -> None:
        values = dict(zip(names, key))
        for i, value in enumerate(key):
            sizes[i] = value
        offsets, total = memory.arena_at(values)
        current = arena[0]
        if current is None or current.numel() < total:
            current = arena[0] = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
        ptr = current.data_ptr()
        for slot, root in em.arena_slots:
            table[slot] = ptr + offsets[id(root)]
        made = []
        for v, view in em.view_specs:
            home = em.root(v)
            start = offsets[id(home.value)]
            nbytes = evaluate(home.nbytes, values)
            assert isinstance(v.type, TensorType)
            t = current[start : start + nbytes].view(v.type.dtype)
            t = t.as_strided(*layout(v, values))
            if view is not None:
                shape, strides, offset = view
                t = t.as_strided(
                    tuple(evaluate(d, values) for d in shape),
                    tuple(evaluate(s, values) for s in strides),
                    t.storage_offset() + evaluate(offset, values),
                )
            made.append(t)
        views[:] = made
        em.g["_B"][0] = key

    em.g.update({"_B": [None], "_V": views, "_rebind": rebind, "_Z": sizes})
    em.g["_bad_sizes"], em.g["_unbound"] = bad_sizes, unbound


RUNNER_FILENAME = "<plait.stax runner>"


def runner_code(source: str) -> CodeType:
    """``compile(source)`` of a runner, kept compiled (marshal) in the kernel cache under the
    source and the interpreter's version: a warm start loads it instead of compiling it
    (about 0.9 ms for ResNet-18). The blob is checked against its SHA-256 before it is read;
    one that fails, or does not unmarshal to code, is compiled again."""
    tag = f"{sys.implementation.cache_tag}\n{sys.version}\n{marshal.version}\n"
    key = hashlib.sha256((tag + source).encode()).hexdigest()

    def make() -> bytes:
        return marshal.dumps(compile(source, RUNNER_FILENAME, "exec"))

    try:
        code = marshal.loads(cached_blob("runners", key, make))
    except (EOFError, ValueError, TypeError):
        code = None
    if not isinstance(code, CodeType):
        code = compile(source, RUNNER_FILENAME, "exec")
        store_blob("runners", key, marshal.dumps(code))  # NOTE: the bad blob replaced
    return code


__all__ = [
    "Runner",
    "build_runner",
    "runner_code",
]
