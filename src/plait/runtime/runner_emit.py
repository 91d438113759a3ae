"""The printer of a runner's Python source (:class:`RunnerEmitter`): the schedule unrolled into
statements, kernel arguments as slots of one pointer table, extern and fallback calls with their
attributes bound as globals, and, with symbolic shapes, the binding of the call's sizes and the
arena views rebuilt for them (:mod:`plait.runtime.runner` compiles the source and fills the
table).

NOTE: the generated function's locals holding tensors are ``v<n>`` (``a<i>`` for inputs), each
deleted after the last step that reads it; its globals are the emitter's ``g``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch

from plait.codegen.fusion import graph_device
from plait.codegen.index import contiguous_strides
from plait.codegen.plan import ExternStep, FallbackStep, KernelStep, Plan
from plait.codegen.symbolic_shapes import binding_code, is_symbolic, python_size, size_local
from plait.codegen.views import guarded_atom_bound, shape_of, sizes_of
from plait.ir.graph import Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType
from plait.runtime.memory import BufferPlan, MemoryPlan, step_reads
from plait.runtime.native_run import emit_run, plan_runs
from plait.runtime.runner_calls import (
    StaxInputError,
    bad_input,
    check_result,
    conform,
    device_clock,
    not_tensor,
    owned,
    returned,
    zero_division,
)
from plait.symbolic import has_unbacked
from plait.symbolic.poly import Poly, Size, from_dim

_LOCAL = re.compile(r"\bv\d+\b")  # NOTE: the runner's locals holding tensors (Emitter.var)


def _rank(v: Value) -> int:
    assert isinstance(v.type, TensorType)
    return v.type.rank


def _has_size(value: Any) -> bool:
    """Whether a runner constant holds a symbolic size (then it is computed per call)."""
    if isinstance(value, Poly):
        return True
    if isinstance(value, sympy.Expr):
        return bool(value.free_symbols)
    if isinstance(value, (tuple, list)):
        return any(_has_size(v) for v in value)
    if isinstance(value, dict):
        return any(_has_size(v) for v in value.values())
    return False


class RunnerEmitter:
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
            "_bad_input": bad_input,
            "_not_tensor": not_tensor,
            "_zero_division": zero_division,
            "_conform": conform,
            "_owned": owned,
            "_check_result": check_result,
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
        # NOTE: results that are one tensor at every call (a native call's own:
        # plait.runtime.native_run), by value id: the global holding it
        self.fixed_results: dict[int, str] = {}
        # NOTE: symbolic shapes: the size atoms a call binds (in order), the table slots that
        # point at their values, the arena slots and views rebuilt when the sizes change
        self.symbolic = is_symbolic(plan.graph)
        self.binding = binding_code(plan.graph) if self.symbolic else []
        self.atom_index = {a: i for i, (a, _) in enumerate(self.binding)}
        self.size_slots: list[tuple[int, int]] = []
        self.arena_slots: list[tuple[int, Value]] = []
        self.view_specs: list[tuple[Value, tuple[Any, ...] | None]] = []
        self.symbolic_views: dict[tuple[int, str], str] = {}
        # NOTE: extern results only the return reads: raw while ``_RAW[0]`` (a CUDA graph's
        # capture: Runner.returning_as_laid_out)
        self.returned = returned_only(plan)
        if self.returned:
            self.g["_returned"] = returned
            self.g["_RAW"] = [False]

    def const(self, value: Any, prefix: str = "C") -> str:
        """A global of the generated function holding ``value``; a value holding symbolic sizes
        is the Python expression that computes it from the call's bound sizes instead."""
        if self.symbolic and _has_size(value):
            return self.expression(value)
        name = f"{prefix}{self._const}"
        self._const += 1
        self.g[name] = value
        return name

    def expression(self, value: Any) -> str:
        """Python code for a value holding symbolic sizes (tuples, lists, dicts of them)."""
        if isinstance(value, Poly):
            return f"({python_size(value)})"
        if isinstance(value, sympy.Expr):
            return f"({python_size(from_dim(value))})"
        if isinstance(value, tuple):
            return "(" + "".join(f"{self.expression(v)}, " for v in value) + ")"
        if isinstance(value, list):
            return "[" + ", ".join(self.expression(v) for v in value) + "]"
        if isinstance(value, dict):
            items = ", ".join(f"{k!r}: {self.expression(v)}" for k, v in value.items())
            return "{" + items + "}"
        if value is None or type(value) in (int, bool, str):
            return repr(value)
        return self.const(value)

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
        if id(v) in self.fixed_results:
            return self.fixed_results[id(v)]
        bp = self.memory.by_value.get(v)
        if bp is not None and self.root(bp.value).home == "arena":
            return self.arena_view(v)
        return self.var(v)

    def arena_view(self, v: Value) -> str:
        if self.symbolic:
            return self._symbolic_view(v, None)
        if id(v) not in self.arena_views:
            assert self.arena is not None and isinstance(v.type, TensorType)
            root = self.root(v)
            t = self.arena[root.offset : root.offset + int(root.nbytes)].view(v.type.dtype)
            # NOTE: in the layout the plan gave the value (a channels_last activation read by
            # a conv), not a contiguous view of the same bytes.
            shape = shape_of(v.type)
            strides = [int(s) for s in self._strides(v)]
            self.arena_views[id(v)] = self.const(t.as_strided(shape, strides), "V")
        return self.arena_views[id(v)]

    def _strides(self, v: Value) -> tuple[Size, ...]:
        loc = self.plan.locs.get(v)
        if loc is not None and loc.kind == "buffer" and loc.strides:
            return loc.strides
        return contiguous_strides(sizes_of(v.type))

    def operand(self, o: Any) -> str:
        if not isinstance(o, Value):
            return "None" if o is None else self.const(o)
        loc = self.plan.locs[o]
        if loc.kind != "view":
            return self.tensor(o)
        assert loc.base is not None
        base = self.tensor(loc.base)
        shape = sizes_of(o.type)
        if self.symbolic and base.startswith("_V["):
            return self._symbolic_view(loc.base, (shape, loc.strides, loc.offset))
        if base.startswith("V"):
            t = self.g[base]
            return self.const(
                t.as_strided(shape, loc.strides, t.storage_offset() + loc.offset), "V"
            )
        s, st = self.const(shape), self.const(loc.strides)
        offset = python_size(loc.offset) if isinstance(loc.offset, Poly) else loc.offset
        return f"_as_strided({base}, {s}, {st}, {base}.storage_offset() + {offset})"

    def _symbolic_view(self, v: Value, view: tuple[Any, ...] | None) -> str:
        """An arena value (or a strided ``view`` of one: shape, strides, offset) with symbolic
        sizes: a tensor the rebind makes for the call's sizes, ``_V[j]``."""
        key = (id(v), repr(view))
        if key not in self.symbolic_views:
            self.view_specs.append((v, view))
            self.symbolic_views[key] = f"_V[{len(self.view_specs) - 1}]"
        return self.symbolic_views[key]

    def _bind_sizes(self, checked: list[tuple[int, Value]]) -> None:
        """Read the call's size atoms into locals, check them, rebind on a change."""
        lines = [f"{size_local(a)} = {code}" for a, code in self.binding]
        if self.check:
            self.line("try:", 2)
            for text in lines:
                self.line(text, 3)
            self.line("except (AttributeError, IndexError):", 2)
            specs = self.const([(i, v.name, str(v.type), _rank(v)) for i, v in checked])
            args = ", ".join(f"a{i}" for i, _ in checked)
            self.line(f"_unbound(({args},), {specs})", 3)
        else:
            for text in lines:
                self.line(text, 2)
        key = "(" + "".join(f"{size_local(a)}, " for a, _ in self.binding) + ")"
        self.line(f"_k = {key}")
        symbols = [a for a, code in self.binding if code.startswith("a")]
        if self.check and symbols:
            # NOTE: the least size each may take: kernels were proved in bounds for it (a piece
            # of s - 1 rows is not empty at s >= 2, plait.codegen.views.guarded_atom_bound)
            least = [max(1, guarded_atom_bound(a) or 1) for a in symbols]
            low = " or ".join(f"{size_local(a)} < {n}" for a, n in zip(symbols, least))
            values = "(" + "".join(f"{size_local(a)}, " for a in symbols) + ")"
            self.line(f"if {low}: _bad_sizes({symbols!r}, {values}, {least!r})")
        self.line("if _k != _B[0]: _rebind(_k)")

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
        if self.symbolic:
            self._bind_sizes(checked)
        if self.check and checked:
            self.line("try:", 2)
            for i, v in checked:
                t = v.type
                assert isinstance(t, TensorType)
                shape = sizes_of(t)
                spelled = shape if _has_size(shape) else torch.Size(shape)  # type: ignore[arg-type]
                d, s = self.const(t.dtype, "D"), self.const(spelled, "S")
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
            self.g["_clock"] = device_clock(self.device)
            self.g["_P"] = [0.0] * (len(plan.steps) + 1)
            self.line("_t = _clock()")
        ends: list[int] = []
        runs = plan_runs(self, plan.steps)
        run_end = 0
        for k, step in enumerate(plan.steps):
            if k in runs:
                run_end, members = runs[k]
                emit_run(self, k, plan.steps[k:run_end], members)
            if k < run_end:
                ends.append(len(self.lines))  # NOTE: the run's lines stand at its first step
                continue
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
            if id(o) in self.inputs and self._bound_constant(o):
                # NOTE: a constant the executor binds is the program's, not the caller's: the
                # caller gets a copy (handing it out would let a write change later calls)
                return f"{self.tensor(o)}.clone()"
            return self.tensor(o)
        return self.const(o)

    def _bound_constant(self, v: Value) -> bool:
        """A graph constant is passed as the same tensor on every call (the executor binds
        ``graph.constants``): it is checked once, here, not on every call."""
        t = self.plan.graph.constants.get(v.name)
        if not isinstance(t, torch.Tensor) or v.kind != "const":
            return False
        assert isinstance(v.type, TensorType)
        if t.dtype != v.type.dtype or tuple(t.shape) != sizes_of(v.type) or t.device != self.device:
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
                if self.symbolic:
                    self.arena_slots.append((slot, self.root(v).value))
                else:
                    self.fixed.append((slot, self.root(v).offset))
            else:
                self.line(f"T[{slot}] = {self.tensor(v)}.data_ptr()")
        for atom in kernel.size_atoms():
            # NOTE: a symbolic kernel reads each size it uses through one more pointer
            self.size_slots.append((self.slots, self.atom_index[atom]))
            self.slots += 1
        fn = self.const(self.funcs[k], "K")
        self.line(f"if {fn}({self.const(base, 'A')}): _zero_division()")

    def launch_step(self, k: int, step: KernelStep) -> None:
        """A Triton kernel: launched with one tensor per buffer (its data pointer is what the
        kernel indexes from), then, with symbolic shapes, the call's value of each size atom
        the kernel uses (the launcher computes its grid from them)."""
        kernel = step.lowered.kernel
        args = []
        for v, buf in zip(step.lowered.bindings, kernel.buffers):
            if buf.output:
                self._prepare_output(v)
            args.append(self.tensor(v))
        args += [size_local(atom) for atom in kernel.size_atoms()]
        fn = self.const(self.funcs[k], "K")
        self.line(f"{fn}({', '.join(args)})")

    def _prepare_output(self, v: Value) -> None:
        bp = self.memory.by_value[v]
        t = v.type
        assert isinstance(t, TensorType)
        if bp.home == "output":
            s, d = self.const(sizes_of(t)), self.const(t.dtype, "D")
            self.line(f"{self.var(v)} = _empty({s}, dtype={d})")
        elif bp.home == "fresh":
            s, d = self.const(sizes_of(t)), self.const(t.dtype, "D")
            st = self.const(self._strides(v))
            self.line(f"{self.var(v)} = _empty_strided({s}, {st}, dtype={d})")
        elif bp.home == "inplace":
            assert bp.alias_of is not None
            if self.root(v).home == "arena":
                return
            src = self.tensor(bp.alias_of)
            a = bp.alias_of.type
            assert isinstance(a, TensorType)
            if sizes_of(a) == sizes_of(t):
                self.line(f"{self.var(v)} = {src}")
            else:
                self.line(f"{self.var(v)} = {src}.view({self.const(sizes_of(t))})")

    def extern_args(self, step: ExternStep) -> list[Any]:
        """The code of an extern call's operands, in its order (a variadic param, an ``aten``
        node's operands, as a list of them)."""
        args = [self.operand(o) for o in step.node_inputs()]
        return get_op(step.node.op).structure(args) + [self.operand(o) for o in step.extra]

    def extern_step(self, step: ExternStep) -> None:
        args = self.extern_args(step)
        # NOTE: a variadic param (an ``aten`` node's operands) is passed as one list
        spelled = [f"[{', '.join(a)}]" if isinstance(a, list) else a for a in args]
        fn = self.const(step.call.fn, "X")
        outs = [self.var(out) for out in step.outputs]
        # NOTE: a multi-output extern (an ``aten`` node) returns a tuple or list of tensors
        target = outs[0] if len(outs) == 1 else f"({', '.join(outs)},)"
        first = step.outputs[0] if step.outputs else None
        native = bool(step.out_strides) and step.call.native_result(step.out_strides[0])
        if native and first is not None and self.root(first).home == "arena":
            # NOTE: the call writes its result into the arena buffer the plan gave it (never a
            # symbolic plan's: codegen memory plans such results "torch" there)
            spelled.append(f"out={self.arena_view(first)}")
        self.line(f"{target} = {fn}({', '.join(spelled)})")
        tensors = [self.operand(o) for o in step.operands() if isinstance(o, Value)]
        operands = f"({''.join(f'{a}, ' for a in tensors)})"
        for var, out, strides in zip(outs, step.outputs, step.out_strides):
            if isinstance(out.type, TensorType) and has_unbacked(out.type.shape):
                continue  # NOTE: a data-dependent size: PyTorch's tensor, read only by PyTorch
            if isinstance(out.type, TensorType) and not native:
                # NOTE: the plan owns each result: a view of an operand is copied (runner_calls)
                st = self.const(tuple(strides))
                if id(out) in self.returned:
                    self.line(f"{var} = _returned({var}, {st}, {operands}, _RAW)")
                else:
                    self.line(f"{var} = _owned({var}, {st}, {operands})")

    def fallback_step(self, step: FallbackStep) -> None:
        node = step.node
        opdef = get_op(node.op)
        attrs = self.const(dict(node.attrs))
        runner = self.const(opdef.run, "F")
        args = ", ".join(self.operand(o) for o in node.inputs)
        self.line(f"a = [{args}]")
        self.line(f"r = {runner}(a, {attrs})")
        for k, v in enumerate(node.outputs):
            var = self.var(v)
            if isinstance(v.type, TensorType):
                s, d = self.const(sizes_of(v.type)), self.const(v.type.dtype, "D")
                what = self.const(f"fallback node {node.id} ({node.op}) output {k}")
                self.line(f"{var} = _check_result(r[{k}], {s}, {d}, {what}, a)")
            else:
                self.line(f"{var} = r[{k}]")


def returned_only(plan: Plan) -> dict[int, tuple[int, ...]]:
    """The extern results of a static CUDA plan that only the program's return reads (no step,
    no other output's view), by value id, with the strides the plan gives them. The runner
    conforms them to those strides, as every extern result, except while a CUDA graph captures
    it: the graphed call copies its outputs out anyway, and copies these into the plan's
    strides then (``cuda_graph_inputs``), so that a padded product's result (a view of its
    real columns) is not copied into them inside the graph and copied out once more."""
    if is_symbolic(plan.graph) or torch.device(graph_device(plan.graph)).type != "cuda":
        return {}
    outputs = [o for o in plan.graph.outputs if isinstance(o, Value)]
    results = {
        id(v)
        for step in plan.steps
        if isinstance(step, ExternStep)
        for v in step.outputs
        if isinstance(v.type, TensorType) and not has_unbacked(v.type.shape)
    }
    read = {id(v) for step in plan.steps for v in step_reads(plan, step)}
    for o in outputs:
        loc = plan.locs.get(o)
        if loc is not None and loc.base is not None and loc.base is not o:
            read.add(id(loc.base))  # NOTE: another output views it
    out: dict[int, tuple[int, ...]] = {}
    for o in outputs:
        loc = plan.locs.get(o)
        if id(o) not in results or id(o) in read or loc is None or loc.kind != "buffer":
            continue
        if all(isinstance(s, int) for s in loc.strides):
            out[id(o)] = tuple(int(s) for s in loc.strides)
    return out


def step_outputs(step: KernelStep | ExternStep | FallbackStep) -> list[Value]:
    """The tensor values a step materializes, in the order a traced runner hands them over."""
    outs = step.node.outputs if isinstance(step, FallbackStep) else step.outputs
    return [v for v in outs if isinstance(v.type, TensorType)]
