"""Fusion: decide where every value lives and group nodes into kernels and extern calls.

Rules, in order, walking the graph's nodes:

- Extern ops (conv, linear, matmul, attention, pooling, embedding) are calls into PyTorch.
  Opaque calls, random ops that draw numbers and ops with no lowering fall back to PyTorch's
  reference implementation, each with its reason.
- A view of a materialized value (graph input, buffer) whose index map is affine is a strided
  view: no code, no copy; externs receive it as an ``as_strided`` tensor. Other views are index
  maps inlined into their readers.
- A pointwise or constant value is inlined into each reader, except when it is a graph output,
  an extern or fallback reads it, or several nodes read it and recomputing it would cost more
  than two simple ops: then it is materialized (stored to a buffer by a kernel).
- Consecutive materialized values of one shape share one kernel (one loop nest, several stores)
  unless one would read another at a different index.
- Each reduction (and softmax, layer_norm, group_norm) is one kernel from a template, with its
  pointwise producers inlined.
- An extern's result read by a kernel that dies there is written in place by that kernel (the
  memory plan decides): that is the epilogue of a matmul (bias, activation) or a conv (residual
  add, relu), fused into the extern's output.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> w = gb.input("w", TensorType((8, 8), torch.float32))
    >>> gb.output(gb.call("relu", gb.call("add", gb.call("linear", x, w), 1.0)))
    >>> plan = plan_graph(gb.build())
    >>> [type(s).__name__ for s in plan.steps]
    ['ExternStep', 'KernelStep']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from plait.codegen.admission import (
    CONSTANTS,
    TARGETS,
    check_graph,
    classify,
    graph_device,
    live_nodes,
)
from plait.codegen.call_signature import Layout, call_signature
from plait.codegen.cuda_extern import cuda_call
from plait.codegen.datadep import datadep_call, touches_unbacked, unbacked
from plait.codegen.extern import ExternCall, make_call
from plait.codegen.index import Ix, contiguous_strides, linear
from plait.codegen.lower import Unfusable, loop_vars, lower_pointwise
from plait.codegen.onednn import (
    Epilogue,
    PackedWeights,
    Prepacker,
    find_epilogue,
    onednn_call,
    supported,
    unfused_activation,
)
from plait.codegen.placement import Loc, Lowered
from plait.codegen.plan import (
    ExternStep,
    FallbackStep,
    KernelStep,
    NodeTag,
    Plan,
    SavedLayouts,
    Step,
)
from plait.codegen.reductions import ELEMENTWISE, OP_CLASS, lower_reduction
from plait.codegen.saved_layouts import dense, extern_layouts, restored_strides
from plait.codegen.scalar import RULES
from plait.codegen.symbolic_shapes import concrete, hints_for, is_symbolic, learned_strides
from plait.codegen.views import MAPPED_VIEWS, input_index, sizes_of
from plait.ir.graph import Graph, Node, Value
from plait.ir.ops import get_op
from plait.ir.types import COMPLEX_DTYPES, TensorType
from plait.symbolic.poly import Size, evaluate

__all__ = [
    "CONSTANTS",
    "TARGETS",
    "check_graph",
    "classify",
    "extern_layouts",
    "graph_device",
    "live_nodes",
    "plan_graph",
]
_UNSET = object()  # NOTE: a call signature not computed yet (None: the call has none)
SAVED = "(from the saved plan, not probed)"
_COSTLY = frozenset({"exp", "log", "tanh", "erf", "sigmoid", "silu", "gelu", "pow", "div"})
CHEAP = 2


class _Planner:
    def __init__(
        self,
        graph: Graph,
        infer_layouts: bool,
        layouts: Mapping[int, Sequence[Sequence[int]]] | None = None,
        fuse: bool = True,
        channels_last: bool = True,
        mkl_linear: bool = True,
        target: str = "cpu",
        onednn: bool = True,
    ) -> None:
        self.graph = graph
        # NOTE: oneDNN and MKL run CPU tensors of the C++ target only; Triton's externs are
        # PyTorch's own kernels on the graph's device (cuDNN, cuBLAS, flash attention).
        self.onednn = target == "cpu" and onednn
        self.device = torch.device(graph_device(graph))
        # NOTE: symbolic shapes: the dry runs run at representative sizes (codegen.symbolic_shapes)
        self.symbolic = is_symbolic(graph)
        self.hints: dict[str, int] = hints_for(graph) if self.symbolic else {}
        self.fuse = fuse
        self.channels_last = channels_last
        self.mkl_linear = mkl_linear
        self.users = graph.users()
        self.outputs = {id(o) for o in graph.outputs if isinstance(o, Value)}
        self.live = live_nodes(graph)
        self.kinds = {n.id: classify(n) for n in graph.nodes}
        self.locs: dict[Value, Loc] = {}
        self.steps: list[Step] = []
        self.tags: dict[int, NodeTag] = {}
        self._cost: dict[int, int] = {}
        # NOTE: dry-run outcomes by call signature (codegen.call_signature): result strides,
        # oneDNN refusals, and the signatures already probed on fresh tensors
        self._layout_memo: dict[tuple[object, ...], tuple[tuple[Size, ...], ...]] = {}
        self._refusals: dict[tuple[object, ...], str] = {}
        self._probed: set[tuple[object, ...]] = set()
        # NOTE: the unbacked sizes of the call running (codegen.datadep), one table per program
        self.unbacked_sizes: dict[str, int] = {}
        self._open: list[Value] = []
        self._open_key: tuple[tuple[Size, ...], tuple[Size, ...]] | None = None
        self._open_lowered: Lowered | None = None
        self._count = 0
        # NOTE: recorded layouts (from a saved plan) replace the dry runs: same decisions, no
        # extern runs on zeros.
        self._layouts = layouts
        # NOTE: a saved plan that carries its oneDNN decisions replays them unprobed; bare
        # layouts (no decisions) still probe each oneDNN call once.
        self._decided = layouts.refused if isinstance(layouts, SavedLayouts) else None
        self.refused: dict[int, dict[str, str]] = {}
        # NOTE: with the decisions replayed nothing runs a call while planning, so the weight
        # reorders may run in threads meanwhile (done before the plan is returned).
        saved = layouts if isinstance(layouts, SavedLayouts) else None
        gate = saved.gate if saved is not None else None
        self.prepack = Prepacker(gate=gate) if self._decided is not None else None
        self.packs = PackedWeights(
            saved.packed if saved is not None else None, deferred=gate is not None
        )
        self.position = {n.id: i for i, n in enumerate(graph.nodes)}
        self._infer = infer_layouts and layouts is None
        self.consts = {
            v: graph.constants[v.name]
            for v in graph.inputs
            if v.kind == "const" and isinstance(graph.constants.get(v.name), torch.Tensor)
        }
        self._samples: dict[Value, torch.Tensor] = {}
        self.epilogues: dict[int, Epilogue] = {}
        self.unfused: dict[int, str] = {}
        self.exactness: dict[int, str] = {}
        self.fused_into: dict[int, Node] = {}
        for node in graph.nodes if fuse and self.onednn else ():
            ep = find_epilogue(node, self.users, self.outputs, self.live, mkl_linear)
            # NOTE: first come, first served: two convs feeding one residual add both find it.
            if (
                node.id in self.live
                and ep is not None
                and not any(n.id in self.fused_into for n in ep.nodes)
            ):
                self.epilogues[node.id] = ep
                for n in ep.nodes:
                    self.fused_into[n.id] = node
                    self.kinds[n.id] = ("fused", "")
            kept = unfused_activation(node, self.users, self.outputs, self.live, mkl_linear)
            if node.id in self.live and kept is not None:
                act, why = kept
                self.exactness[node.id] = f"{act.op} (node {act.id}) not fused: {why}"

    # --- decisions ----------------------------------------------------------------------------
    def kind(self, node: Node) -> str:
        return self.kinds[node.id][0]

    def cost(self, v: Value) -> int:
        hit = self._cost.get(id(v))
        if hit is not None:
            return hit
        loc = self.locs[v]
        total = 0
        if loc.kind == "inline" and v.producer is not None:
            node = v.producer
            total = 0 if node.op in MAPPED_VIEWS else 4 if node.op in _COSTLY else 1
            total += sum(self.cost(u) for u in node.input_values())
        self._cost[id(v)] = total
        return total

    def needs_buffer(self, v: Value) -> bool:
        if id(v) in self.outputs:
            return True
        loc = self.locs[v]
        users = [u for u in self.users.get(v, []) if u.id in self.live]
        if loc.kind == "view":
            return False
        if any(self.kind(u) in ("extern", "fallback", "fused") for u in users):
            return True
        if not self.fuse:
            return True  # NOTE: no fusion: every pointwise or constant node is its own kernel.
        distinct = {u.id for u in users}
        return len(distinct) > 1 and self.cost(v) > CHEAP

    def view_loc(self, node: Node, k: int) -> Loc:
        """A strided view of the input's base when the index map is affine, else inline."""
        x = node.inputs[0]
        if node.op not in MAPPED_VIEWS or not isinstance(x, Value):
            return Loc("inline")
        base = self.locs[x]
        if base.kind == "inline":
            return Loc("inline")
        out = node.outputs[k]
        shape = sizes_of(out.type)
        idx = tuple(Ix.var(v) for v in loop_vars(shape))
        lin = linear(input_index(node, k, idx), base.strides, base.offset)
        if lin.has_divmod():
            return Loc("inline")
        coefs = []
        for i in idx:
            (var,) = i.vars()
            c = lin.coef(var)
            assert c is not None
            coefs.append(c)
        return Loc("view", base.base, lin.const, tuple(coefs))

    # --- grouping -----------------------------------------------------------------------------
    def _name(self) -> str:
        self._count += 1
        return f"k{self._count - 1}"

    def close(self) -> None:
        if self._open_lowered is not None:
            self._emit_kernel(self._open_lowered, list(self._open))
        self._open, self._open_lowered = [], None

    def _emit_kernel(self, lowered: Lowered, outputs: list[Value]) -> None:
        self.steps.append(KernelStep(lowered, outputs))
        for nid in lowered.covered:
            prev = self.tags.get(nid)
            name = lowered.kernel.name
            if prev is None or prev.executor != "native":
                self.tags[nid] = NodeTag("native", f"kernel {name}")
            elif name not in prev.detail:
                self.tags[nid] = NodeTag("native", f"{prev.detail}, {name}")
        for v in outputs:
            self._sample(v, self.locs[v].strides)

    def layout(self, v: Value) -> tuple[Size, ...]:
        """A materialized value's strides: contiguous for graph outputs; otherwise the dense
        layout of a same-shaped buffer it is computed from (a channels_last conv result keeps
        its epilogue channels_last, so the epilogue can run in place and the next conv gets
        the layout it wants)."""
        shape = sizes_of(v.type)
        contiguous = contiguous_strides(shape)
        if id(v) in self.outputs or not self.channels_last:
            return contiguous
        seen: set[int] = set()
        stack = [v]
        while stack:
            w = stack.pop()
            node = w.producer
            if node is None or id(w) in seen or self.kinds[node.id][0] not in ("pointwise", "view"):
                continue
            seen.add(id(w))
            for u in node.input_values():
                loc = self.locs.get(u)
                if loc is None or sizes_of(u.type) != shape:
                    continue
                if loc.kind in ("buffer", "input") and loc.strides != contiguous:
                    if loc.offset == 0 and dense(shape, loc.strides):
                        return loc.strides
                elif loc.kind == "inline" and node.op in RULES:
                    stack.append(u)
        if (
            len(shape) == 4
            and self._conv_reads_nhwc(v)
            and any(n.op == "conv2d" and n.inputs[0] is v for n in self.users.get(v, ()))
        ):
            # NOTE: a conv's input made by a kernel of another shape (a zero pad before a
            # strided or depthwise conv): written channels_last, as the conv reads it, instead
            # of a copy into that layout at every call
            _, chans, height, width = shape
            return (chans * height * width, 1, width * chans, chans)
        return contiguous

    def _conv_reads_nhwc(self, v: Value) -> bool:
        """Whether a convolution reading ``v`` wants it channels_last: oneDNN's always, cuDNN's
        for 16-bit floats (its float32 kernels read NCHW: codegen.cuda_extern)."""
        if self.device.type != "cuda":
            return True
        return isinstance(v.type, TensorType) and v.type.dtype in (torch.bfloat16, torch.float16)

    def materialize(self, v: Value) -> None:
        shape = sizes_of(v.type)
        strides = self.layout(v)
        self.locs[v] = Loc("buffer", v, 0, strides)
        if self.fuse and self._open and self._open_key == (shape, strides):
            try:
                name = self._open_lowered.kernel.name if self._open_lowered else self._name()
                members = [*self._open, v]
                self._open_lowered = lower_pointwise(name, members, shape, self.locs, strides)
                self._open.append(v)
                return
            except Unfusable:
                pass
        self.close()
        self._open = [v]
        self._open_key = (shape, strides)
        self._open_lowered = lower_pointwise(self._name(), [v], shape, self.locs, strides)

    def run(self) -> Plan:
        for v in self.graph.inputs:
            if isinstance(v.type, TensorType):
                strides = contiguous_strides(sizes_of(v.type))
                self.locs[v] = Loc("input", v, 0, strides)
                self._sample(v, strides)
        self._sample_last = self._sample_lifetimes()
        for position, node in enumerate(self.graph.nodes):
            if self._samples:
                self._prune_samples(position - 1)
            if node.id not in self.live:
                self.tags[node.id] = NodeTag("dead", "result unused")
                continue
            kind, reason = self.kinds[node.id]
            if node.id in self.epilogues:
                continue  # NOTE: emitted with its epilogue, where the epilogue's operands exist.
            if kind == "absorbed":
                continue  # NOTE: computed in the store of the reduction template before it.
            if kind == "fused":
                host = self.fused_into[node.id]
                ep = self.epilogues[host.id]
                if node is not ep.nodes[0]:
                    continue
                self.close()
                failure = self._fused_step(host, ep)
                if failure is None:
                    continue
                # NOTE: oneDNN refused the fused call (some builds cannot create the binary
                # post-op): the host runs unfused here, its epilogue as ordinary nodes.
                self._unfuse(host, ep)
                self._call_step(host, "extern", "", f"{ep.describe()} not fused: {failure}")
                kind, reason = self.kinds[node.id]
            if kind in ("extern", "fallback"):
                self.close()
                self._call_step(node, kind, reason)
            elif kind == "reduction":
                self.close()
                self._reduction_step(node)
            else:
                for k, v in enumerate(node.outputs):
                    self.locs[v] = self.view_loc(node, k) if kind == "view" else Loc("inline")
                    if self.needs_buffer(v) and _complex(v):
                        # NOTE: no kernel computes complex values: PyTorch's view op, copied
                        self.close()
                        self._call_step(node, "fallback", COMPLEX_VIEW_COPY)
                        break
                    if self.needs_buffer(v):
                        self.materialize(v)
                    elif self.locs[v].kind == "view":
                        self.tags[node.id] = NodeTag("native", "strided view (no code)")
        self.close()
        # NOTE: the rebuild's prepacking goes on in the background; each weight's first use
        # waits for its own (PreparedWeight.pending), so the reorders overlap what follows.
        for node in self.graph.nodes:
            if node.id not in self.tags:
                self.tags[node.id] = NodeTag("native", "inlined (no reader needed it)")
        fallbacks = {
            n.id: r
            for n in self.graph.nodes
            for k, r in [self.kinds[n.id]]
            if k == "fallback" and n.id in self.live
        }
        return Plan(
            self.graph, self.locs, self.steps, self.tags, fallbacks, dict(self.unfused),
            {k: dict(v) for k, v in self.refused.items()}, self._decided is not None, self.packs,
            dict(self.exactness),
        )  # fmt: skip

    def _reduction_step(self, node: Node) -> None:
        chain = self._reduction_epilogue(node) if self.fuse else []
        for v in node.outputs:
            self.locs[v] = Loc("buffer", v, 0, contiguous_strides(sizes_of(v.type)))
        if chain:
            self.locs[node.outputs[0]] = Loc("inline")
            for n in chain[:-1]:
                self.locs[n.outputs[0]] = Loc("inline")
            last = chain[-1].outputs[0]
            self.locs[last] = Loc("buffer", last, 0, contiguous_strides(sizes_of(last.type)))
            for n in chain:
                self.kinds[n.id] = ("absorbed", "")
        outputs = [chain[-1].outputs[0]] if chain else list(node.outputs)
        self._emit_kernel(lower_reduction(self._name(), node, self.locs, chain), outputs)

    def _reduction_epilogue(self, node: Node) -> list[Node]:
        """Pointwise nodes reading a row-wise template's result alone, same shape, whose other
        operands exist already: computed in the template's store (layer_norm -> relu)."""
        chain: list[Node] = []
        if node.op not in ELEMENTWISE:
            return chain
        v = node.outputs[0]
        while id(v) not in self.outputs:
            users = {u.id: u for u in self.users.get(v, []) if u.id in self.live}
            if len(users) != 1:
                break
            (u,) = users.values()
            if self.kinds[u.id][0] != "pointwise" or sizes_of(u.outputs[0].type) != sizes_of(
                v.type
            ):
                break
            if any(o is not v and o not in self.locs for o in u.input_values()):
                break  # NOTE: an operand produced after the template: not readable there.
            chain.append(u)
            v = u.outputs[0]
        return chain

    def _call_step(self, node: Node, kind: str, reason: str, note: str = "") -> None:
        if kind == "fallback":
            self.steps.append(FallbackStep(node, reason))
            self.tags[node.id] = NodeTag("fallback", reason)
            strides = [
                contiguous_strides(sizes_of(v.type)) if isinstance(v.type, TensorType) else ()
                for v in node.outputs
            ]
            # NOTE: a fallback's results are samples too: an extern dry-run later may read one
            # (or a view of one); the runner conforms them to these contiguous strides.
            for v, s in zip(node.outputs, strides):
                self._sample(v, s)
        else:
            step: ExternStep | None = None
            accepted = ""
            if touches_unbacked(node):
                step = self._datadep_step(node)
            elif self.onednn and supported(node):
                call = onednn_call(
                    node,
                    self.consts,
                    None,
                    self.channels_last,
                    self.prepack,
                    self.packs,
                    self.mkl_linear,
                    self.hints,
                )
                step = ExternStep(node, call, [])
                failure = self._try_dry_run(step, "onednn")
                if failure is not None:
                    where = f"{call.library} {node.op}: {failure}"
                    note = "; ".join(x for x in (note, where) if x)
                    step = None
                else:
                    accepted = self._accepted_note(call)
            if step is None:
                special = None
                if self.device.type == "cuda":
                    special = cuda_call(node, self.consts, self.channels_last)
                step = ExternStep(node, special or make_call(node, self.consts), [])
                step.out_strides = self._dry_run(step)
            strides = step.out_strides
            call = step.call
            self.steps.append(step)
            exact = self.exactness.get(node.id, "")
            suffix = "".join(f"; {x}" for x in (note, accepted, exact) if x)
            self.tags[node.id] = NodeTag(
                "extern", f"{call.detail} ({OP_CLASS.get(node.op, call.op_class)}){suffix}"
            )
            if note:
                self.unfused[node.id] = note
        for v, s in zip(node.outputs, strides):
            self.locs[v] = Loc("buffer" if isinstance(v.type, TensorType) else "object", v, 0, s)

    def _datadep_step(self, node: Node) -> ExternStep:
        """A call that makes or reads a data-dependent size: never dry-run (no sample has its
        size); static results are conformed to contiguous strides, the others are PyTorch's
        (``()``: whatever strides the call returns)."""
        strides = [
            () if unbacked(v.type) else contiguous_strides(sizes_of(v.type)) for v in node.outputs
        ]
        for v, st in zip(node.outputs, strides):
            if not unbacked(v.type):
                self._sample(v, st)
        return ExternStep(node, datadep_call(node, self.unbacked_sizes), strides)

    def _try_dry_run(self, step: ExternStep, stage: str) -> str | None:
        """Dry-run ``step`` (and, when no dry run would run it, probe it once on fresh tensors):
        ``None`` when oneDNN accepts the call, else the reason it refused (decided here, at
        compile time, never per call). With a saved plan's decisions, the decision is read
        from them: nothing runs."""
        position = self.position[step.node.id]
        if self._decided is not None:
            reason = self._decided.get(position, {}).get(stage)
            if reason is None:
                step.out_strides = self._dry_run(step)
                return None
            self.refused.setdefault(position, {})[stage] = reason
            return f"{reason} {SAVED}"
        key = self._signature(step)
        if key is not None and key in self._refusals:
            reason = self._refusals[key]
            self.refused.setdefault(position, {})[stage] = reason
            return reason
        try:
            ran = self._infer and self.channels_last and self._layouts is None
            step.out_strides = self._dry_run(step, key)
            if not ran and (key is None or key not in self._probed):
                self._probe(step)
                if key is not None:
                    self._probed.add(key)
        except RuntimeError as e:
            why = str(e).splitlines()[0]
            reason = f"{step.call.library} refused the call at compile time ({why})"
            self.refused.setdefault(position, {})[stage] = reason
            if key is not None:
                self._refusals[key] = reason
            return reason
        return None

    def _signature(self, step: ExternStep) -> tuple[object, ...] | None:
        return call_signature(step.node, step.call.detail, self._call_layout, step.extra)

    def _call_layout(self, v: Value) -> Layout | None:
        const = self.consts.get(v)
        if const is not None:
            return tuple(const.shape), tuple(const.stride()), const.storage_offset()
        loc = self.locs.get(v)
        if loc is None or loc.kind == "inline":
            return None
        shape = sizes_of(v.type) if isinstance(v.type, TensorType) else ()
        return shape, loc.strides, loc.offset  # type: ignore[return-value]

    def _accepted_note(self, call: ExternCall) -> str:
        if self._decided is None:
            return ""
        return f"accepted by {call.library} at compile time {SAVED}"

    def _probe(self, step: ExternStep) -> None:
        def fresh(o: object) -> object:
            if not isinstance(o, Value) or not isinstance(o.type, TensorType):
                return o
            const = self.consts.get(o)
            if const is not None:
                return const
            # NOTE: see _sample
            return torch.zeros(
                self._hinted(sizes_of(o.type)), dtype=o.type.dtype, device=self.device
            )

        args = get_op(step.node.op).structure([fresh(o) for o in step.node.inputs])
        args += [fresh(o) for o in step.extra]
        with torch.no_grad():
            step.call.fn(*args)

    def _unfuse(self, host: Node, ep: Epilogue) -> None:
        """Give ``ep``'s nodes back to the ordinary rules (pointwise kernels)."""
        del self.epilogues[host.id]
        for n in ep.nodes:
            del self.fused_into[n.id]
            self.kinds[n.id] = classify(n)
        self._cost.clear()

    def _fused_step(self, host: Node, ep: Epilogue) -> str | None:
        """Emit ``host`` with ``ep`` as oneDNN post-ops; the reason, emitting nothing, when
        oneDNN cannot create or run the fused call."""
        call = onednn_call(
            host, self.consts, ep, self.channels_last, self.prepack, self.packs, hints=self.hints
        )
        extra = (ep.other,) if ep.other is not None else ()
        step = ExternStep(host, call, [], ep.nodes, extra)
        failure = self._try_dry_run(step, "fused")
        if failure is not None:
            return failure
        strides = step.out_strides
        self.steps.append(step)
        accepted = self._accepted_note(call)
        suffix = "".join(f"; {x}" for x in (accepted, self.exactness.get(host.id)) if x)
        self.tags[host.id] = NodeTag("extern", f"{call.detail} ({call.op_class}){suffix}")
        for n in ep.nodes:
            self.tags[n.id] = NodeTag(
                "extern", f"fused into node {host.id} ({host.op}) as a oneDNN post-op"
            )
        for v in host.outputs:
            self.locs[v] = Loc("inline")  # NOTE: never materialized: only the epilogue read it.
        for n in ep.nodes[:-1]:
            for v in n.outputs:
                self.locs[v] = Loc("inline")
        self.locs[ep.output] = Loc("buffer", ep.output, 0, strides[0])
        return None

    # --- layout inference ---------------------------------------------------------------------
    def _hinted(self, sizes: Sequence[Size]) -> tuple[int, ...]:
        """Sizes at the representative values of the symbols (the dry runs' samples)."""
        return concrete(sizes, self.hints) if self.symbolic else tuple(sizes)  # type: ignore[arg-type]

    def _sample(self, v: Value, strides: tuple[Size, ...]) -> None:
        if not self._infer or not isinstance(v.type, TensorType):
            return
        shape, strides = self._hinted(sizes_of(v.type)), self._hinted(strides)
        dtype = v.type.dtype
        # NOTE: zeros, never torch.empty: recycled memory holds old values, denormal floats
        # among them, and a dry run on denormals ran 3-4x slower (ResNet-50's plan: 0.9 s
        # against 0.26 s); integers may be indices and must be in range.
        t = torch.zeros(shape, dtype=dtype, device=self.device)
        self._samples[v] = t.as_strided(shape, strides) if dense(shape, strides) else t

    def _sample_lifetimes(self) -> dict[int, int]:
        """Per value, the last node position that reads it, directly or through views (a
        deferred extern reads at its epilogue's position): samples are freed after it."""
        position = {n.id: i for i, n in enumerate(self.graph.nodes)}
        for host, ep in self.epilogues.items():
            position[host] = position[ep.nodes[0].id]
        last: dict[int, int] = {}
        for node in reversed(self.graph.nodes):
            if node.id not in self.live:
                continue
            for o in node.outputs:
                if node.op in MAPPED_VIEWS and isinstance(node.inputs[0], Value):
                    x = node.inputs[0]
                    last[id(x)] = max(last.get(id(x), -1), last.get(id(o), -1))
            for u in node.input_values():
                last[id(u)] = max(last.get(id(u), -1), position[node.id])
        return last

    def _prune_samples(self, position: int) -> None:
        for v in [v for v in self._samples if self._sample_last.get(id(v), -1) <= position]:
            del self._samples[v]

    def _operand_sample(self, operand: object) -> object:
        if not isinstance(operand, Value):
            return operand
        const = self.consts.get(operand)
        if const is not None:
            # NOTE: a constant is its own sample: a weight prepared (prepacked) for the dry run
            # is then the one the calls use, not one of a stand-in they would redo.
            return const
        loc = self.locs[operand]
        assert loc.base is not None, f"%{operand.name} should have been materialized"
        base = self._samples[loc.base]
        if loc.kind == "view":
            offset = evaluate(loc.offset, self.hints)
            return base.as_strided(
                self._hinted(sizes_of(operand.type)),
                self._hinted(loc.strides),
                base.storage_offset() + offset,
            )
        return base

    def _dry_run(self, step: ExternStep, key: object = _UNSET) -> list[tuple[Size, ...]]:
        """Run the extern once on zeros to learn the layout PyTorch gives its result (``key``:
        its call signature, when the caller has it)."""
        node = step.node
        if self._layouts is not None:
            saved = self._layouts[self.position[node.id]]
            return [restored_strides(v, s) for v, s in zip(step.outputs, saved)]
        contiguous = [contiguous_strides(sizes_of(v.type)) for v in step.outputs]
        if not self._infer:
            return contiguous
        effect = node.op == "aten_check" or get_op(node.op).is_random(node.attrs)
        if not self.channels_last or effect:
            # NOTE: no channels_last anywhere: a result PyTorch lays out otherwise is conformed.
            # A check never runs on zeros (it raises), nor a random node (it would draw).
            for v, c in zip(step.outputs, contiguous):
                self._sample(v, c)
            return contiguous
        if key is _UNSET:
            key = self._signature(step)
        remembered = self._layout_memo.get(key) if isinstance(key, tuple) else None
        if remembered is not None:
            # NOTE: a call of this signature ran already: its result layout is this one's
            for v, s in zip(step.outputs, remembered):
                self._sample(v, s)
            return list(remembered)
        args = get_op(node.op).structure([self._operand_sample(o) for o in node.inputs])
        args += [self._operand_sample(o) for o in step.extra]
        try:
            with torch.no_grad():
                result = step.call.fn(*args)
        except (RuntimeError, ValueError):
            if node.op not in ("aten", "aten_factory"):
                raise
            # NOTE: an ATen extern may refuse placeholder values (lu_solve's pivots, a
            # Cholesky factor): its results are conformed to contiguous strides instead.
            for v, c in zip(step.outputs, contiguous):
                self._sample(v, c)
            return contiguous
        results = result if isinstance(result, (tuple, list)) else (result,)
        out: list[tuple[Size, ...]] = []
        for v, r, c in zip(step.outputs, results, contiguous):
            got = tuple(int(x) for x in r.stride())
            shape = sizes_of(v.type)
            usable = r.storage_offset() == 0 and dense(self._hinted(shape), got)
            if usable and self.symbolic:
                # NOTE: the dim order the dry run shows, as strides of the symbolic shape
                learned = learned_strides(shape, got, self.hints)
                usable = learned is not None
                out.append(learned if learned is not None else c)
            else:
                out.append(got if usable else c)
            self._samples[v] = r if usable else r.contiguous()
        if isinstance(key, tuple):
            self._layout_memo[key] = tuple(out)
        return out


COMPLEX_VIEW_COPY = (
    "a view of a complex tensor the program returns: PyTorch's view, copied (Stax kernels "
    "compute real dtypes only)"
)


def _complex(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.dtype in COMPLEX_DTYPES


def plan_graph(
    graph: Graph,
    *,
    infer_layouts: bool = True,
    layouts: Mapping[int, Sequence[Sequence[int]]] | None = None,
    fuse: bool = True,
    channels_last: bool = True,
    mkl_linear: bool = True,
    target: str = "cpu",
    onednn: bool = True,
) -> Plan:
    """Decide locations, kernels and calls for ``graph`` (static shapes, CPU). ``layouts``
    (an extern node's position in ``graph.nodes`` -> its result strides, as
    :func:`extern_layouts` returns) replays a saved plan's layout decisions instead of running
    each extern once on zeros. ``fuse=False``: every pointwise, constant and reduction node is
    its own kernel (no chains, no reduction or extern epilogues, no oneDNN post-ops).
    ``channels_last=False``: every stored value and extern result is contiguous, convolutions
    run on contiguous (NCHW) activations. ``mkl_linear``: float32 linears run MKL's packed GEMM,
    with no post-ops (see :class:`~plait.codegen.options.StaxOptions`). ``target``: ``cpu``
    (C++ kernels, oneDNN and MKL externs) or ``triton`` (Triton kernels; externs are PyTorch's
    kernels on the graph's device). ``onednn=False``: convolutions and linears are PyTorch's own
    kernels on the CPU too."""
    check_graph(graph, target)
    planner = _Planner(
        graph, infer_layouts, layouts, fuse, channels_last, mkl_linear, target, onednn
    )
    try:
        plan = planner.run()
    except BaseException:
        if planner.prepack is not None:
            planner.prepack.close()
        raise
    if planner.prepack is not None:
        planner.prepack.close(finish=True)
    return plan
