"""The straight-line runner: one generated Python function per program.

Everything that can be decided before a call is decided here, once: the schedule is unrolled into
Python statements, kernel arguments live in one preallocated pointer table (arena pointers are
written into it once; per call only the pointers of inputs, outputs and PyTorch-allocated results
are refreshed), extern and fallback callables are bound with their attributes, and constants are
globals of the generated function. A call then costs a few hundred nanoseconds per step.

The generated source is kept on the program (``StaxProgram.source``) for debugging.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import marshal
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch

from plait.codegen.build import cached_blob, store_blob
from plait.codegen.fusion import graph_device
from plait.codegen.index import contiguous_strides
from plait.codegen.plan import ExternStep, FallbackStep, KernelStep, Plan
from plait.codegen.views import shape_of
from plait.ir.graph import Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType
from plait.runtime.memory import BufferPlan, MemoryPlan

_LOCAL = re.compile(r"\bv\d+\b")  # NOTE: the runner's locals holding tensors (Emitter.var)


class StaxInputError(TypeError):
    """A call's input does not match the graph's input type."""


def _bad_input(position: int, name: str, expected: str, got: Any) -> None:
    if isinstance(got, torch.Tensor):
        desc = f"{got.dtype} {tuple(got.shape)} on {got.device}"
    else:
        desc = type(got).__name__
    raise StaxInputError(f"input {position} (%{name}): expected {expected}, got {desc}")


def _not_tensor(args: tuple[Any, ...], specs: list[tuple[int, str, str]]) -> None:
    for a, (i, name, expected) in zip(args, specs):
        if not isinstance(a, torch.Tensor):
            _bad_input(i, name, expected, a)
    raise StaxInputError("an input is not a tensor")


def _zero_division() -> None:
    raise RuntimeError("ZeroDivisionError")


def _conform(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``t`` copied into the layout the plan expects (PyTorch chose another one)."""
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _check_result(t: Any, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
        raise RuntimeError(f"{what}: expected {dtype} {shape}, got {t!r:.80}")
    return t if t.is_contiguous() else t.contiguous()


@dataclass
class Runner:
    fn: Callable[..., list[Any]]
    source: str
    table: Any
    arena: torch.Tensor | None
    globals: dict[str, Any] = field(repr=False, default_factory=dict)


class _Emitter:
    def __init__(
        self,
        plan: Plan,
        memory: MemoryPlan,
        symbols: dict[int, Any],
        check: bool,
        profile: bool = False,
        launch: bool = False,
        trace: Callable[[int, tuple[Any, ...]], None] | None = None,
    ) -> None:
        self.plan, self.memory, self.check, self.profile = plan, memory, check, profile
        self.trace = trace
        # NOTE: step index -> a ctypes function reading the pointer table, or (``launch``) a
        # Triton launcher taking one tensor per kernel buffer
        self.funcs = symbols
        self.launch = launch
        self.device = torch.device(graph_device(plan.graph))
        on: dict[str, Any] = {} if self.device.type == "cpu" else {"device": self.device}
        self.g: dict[str, Any] = {
            "_bad_input": _bad_input,
            "_not_tensor": _not_tensor,
            "_zero_division": _zero_division,
            "_conform": _conform,
            "_check_result": _check_result,
            "_empty": functools.partial(torch.empty, **on),
            "_empty_strided": functools.partial(torch.empty_strided, **on),
            "DEV": self.device,
            "_as_strided": torch.as_strided,
            "_grad_enabled": torch.is_grad_enabled,
            "_set_grad": torch._C._set_grad_enabled,
        }
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.inputs = {id(v): i for i, v in enumerate(plan.graph.inputs)}
        self._const = 0
        self.slots = 0
        self.fixed: list[tuple[int, int]] = []  # (slot, arena offset)
        self.arena: torch.Tensor | None = None
        self.arena_views: dict[int, str] = {}

    def const(self, value: Any, prefix: str = "C") -> str:
        name = f"{prefix}{self._const}"
        self._const += 1
        self.g[name] = value
        return name

    def line(self, text: str, depth: int = 2) -> None:
        self.lines.append("    " * depth + text)

    # --- values -------------------------------------------------------------------------------
    def var(self, v: Value) -> str:
        if id(v) in self.inputs:
            return f"a{self.inputs[id(v)]}"
        if id(v) not in self.names:
            self.names[id(v)] = f"v{len(self.names)}"
        return self.names[id(v)]

    def root(self, v: Value) -> BufferPlan:
        bp = self.memory.by_value[v]
        while bp.alias_of is not None:
            bp = self.memory.by_value[bp.alias_of]
        return bp

    def tensor(self, v: Value) -> str:
        """An expression for ``v``'s tensor at this point of the call."""
        if id(v) in self.inputs:
            return self.var(v)
        bp = self.memory.by_value.get(v)
        if bp is not None and self.root(bp.value).home == "arena":
            return self.arena_view(v)
        return self.var(v)

    def arena_view(self, v: Value) -> str:
        if id(v) not in self.arena_views:
            assert self.arena is not None and isinstance(v.type, TensorType)
            root = self.root(v)
            t = self.arena[root.offset : root.offset + root.nbytes].view(v.type.dtype)
            # NOTE: in the layout the plan gave the value (a channels_last activation read by
            # a conv), not a contiguous view of the same bytes.
            shape = shape_of(v.type)
            self.arena_views[id(v)] = self.const(t.as_strided(shape, self._strides(v)), "V")
        return self.arena_views[id(v)]

    def _strides(self, v: Value) -> tuple[int, ...]:
        loc = self.plan.locs.get(v)
        if loc is not None and loc.kind == "buffer" and loc.strides:
            return loc.strides
        return contiguous_strides(shape_of(v.type))

    def operand(self, o: Any) -> str:
        if not isinstance(o, Value):
            return "None" if o is None else self.const(o)
        loc = self.plan.locs[o]
        if loc.kind != "view":
            return self.tensor(o)
        assert loc.base is not None
        base = self.tensor(loc.base)
        shape = shape_of(o.type)
        if base.startswith("V"):
            t = self.g[base]
            return self.const(
                t.as_strided(shape, loc.strides, t.storage_offset() + loc.offset), "V"
            )
        s, st = self.const(shape), self.const(loc.strides)
        return f"_as_strided({base}, {s}, {st}, {base}.storage_offset() + {loc.offset})"

    # --- program ------------------------------------------------------------------------------
    def emit(self) -> None:
        plan = self.plan
        if self.memory.arena_bytes:
            self.arena = torch.empty(self.memory.arena_bytes, dtype=torch.uint8, device=self.device)
        native_inputs = self._native_inputs()
        tensors = [
            (i, v) for i, v in enumerate(plan.graph.inputs) if isinstance(v.type, TensorType)
        ]
        bound = {v for _, v in tensors if self._bound_constant(v)}
        checked = [(i, v) for i, v in tensors if v not in bound]
        if self.check and checked:
            self.line("try:", 2)
            for i, v in checked:
                t = v.type
                assert isinstance(t, TensorType)
                d, s = self.const(t.dtype, "D"), self.const(torch.Size(shape_of(t)), "S")
                a = f"a{i}"
                where = "not {a}.is_cpu" if self.device.type == "cpu" else "{a}.device != DEV"
                cond = f"{a}.dtype is not {d} or {a}.shape != {s} or " + where.format(a=a)
                self.line(f"if {cond}:", 3)
                self.line(f"_bad_input({i}, {v.name!r}, {str(t)!r}, {a})", 4)
            self.line("except AttributeError:", 2)
            names = self.const([(i, v.name, str(v.type)) for i, v in checked])
            args = ", ".join(f"a{i}" for i, _ in checked)
            self.line(f"_not_tensor(({args},), {names})", 3)
        for i, v in tensors:
            dense = v in bound and plan.graph.constants[v.name].is_contiguous()
            if v in native_inputs and not dense:  # NOTE: a bound constant's layout is fixed
                self.line(f"if not a{i}.is_contiguous(): a{i} = a{i}.contiguous()", 2)
        calls = any(not isinstance(s, KernelStep) for s in plan.steps)
        if self.profile:
            self.g["_clock"] = _device_clock(self.device)
            self.g["_P"] = [0.0] * (len(plan.steps) + 1)
            self.line("_t = _clock()")
        ends: list[int] = []
        for k, step in enumerate(plan.steps):
            if isinstance(step, KernelStep):
                self.kernel_step(k, step)
            elif isinstance(step, ExternStep):
                self.extern_step(step)
            else:
                self.fallback_step(step)
            if self.profile:
                self.line(f"_n = _clock(); _P[{k}] += _n - _t; _t = _n")
            if self.trace is not None:
                self.g["_trace"] = self.trace
                outs = "".join(f"{self.tensor(v)}, " for v in step_outputs(step))
                self.line(f"_trace({k}, ({outs}))")
            ends.append(len(self.lines))
        outs = ", ".join(self.output(o) for o in plan.graph.outputs)
        self.line(f"return [{outs}]", 2)
        self._free_dead(ends)
        if calls:
            self.lines = [
                "    " * 2 + "g = _grad_enabled()",
                "    " * 2 + "if g: _set_grad(False)",
                "    " * 2 + "try:",
                *["    " + ln for ln in self.lines],
                "    " * 2 + "finally:",
                "    " * 3 + "if g: _set_grad(True)",
            ]

    def _free_dead(self, ends: list[int]) -> None:
        """``del`` each local after the step that reads it last (a step's lines stay together:
        a C++ kernel reads the pointers its earlier lines stored), so PyTorch's allocator (on
        CUDA, the graph's private pool) reuses an extern's result once nothing reads it."""
        last: dict[str, int] = {}
        step = 0
        for i, text in enumerate(self.lines[: ends[-1]] if ends else ()):
            while i >= ends[step]:
                step += 1
            for name in _LOCAL.findall(text):
                last[name] = step
        kept = set(_LOCAL.findall(self.lines[-1]))  # NOTE: the return line's outputs
        dead: dict[int, list[str]] = {}
        for name, k in last.items():
            if name not in kept:
                dead.setdefault(k, []).append(name)
        for k in sorted(dead, reverse=True):
            names = ", ".join(sorted(dead[k], key=lambda n: int(n[1:])))
            self.lines.insert(ends[k], "    " * 2 + f"del {names}")

    def output(self, o: Any) -> str:
        if isinstance(o, Value):
            return self.tensor(o)
        return self.const(o)

    def _bound_constant(self, v: Value) -> bool:
        """A graph constant is passed as the same tensor on every call (the executor binds
        ``graph.constants``): it is checked once, here, not on every call."""
        t = self.plan.graph.constants.get(v.name)
        if not isinstance(t, torch.Tensor) or v.kind != "const":
            return False
        assert isinstance(v.type, TensorType)
        if t.dtype != v.type.dtype or tuple(t.shape) != shape_of(v.type) or t.device != self.device:
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}"
            raise StaxInputError(f"constant %{v.name}: {got}, the graph says {v.type}")
        return True

    def _native_inputs(self) -> set[Value]:
        out: set[Value] = set()
        for step in self.plan.steps:
            if isinstance(step, KernelStep):
                out.update(v for v in step.lowered.bindings if id(v) in self.inputs)
        for loc in self.plan.locs.values():
            if loc.kind == "view" and loc.base is not None and id(loc.base) in self.inputs:
                out.add(loc.base)
        return out

    def kernel_step(self, k: int, step: KernelStep) -> None:
        if self.launch:
            self.launch_step(k, step)
            return
        kernel = step.lowered.kernel
        base = self.slots
        self.slots += len(kernel.buffers)
        for j, (v, buf) in enumerate(zip(step.lowered.bindings, kernel.buffers)):
            slot = base + j
            if buf.output:
                self._prepare_output(v)
            if id(v) not in self.inputs and self.root(v).home == "arena":
                self.fixed.append((slot, self.root(v).offset))
            else:
                self.line(f"T[{slot}] = {self.tensor(v)}.data_ptr()")
        fn = self.const(self.funcs[k], "K")
        self.line(f"if {fn}({self.const(base, 'A')}): _zero_division()")

    def launch_step(self, k: int, step: KernelStep) -> None:
        """A Triton kernel: launched with one tensor per buffer (its data pointer is what the
        kernel indexes from)."""
        kernel = step.lowered.kernel
        args = []
        for v, buf in zip(step.lowered.bindings, kernel.buffers):
            if buf.output:
                self._prepare_output(v)
            args.append(self.tensor(v))
        fn = self.const(self.funcs[k], "K")
        self.line(f"{fn}({', '.join(args)})")

    def _prepare_output(self, v: Value) -> None:
        bp = self.memory.by_value[v]
        t = v.type
        assert isinstance(t, TensorType)
        if bp.home == "output":
            s, d = self.const(shape_of(t)), self.const(t.dtype, "D")
            self.line(f"{self.var(v)} = _empty({s}, dtype={d})")
        elif bp.home == "fresh":
            s, d = self.const(shape_of(t)), self.const(t.dtype, "D")
            st = self.const(self._strides(v))
            self.line(f"{self.var(v)} = _empty_strided({s}, {st}, dtype={d})")
        elif bp.home == "inplace":
            assert bp.alias_of is not None
            if self.root(v).home == "arena":
                return
            src = self.tensor(bp.alias_of)
            a = bp.alias_of.type
            assert isinstance(a, TensorType)
            if shape_of(a) == shape_of(t):
                self.line(f"{self.var(v)} = {src}")
            else:
                self.line(f"{self.var(v)} = {src}.view({self.const(shape_of(t))})")

    def extern_step(self, step: ExternStep) -> None:
        node = step.node
        args = [self.operand(o) for o in node.inputs]
        args = get_op(node.op).structure(args) + [self.operand(o) for o in step.extra]
        # NOTE: a variadic param (an ``aten`` node's operands) is passed as one list
        spelled = [f"[{', '.join(a)}]" if isinstance(a, list) else a for a in args]
        fn = self.const(step.call.fn, "X")
        outs = [self.var(out) for out in step.outputs]
        # NOTE: a multi-output extern (an ``aten`` node) returns a tuple or list of tensors
        target = outs[0] if len(outs) == 1 else f"({', '.join(outs)},)"
        self.line(f"{target} = {fn}({', '.join(spelled)})")
        for var, out, strides in zip(outs, step.outputs, step.out_strides):
            if isinstance(out.type, TensorType) and not out.type.is_static:
                continue  # NOTE: a data-dependent size: PyTorch's tensor, read only by PyTorch
            if isinstance(out.type, TensorType):
                st = self.const(tuple(strides))
                self.line(f"if {var}.stride() != {st}: {var} = _conform({var}, {st})")

    def fallback_step(self, step: FallbackStep) -> None:
        node = step.node
        opdef = get_op(node.op)
        attrs = self.const(dict(node.attrs))
        runner = self.const(opdef.run, "F")
        args = ", ".join(self.operand(o) for o in node.inputs)
        self.line(f"r = {runner}([{args}], {attrs})")
        for k, v in enumerate(node.outputs):
            var = self.var(v)
            if isinstance(v.type, TensorType):
                s, d = self.const(shape_of(v.type)), self.const(v.type.dtype, "D")
                what = self.const(f"fallback node {node.id} ({node.op}) output {k}")
                self.line(f"{var} = _check_result(r[{k}], {s}, {d}, {what})")
            else:
                self.line(f"{var} = r[{k}]")


def step_outputs(step: KernelStep | ExternStep | FallbackStep) -> list[Value]:
    """The tensor values a step materializes, in the order a traced runner hands them over."""
    outs = step.node.outputs if isinstance(step, FallbackStep) else step.outputs
    return [v for v in outs if isinstance(v.type, TensorType)]


def _device_clock(device: torch.device) -> Callable[[], float]:
    """A wall clock that first waits for the device's queued work (CUDA runs asynchronously)."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


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
    em = _Emitter(plan, memory, funcs, check_inputs, profile, launch, trace)
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
    em.g["T"] = table
    em.g["_lock"] = threading.Lock()
    params = ", ".join(f"a{i}" for i in range(len(plan.graph.inputs)))
    body = "\n".join(em.lines) if em.lines else "        pass"
    source = f"def run({params}):\n    with _lock:\n{body}\n"
    code = runner_code(source)
    namespace = em.g
    exec(code, namespace)
    return Runner(namespace["run"], source, table, em.arena, namespace)


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


def tensor_bytes(t: TensorType) -> int:
    n = 1
    for d in shape_of(t):
        n *= d
    return n * t.dtype.itemsize


__all__ = [
    "Runner",
    "StaxInputError",
    "build_runner",
    "contiguous_strides",
    "runner_code",
    "step_outputs",
    "tensor_bytes",
]
