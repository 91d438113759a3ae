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

The planner runs nothing itself. What only running a call can tell (the strides of an extern's
result, whether oneDNN accepts a call with its post-ops) it asks a layout oracle
(:mod:`plait.codegen.layout_oracle`): a compile's probes the calls, a warm start's replays a
saved plan.

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

from plait.codegen import gemm_conv, native_conv_plan, timed_matmul
from plait.codegen.admission import (
    CONSTANTS,
    TARGETS,
    check_graph,
    classify,
    graph_device,
    live_nodes,
)
from plait.codegen.cuda_extern import copies_operand, cuda_call
from plait.codegen.datadep import datadep_call, touches_unbacked, unbacked
from plait.codegen.extern import make_call
from plait.codegen.index import Ix, contiguous_strides, linear
from plait.codegen.layout_oracle import LayoutOracle, PlanFacts
from plait.codegen.lower import OpenKernel, Unfusable, loop_vars, native_max_pool
from plait.codegen.onednn_postops import Epilogue, find_epilogue, supported, unfused_activation
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
from plait.codegen.pointwise_conv import conv_or_linear_call
from plait.codegen.probing_oracle import ProbingOracle
from plait.codegen.reductions import ELEMENTWISE, OP_CLASS, lower_reduction
from plait.codegen.replaying_oracle import ReplayingOracle
from plait.codegen.saved_layouts import dense, extern_layouts
from plait.codegen.scalar import RULES
from plait.codegen.view_base import COMPLEX_VIEW_COPY, complex_value, materialize_base
from plait.codegen.views import MAPPED_VIEWS, input_index, recomputed_per_element, sizes_of
from plait.ir.graph import Graph, Node, Value
from plait.ir.types import TensorType
from plait.symbolic.poly import Size

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
_COSTLY = frozenset({"exp", "log", "tanh", "erf", "sigmoid", "silu", "gelu", "pow", "div"})
CHEAP = 2
# NOTE: the lowering and the printers walk an inlined expression recursively: one costlier
# than this (a chain of hundreds of single-use ops) is materialized, not inlined further
DEEPEST = 96


class _Planner:
    """Decides each value's location and groups nodes into kernels and calls; what an extern
    call's result looks like, and whether oneDNN takes a call, it asks ``oracle``."""

    def __init__(
        self,
        facts: PlanFacts,
        oracle: LayoutOracle,
        fuse: bool = True,
        mkl_linear: bool = True,
        target: str = "cpu",
        onednn: bool = True,
        timed_matmul: bool = False,
        reread: bool = False,
        native: tuple[str, ...] = native_conv_plan.KINDS,
        gemm_conv: bool = False,
    ) -> None:
        graph = facts.graph
        self.graph = graph
        self.facts = facts
        self.oracle = oracle
        # NOTE: oneDNN and MKL run CPU tensors of the C++ target only; Triton's externs are
        # PyTorch's own kernels on the graph's device (cuDNN, cuBLAS, flash attention).
        self.onednn = target == "cpu" and onednn
        self.timed_matmul = target == "cpu" and timed_matmul
        self.timed = (self.timed_matmul, target == "cpu" and gemm_conv)
        self.device = facts.device
        self.fuse = fuse
        self.channels_last = facts.channels_last
        self.mkl_linear = mkl_linear
        self.users = graph.users()
        self.outputs = {id(o) for o in graph.outputs if isinstance(o, Value)}
        self.live = live_nodes(graph)
        self.target, self.reread = target, reread
        self.kinds = {n.id: self._classify(n) for n in graph.nodes}
        self.locs: dict[Value, Loc] = {}
        self.steps: list[Step] = []
        self.tags: dict[int, NodeTag] = {}
        self._cost: dict[int, int] = {}
        # NOTE: the unbacked sizes of the call running (codegen.datadep), one table per program
        self.unbacked_sizes: dict[str, int] = {}
        self._open_key: tuple[tuple[Size, ...], tuple[Size, ...]] | None = None
        self._open_kernel: OpenKernel | None = None
        self._count = 0
        self.epilogues: dict[int, Epilogue] = {}
        self.unfused: dict[int, str] = {}
        self.exactness: dict[int, str] = {}
        self.fused_into: dict[int, Node] = {}
        # NOTE: convolutions run by plait's kernels, claimed before oneDNN's epilogues
        self.native_convs = native_conv_plan.claim(self, native if fuse and self.onednn else ())
        for node in graph.nodes if fuse and self.onednn else ():
            ep = find_epilogue(node, self.users, self.outputs, self.live, mkl_linear)
            # NOTE: first come, first served: two convs feeding one residual add both find it.
            if (
                node.id in self.live
                and node.id not in self.native_convs
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
    def _classify(self, node: Node) -> tuple[str, str]:
        """:func:`classify`, except what the Triton target computes natively in place of an
        extern call (a max-pool: codegen.lower.native_max_pool)."""
        if self.target == "triton" and native_max_pool(node):
            return "pointwise", ""
        return classify(node)

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
        if self.cost(v) <= CHEAP:
            return False
        if self.cost(v) > DEEPEST:
            return True
        return len({u.id for u in users}) > 1 or recomputed_per_element(v, users, self.layout)

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
        if self._open_kernel is not None:
            self._emit_kernel(self._open_kernel.lowered(), list(self._open_kernel.members))
        self._open_kernel = None

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
            self.oracle.laid_out(v, self.locs[v].strides)

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
        if self.fuse and self._open_kernel is not None and self._open_key == (shape, strides):
            try:
                self._open_kernel.add(v)
                return
            except Unfusable:
                pass
        self.close()
        self._open_key = (shape, strides)
        self._open_kernel = OpenKernel(self._name(), shape, self.locs, strides)
        self._open_kernel.add(v)

    def run(self) -> Plan:
        for v in self.graph.inputs:
            if isinstance(v.type, TensorType):
                strides = contiguous_strides(sizes_of(v.type))
                self.locs[v] = Loc("input", v, 0, strides)
                self.oracle.laid_out(v, strides)
        deferred = {h: ep.nodes[0].id for h, ep in self.epilogues.items()}
        self.oracle.start(self.live, {**deferred, **native_conv_plan.read_at(self.native_convs)})
        for position, node in enumerate(self.graph.nodes):
            self.oracle.at_node(position)
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
                if host.id in self.native_convs:  # NOTE: computed by a native call, at its place
                    if native_conv_plan.at(self.native_convs[host.id][0]) is node:
                        native_conv_plan.emit(self, host)
                    continue
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
            if node.id in self.native_convs:
                if native_conv_plan.at(self.native_convs[node.id][0]) is node:
                    native_conv_plan.emit(self, node)
            elif kind in ("extern", "fallback"):
                if kind == "extern" and self.device.type == "cuda":
                    self._copy_strided_operands(node)
                self.close()
                self._call_step(node, kind, reason)
            elif kind == "reduction":
                self.close()
                self._reduction_step(node)
            else:
                for k, v in enumerate(node.outputs):
                    self.locs[v] = self.view_loc(node, k) if kind == "view" else Loc("inline")
                    if kind == "view" and materialize_base(self, node, k):
                        continue  # NOTE: a view of its input's buffer, in the open kernel
                    if self.needs_buffer(v) and complex_value(v):
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
            {k: dict(v) for k, v in self.oracle.refused.items()}, self.oracle.replayed,
            self.oracle.packs,
            dict(self.exactness),
        )  # fmt: skip

    def _copy_strided_operands(self, node: Node) -> None:
        """A CUDA matrix product's operand that ATen would copy itself (a view that does not
        flatten to a matrix) is written contiguous by a kernel first (codegen.cuda_extern)."""
        for k, u in enumerate(node.inputs):
            if not isinstance(u, Value):
                continue
            loc = self.locs.get(u)
            if loc is None or loc.kind != "view":
                continue
            if copies_operand(node, k, sizes_of(u.type), loc.strides):
                assert u.producer is not None  # NOTE: a view has a producer
                self.tags.pop(u.producer.id, None)  # NOTE: now a kernel's, not "no code"
                self.materialize(u)

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
        lowered = lower_reduction(self._name(), node, self.locs, chain, self.reread)
        self._emit_kernel(lowered, outputs)

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
                self.oracle.laid_out(v, s)
        else:
            step: ExternStep | None = None
            accepted = ""
            if touches_unbacked(node):
                step = self._datadep_step(node)
            elif self.onednn and supported(node):
                mkl, weight, chosen = self.mkl_linear, None, ""
                if self.timed_matmul and timed_matmul.times_linear(node, mkl):
                    mkl, weight, chosen = timed_matmul.choose_linear(
                        node, self.oracle, self.locs, self.facts, self.channels_last
                    )
                o = self.oracle
                args = (self.channels_last, o.prepack, o.packs, mkl, self.facts.hints, weight)
                call = conv_or_linear_call(node, self.facts.consts, None, *args)
                step = ExternStep(node, call, [])
                failure = self.oracle.decide(step, "onednn", self.locs)
                if failure is not None:
                    where = f"{call.library} {node.op}: {failure}"
                    note = "; ".join(x for x in (note, where) if x)
                    step = None
                else:
                    accepted = "; ".join(x for x in (chosen, self.oracle.accepted_note(call)) if x)
            timed = None if step else gemm_conv.timed_step(node, self.facts.consts, *self.timed)
            if timed is not None:
                failure = self.oracle.decide(timed, timed_matmul.STAGE, self.locs)
                step, accepted = gemm_conv.chosen(timed, failure, accepted)
            if step is None:
                special = None
                if self.device.type == "cuda":
                    special = cuda_call(node, self.facts.consts, self.channels_last)
                step = ExternStep(node, special or make_call(node, self.facts.consts), [])
                step.out_strides = self.oracle.result_strides(step, self.locs)
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
                self.oracle.laid_out(v, st)
        return ExternStep(node, datadep_call(node, self.unbacked_sizes), strides)

    def _unfuse(self, host: Node, ep: Epilogue) -> None:
        """Give ``ep``'s nodes back to the ordinary rules (pointwise kernels)."""
        del self.epilogues[host.id]
        for n in ep.nodes:
            del self.fused_into[n.id]
            self.kinds[n.id] = self._classify(n)
        self._cost.clear()

    def _fused_step(self, host: Node, ep: Epilogue) -> str | None:
        """Emit ``host`` with ``ep`` as oneDNN post-ops; the reason, emitting nothing, when
        oneDNN cannot create or run the fused call."""
        o = self.oracle
        args = (self.channels_last, o.prepack, o.packs)
        call = conv_or_linear_call(host, self.facts.consts, ep, *args, hints=self.facts.hints)
        extra = (ep.other,) if ep.other is not None else ()
        step = ExternStep(host, call, [], ep.nodes, extra)
        failure = self.oracle.decide(step, "fused", self.locs)
        if failure is not None:
            return failure
        strides = step.out_strides
        self.steps.append(step)
        accepted = self.oracle.accepted_note(call)
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
    timed_matmul: bool = False,
    reread: bool = False,
    native: tuple[str, ...] = native_conv_plan.KINDS,
    gemm_conv: bool = False,
) -> Plan:
    """Decide locations, kernels and calls for ``graph`` (static shapes, CPU). ``layouts``
    (an extern node's position in ``graph.nodes`` -> its result strides, as
    :func:`extern_layouts` returns) replays a saved plan's layout decisions instead of running
    each extern once on zeros. ``fuse=False``: every pointwise, constant and reduction node is
    its own kernel (no chains, no reduction or extern epilogues, no oneDNN post-ops).
    ``channels_last=False``: every stored value is contiguous, convolutions run on contiguous
    (NCHW) activations (an extern's result keeps PyTorch's layout). ``mkl_linear``: float32
    linears run MKL's packed GEMM, with no post-ops (see
    :class:`~plait.codegen.options.StaxOptions`). ``target``: ``cpu`` (C++ kernels, oneDNN
    and MKL externs) or ``triton`` (Triton kernels; externs are PyTorch's kernels on the
    graph's device). ``onednn=False``: convolutions and linears are PyTorch's own
    kernels on the CPU too. ``timed_matmul``: float32 products without a prepacked weight run
    oneDNN's matmul where it timed faster than PyTorch's kernel (:mod:`.timed_matmul`).
    ``reread``: kernels may read back their own stores (:func:`.reductions.lower_reduction`).
    ``native``: plait's convolution kernels to use (:mod:`.native_conv_plan`). ``gemm_conv``:
    a convolution's backward runs as GEMMs where that timed faster (:mod:`.gemm_conv`)."""
    check_graph(graph, target)
    facts = PlanFacts.of(graph, channels_last)
    oracle: LayoutOracle
    if isinstance(layouts, SavedLayouts):
        oracle = ReplayingOracle(facts, layouts)
    else:
        # NOTE: bare layouts (without the compile's oneDNN decisions) give the strides; each
        # oneDNN call is still probed once
        oracle = ProbingOracle(facts, infer_layouts, layouts)
    args = (fuse, mkl_linear, target, onednn, timed_matmul, reread, native, gemm_conv)
    planner = _Planner(facts, oracle, *args)
    try:
        plan = planner.run()
    except BaseException:
        oracle.close(finished=False)
        raise
    oracle.close(finished=True)
    return plan
