"""The probing layout oracle: a compile's answers, learned by running the calls.

Each extern runs once on zeros (samples of its operands, laid out as the plan lays them out)
to see the layout PyTorch gives its result; each oneDNN call is tried before the plan relies on
it, so a call oneDNN refuses (some builds cannot create a binary post-op) is decided at compile
time, never per call. Calls of one signature (:mod:`plait.codegen.call_signature`) run once:
their layouts and refusals are remembered. Samples are freed after their last reader.

Without layout inference (``infer=False``) every result is contiguous and nothing runs on
samples; ``recorded`` layouts (a caller's own, without the compile's oneDNN decisions) give
the strides. Either way each oneDNN call is still probed once, on fresh tensors.

Example:
    >>> import torch
    >>> from plait.codegen.fusion import plan_graph
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((2, 3, 4, 4), torch.float32))
    >>> w = gb.input("w", TensorType((5, 3, 1, 1), torch.float32))
    >>> gb.output(gb.call("exp", gb.call("conv2d", x, w)))
    >>> plan = plan_graph(gb.build())
    >>> plan.steps[0].out_strides  # oneDNN's channels_last result
    [(80, 1, 20, 5)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from plait.codegen import timed_choices, timed_matmul
from plait.codegen.call_signature import Layout, call_signature
from plait.codegen.extern import ExternCall, make_call
from plait.codegen.index import contiguous_strides
from plait.codegen.layout_oracle import PlanFacts, Strides
from plait.codegen.onednn import PackedWeights, Prepacker
from plait.codegen.placement import Loc
from plait.codegen.plan import ExternStep
from plait.codegen.saved_layouts import dense, restored_strides
from plait.codegen.symbolic_shapes import concrete, learned_strides
from plait.codegen.views import MAPPED_VIEWS, sizes_of
from plait.ir.graph import Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType
from plait.symbolic.poly import Size, evaluate

_UNSET = object()  # NOTE: a call signature not computed yet (None: the call has none)


class ProbingOracle:
    """A :class:`~plait.codegen.layout_oracle.LayoutOracle` that runs the calls (dry runs on
    zeros with ``infer``; otherwise contiguous or ``recorded`` strides, and oneDNN probes)."""

    replayed = False

    def __init__(
        self,
        facts: PlanFacts,
        infer: bool,
        recorded: Mapping[int, Sequence[Sequence[int]]] | None = None,
    ) -> None:
        self._facts = facts
        self._recorded = recorded
        self._infer = infer and recorded is None
        self.refused: dict[int, dict[str, str]] = {}
        self.prepack: Prepacker | None = None  # NOTE: dry runs call the externs: prepack inline
        self.packs = PackedWeights()
        # NOTE: dry-run outcomes by call signature (codegen.call_signature): result strides,
        # oneDNN refusals, and the signatures already probed on fresh tensors
        self._layout_memo: dict[tuple[object, ...], tuple[Strides, ...]] = {}
        self._refusals: dict[tuple[object, ...], str] = {}
        self._probed: set[tuple[object, ...]] = set()
        # NOTE: timed products by signature: None (oneDNN was faster) or the refusal
        self._timed_memo: dict[tuple[str, str, object], str | None] = {}
        self._samples: dict[Value, torch.Tensor] = {}
        self._sample_last: dict[int, int] = {}

    # --- samples ------------------------------------------------------------------------------
    def start(self, live: set[int], deferred: Mapping[int, int]) -> None:
        """Per value, the last node position that reads it, directly or through views (a
        deferred extern reads at its epilogue's position): samples are freed after it."""
        nodes = self._facts.graph.nodes
        position = dict(self._facts.position)
        for host, at in deferred.items():
            position[host] = position[at]
        last: dict[int, int] = {}
        for node in reversed(nodes):
            if node.id not in live:
                continue
            for o in node.outputs:
                if node.op in MAPPED_VIEWS and isinstance(node.inputs[0], Value):
                    x = node.inputs[0]
                    last[id(x)] = max(last.get(id(x), -1), last.get(id(o), -1))
            for u in node.input_values():
                last[id(u)] = max(last.get(id(u), -1), position[node.id])
        self._sample_last = last

    def at_node(self, position: int) -> None:
        if not self._samples:
            return
        gone = [v for v in self._samples if self._sample_last.get(id(v), -1) <= position - 1]
        for v in gone:
            del self._samples[v]

    def laid_out(self, v: Value, strides: Strides) -> None:
        if not self._infer or not isinstance(v.type, TensorType):
            return
        shape, strides = self._hinted(sizes_of(v.type)), self._hinted(strides)
        dtype = v.type.dtype
        # NOTE: zeros, never torch.empty: recycled memory holds old values, denormal floats
        # among them, and a dry run on denormals ran 3-4x slower (ResNet-50's plan: 0.9 s
        # against 0.26 s); integers may be indices and must be in range.
        t = torch.zeros(shape, dtype=dtype, device=self._facts.device)
        self._samples[v] = t.as_strided(shape, strides) if dense(shape, strides) else t

    def _hinted(self, sizes: Sequence[Size]) -> tuple[int, ...]:
        """Sizes at the representative values of the symbols (the dry runs' samples)."""
        facts = self._facts
        return concrete(sizes, facts.hints) if facts.symbolic else tuple(sizes)  # type: ignore[arg-type]

    def _operand_sample(self, operand: object, locs: Mapping[Value, Loc]) -> object:
        if not isinstance(operand, Value):
            return operand
        const = self._facts.consts.get(operand)
        if const is not None:
            # NOTE: a constant is its own sample: a weight prepared (prepacked) for the dry run
            # is then the one the calls use, not one of a stand-in they would redo.
            return const
        loc = locs[operand]
        assert loc.base is not None, f"%{operand.name} should have been materialized"
        base = self._samples[loc.base]
        if loc.kind == "view":
            offset = evaluate(loc.offset, self._facts.hints)
            return base.as_strided(
                self._hinted(sizes_of(operand.type)),
                self._hinted(loc.strides),
                base.storage_offset() + offset,
            )
        return base

    # --- questions ----------------------------------------------------------------------------
    def result_strides(self, step: ExternStep, locs: Mapping[Value, Loc]) -> list[Strides]:
        return self._dry_run(step, locs)

    def decide(self, step: ExternStep, stage: str, locs: Mapping[Value, Loc]) -> str | None:
        """Dry-run ``step`` (and, when no dry run would run it, probe it once on fresh
        tensors)."""
        position = self._facts.position[step.node.id]
        key = self._signature(step, locs)
        if stage == timed_matmul.STAGE:
            return self._timed(step, locs, position, key)
        if key is not None and key in self._refusals:
            reason = self._refusals[key]
            self.refused.setdefault(position, {})[stage] = reason
            return reason
        try:
            ran = self._infer
            step.out_strides = self._dry_run(step, locs, key)
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

    def accepted_note(self, call: ExternCall) -> str:
        return ""

    def _timed(
        self, step: ExternStep, locs: Mapping[Value, Loc], position: int, key: object
    ) -> str | None:
        """Time ``step``'s call against its rival (``step.rival``; None: PyTorch's kernel for its
        node) on the dry run's samples (:mod:`plait.codegen.timed_matmul`); refused where the
        rival was not slower. One measurement per signature and rival."""
        rival = timed_matmul.rival_name(step.rival)
        memo = (timed_matmul.STAGE, rival, key)  # NOTE: apart from oneDNN's own refusals
        reason: str | None = "not timed: no layout dry runs in this compile"
        if key is not None and memo in self._timed_memo:
            reason = self._timed_memo[memo]
        elif self._infer:
            node = step.node

            def measure() -> str | None:
                samples = [self._operand_sample(o, locs) for o in step.node_inputs()]
                args = get_op(node.op).structure(samples)
                default = (step.rival or make_call(node, dict(self._facts.consts))).fn
                times = timed_matmul.timings(step.call.fn, default, args)
                return timed_matmul.refusal(
                    *times, rival, step.call.library or timed_matmul.LIBRARY
                )

            # NOTE: a decision this machine made before is replayed (codegen.timed_choices)
            reason = measure() if key is None else timed_choices.store().decide(memo, measure)
        if key is not None:
            self._timed_memo[memo] = reason
        if reason is not None:
            self.refused.setdefault(position, {})[timed_matmul.STAGE] = reason
            return reason
        step.out_strides = self._dry_run(step, locs, key)
        return None

    def close(self, finished: bool) -> None:
        pass

    # --- running ------------------------------------------------------------------------------
    def _signature(self, step: ExternStep, locs: Mapping[Value, Loc]) -> tuple[object, ...] | None:
        def layout(v: Value) -> Layout | None:
            const = self._facts.consts.get(v)
            if const is not None:
                return tuple(const.shape), tuple(const.stride()), int(const.storage_offset())
            loc = locs.get(v)
            if loc is None or loc.kind == "inline":
                return None
            shape = sizes_of(v.type) if isinstance(v.type, TensorType) else ()
            return shape, loc.strides, loc.offset  # type: ignore[return-value]

        return call_signature(step.node, step.call.detail, layout, step.extra, step.inputs)

    def _probe(self, step: ExternStep) -> None:
        def fresh(o: object) -> object:
            if not isinstance(o, Value) or not isinstance(o.type, TensorType):
                return o
            const = self._facts.consts.get(o)
            if const is not None:
                return const
            # NOTE: see laid_out
            return torch.zeros(
                self._hinted(sizes_of(o.type)), dtype=o.type.dtype, device=self._facts.device
            )

        args = get_op(step.node.op).structure([fresh(o) for o in step.node_inputs()])
        args += [fresh(o) for o in step.extra]
        with torch.no_grad():
            step.call.fn(*args)

    def _dry_run(
        self, step: ExternStep, locs: Mapping[Value, Loc], key: object = _UNSET
    ) -> list[Strides]:
        """Run the extern once on zeros to learn the layout PyTorch gives its result (``key``:
        its call signature, when the caller has it)."""
        node = step.node
        if self._recorded is not None:
            recorded = self._recorded[self._facts.position[node.id]]
            return [restored_strides(v, s) for v, s in zip(step.outputs, recorded)]
        contiguous = [contiguous_strides(sizes_of(v.type)) for v in step.outputs]
        if not self._infer:
            return contiguous
        effect = node.op == "aten_check" or get_op(node.op).is_random(node.attrs)
        if effect:
            # NOTE: a check never runs on zeros (it raises), nor a random node (it would draw):
            # their results are conformed to contiguous strides.
            for v, c in zip(step.outputs, contiguous):
                self.laid_out(v, c)
            return contiguous
        if key is _UNSET:
            key = self._signature(step, locs)
        remembered = self._layout_memo.get(key) if isinstance(key, tuple) else None
        if remembered is not None:
            # NOTE: a call of this signature ran already: its result layout is this one's
            for v, s in zip(step.outputs, remembered):
                self.laid_out(v, s)
            return list(remembered)
        samples = [self._operand_sample(o, locs) for o in step.node_inputs()]
        args = get_op(node.op).structure(samples)
        args += [self._operand_sample(o, locs) for o in step.extra]
        try:
            with torch.no_grad():
                result = step.call.fn(*args)
        except (RuntimeError, ValueError):
            if node.op not in ("aten", "aten_factory"):
                raise
            # NOTE: an ATen extern may refuse placeholder values (lu_solve's pivots, a
            # Cholesky factor): its results are conformed to contiguous strides instead.
            for v, c in zip(step.outputs, contiguous):
                self.laid_out(v, c)
            return contiguous
        results = result if isinstance(result, (tuple, list)) else (result,)
        out: list[Strides] = []
        for v, r, c in zip(step.outputs, results, contiguous):
            got = tuple(int(x) for x in r.stride())
            shape = sizes_of(v.type)
            usable = r.storage_offset() == 0 and dense(self._hinted(shape), got)
            if usable and self._facts.symbolic:
                # NOTE: the dim order the dry run shows, as strides of the symbolic shape
                learned = learned_strides(shape, got, self._facts.hints)
                usable = learned is not None
                out.append(learned if learned is not None else c)
            else:
                out.append(got if usable else c)
            sample = r if usable else r.contiguous()
            if not (sample.is_floating_point() or sample.is_complex()):
                # NOTE: integers may be indices of a later extern, and an extern's on zeros
                # need not be in range (topk of zeros gives [3, 5] of six): zeros, as laid_out
                sample = torch.zeros_like(sample, memory_format=torch.preserve_format)
            self._samples[v] = sample
        if isinstance(key, tuple):
            self._layout_memo[key] = tuple(out)
        return out
