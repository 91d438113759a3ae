"""L1 capture: run a program once on tracer tensors and return a :class:`CapturedProgram`.

Capture leaves no trace: user inputs and buffers are traced through clones, parameters are
never written (an in-place update of one is refused), the RNG states are restored, and the
module's parameter/buffer slots are restored even when capture fails.

Example:
    >>> import torch
    >>> prog = capture_program(lambda x: x * 2, (torch.ones(3),))
    >>> print(prog.graph)
    graph(
      user %x: f32[3]
    ) {
      %0 = mul(%x, 2) : f32[3]
      return %0
    }
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from plait import logs
from plait.errors import GraphCaptureError, InvalidOptionError

# NOTE: continuation is loaded with capture (its one user imports it late), not by a first call
from plait.frontend import continuation as _continuation  # noqa: F401
from plait.frontend import datadep, output_views, pytree, stride_choices, tensor_attr_writes
from plait.frontend.capture_values import Lift, Restart, Tracer
from plait.frontend.dynamic_dims import DimPolicy, DynamicSpec
from plait.frontend.guard_plan import build_guards, const_slots, plan_of
from plait.frontend.input_writes import InputObjects
from plait.frontend.inputs import InputAdapter
from plait.frontend.lifting import bind_state_leaves, lift_state, lift_user_inputs
from plait.frontend.program import CapturedProgram, Continued, InputSlot, OutputLeaf
from plait.frontend.pyreads import PyReads
from plait.frontend.pyvalues import Keyed, Root
from plait.frontend.refused_after_run import fallback, this_call
from plait.frontend.rng import keep_last_draw
from plait.frontend.state import ModuleState, backward_hooked
from plait.frontend.symints import TracedInt, TracedSize
from plait.frontend.tracer import CaptureContext
from plait.frontend.unsampled import Resample
from plait.frontend.views import storage_id
from plait.ir import Value, semantic_hash, to_text

_KIND_RANK = {"user": 0, "param": 1, "buffer": 2, "const": 3}


@contextmanager
def preserved_rng(restore: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """The generators' states put back after the block, where ``restore()`` says so."""
    cpu = torch.get_rng_state()
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_initialized()  # NOTE: never starts CUDA (is_available() would)
        else None
    )
    try:
        yield
    finally:
        if restore():
            torch.set_rng_state(cpu)
        if cuda is not None and restore():
            torch.cuda.set_rng_state_all(cuda)


def capture_program(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict | None = None,
    *,
    fullgraph: bool = True,
    dynamic: DynamicSpec = None,
    adapter: InputAdapter | None = None,
    module_state: ModuleState | None = None,
    arithmetic: str = "run",
    continuation: bool = False,
) -> CapturedProgram:
    """Capture ``fn(*args, **kwargs)``. With ``fullgraph=False`` a program that cannot be one
    graph comes back as a fallback (``graph is None``, ``fallback_reason`` set) instead of
    raising :class:`GraphCaptureError`. ``dynamic``: which input dims are symbolic
    (:mod:`plait.frontend.dynamic_dims`). ``arithmetic="skip"`` leaves the heaviest calls
    uncomputed where nothing reads their values, and captures again computing every call where
    something does (:mod:`plait.frontend.unsampled`): the graph is the same either way.
    ``continuation``: a refused read of tensor data continues the call eagerly where that is
    sound (``fullgraph=False``; its Python runs once, and the fallback's ``this_call`` holds the
    call's result: :mod:`plait.frontend.continuation`); it writes the caller's tensors."""
    if arithmetic not in ("run", "skip"):
        raise InvalidOptionError(f"arithmetic must be 'run' or 'skip', got {arithmetic!r}")
    policy = DimPolicy.of(dynamic)
    kwargs = kwargs or {}
    adapter = adapter or InputAdapter(fn)
    spec, leaves, paths = adapter.flatten(tuple(args), kwargs)
    policy.check_paths([p for p, x in zip(paths, leaves) if isinstance(x, torch.Tensor)])
    if module_state is None and isinstance(fn, nn.Module):
        module_state = ModuleState(fn)
    contexts: list[CaptureContext] = []
    callers = adapter.containers(tuple(args), kwargs, spec) if continuation else None
    try:
        return _capture_until_done(
            contexts, fn, adapter, spec, leaves, paths, module_state, fullgraph, policy, arithmetic,
            callers,
        )  # fmt: skip
    finally:
        for c in contexts:  # NOTE: a tensor of theirs kept in Python state is refused from now
            c.finished = True
            c.release()


def _capture_until_done(
    contexts: list[CaptureContext],
    fn: Callable[..., Any],
    adapter: InputAdapter,
    spec: Any,
    leaves: list[Any],
    paths: list[str],
    module_state: ModuleState | None,
    fullgraph: bool,
    policy: DimPolicy,
    arithmetic: str,
    callers: list[Any] | None,
) -> CapturedProgram:
    """Capture attempts until one stands: again with sizes specialized (a restart), again
    computing every call (a resample); the program, its fallback, or the error."""
    static_sizes: set[int] = set()
    specialized: list[str] = []
    resampled: str | None = None
    while True:
        cx = CaptureContext(
            fullgraph=fullgraph,
            dynamic=policy.every,
            static_sizes=static_sizes,
            dims=policy,
            arithmetic=arithmetic,
            continuation=callers is not None and not contexts,  # NOTE: its Python ran once
        )
        contexts.append(cx)
        ran: list[CapturedProgram] = []  # NOTE: this call's, where refused after it ran
        try:
            with module_state.restored_on_failure(_is_tracer) if module_state else nullcontext():
                prog = _capture_once(
                    cx, fn, adapter, spec, leaves, paths, module_state, ran, callers or []
                )
        except Restart as restart:
            static_sizes |= restart.sizes
            specialized.append(restart.why)
            continue
        except (Resample, Exception) as err:
            went_on = cx.continuation.error if cx.continuation is not None else None
            if went_on is not None and err is not went_on:
                raise  # NOTE: the program's own, after its call went on eagerly: as eager's
            # NOTE: a torch call's failure after a skipped call may come of its garbage (an
            # index out of range): capture again computing every call, which raises or falls
            # back as it would have. A GraphCaptureError never does (a read of skipped values
            # resamples first): it stands, and the program's Python does not run again.
            if isinstance(err, Resample) or (
                cx.unsampled and not isinstance(err, GraphCaptureError)
            ):
                resampled = f"{type(err).__name__}: {err}"
                logs.debug("capture", "resample", f"{adapter.name}: capture again: {resampled}")
                arithmetic = "run"
                continue
            if not isinstance(err, GraphCaptureError):
                raise
            if fullgraph or err.kind not in ("data-dependent", "unsupported", "limitation"):
                raise
            # NOTE: an earlier attempt ran the Python already: this graph is not the first run's
            first = ran[0] if ran and len(contexts) == 1 else None
            prog = fallback(cx, err, spec, leaves, paths, module_state, first)
            if went_on is not None:
                assert cx.continuation is not None
                prog.this_call = Continued(cx.continuation.result)
        prog.specialized = specialized
        prog.resampled = resampled
        prog.uncomputed = cx.unsampled.calls if cx.unsampled is not None else 0
        _log(prog, adapter.name)
        return prog


def _log(prog: CapturedProgram, name: str) -> None:
    """The ``capture`` channel: the program captured, or its fallback with the user's line
    (a capture error's text starts with its file:line), and each opaque call."""
    if prog.graph is None:
        reason = prog.fallback_reason
        logs.emit("capture", "fallback", f"{name}: runs eagerly: {reason}", reason=reason)
    else:
        graph, digest = prog.graph, prog.semantic_hash or ""
        logs.emit(
            "capture",
            "graph",
            lambda: (
                f"{name}: {len(graph.nodes)} nodes, {len(prog.guards.guards)} guards, "
                f"program {digest[:16]}…"
            ),
            nodes=len(graph.nodes),
            semantic_hash=digest,
            static_sizes=list(prog.specialized),
        )
        logs.debug("capture", "graph_text", lambda: f"{name}:\n{to_text(graph)}")
    for op, n in sorted(prog.opaque_counts.items()):
        why = prog.opaque_reasons.get(op, "no IR op")
        logs.emit("capture", "opaque", f"{name}: {op} x{n} runs in PyTorch: {why}", op=op, count=n)


def _capture_once(
    cx: CaptureContext,
    fn: Callable[..., Any],
    adapter: InputAdapter,
    spec: Any,
    leaves: list[Any],
    paths: list[str],
    ms: ModuleState | None,
    ran: list[CapturedProgram],
    callers: list[Any],
) -> CapturedProgram:
    if cx.grad_enabled and (
        nn_module._global_backward_hooks or nn_module._global_backward_pre_hooks
    ):
        raise GraphCaptureError(
            "capture",
            "a global module backward hook is registered (register_module_full_backward_hook "
            "or its pre-hook kin): eager runs it on every module's gradients in each backward "
            "pass, which a captured graph cannot call (remove it, or call under "
            "torch.no_grad())",
            kind="limitation",
        )
    if ms is not None and cx.grad_enabled:
        hooked = backward_hooked(ms.module)
        if hooked is not None:
            raise GraphCaptureError(
                "capture",
                f"{hooked} has a backward hook: eager runs it on the module's gradients in each "
                "backward pass, which a captured graph cannot call (compile its hook-free "
                "submodules, or call it under torch.no_grad())",
                kind="limitation",
            )
    with preserved_rng(lambda: not cx.continued):
        cx.rng.start()
        fetched = ms.fetch() if ms is not None else []
        traced_leaves = lift_user_inputs(cx, leaves, paths, fetched)
        state_tracers, state = lift_state(cx, ms, fetched)
        bind_state_leaves(cx, traced_leaves, state_tracers)
        if cx.continuation is not None:
            cx.continuation.leaves, cx.continuation.state = leaves, state
        versions = [t._version for t in state]
        reads = PyReads(ms.module if ms is not None else None, fn)
        cx.reads = reads
        objects = InputObjects()
        try:
            keep = lambda: cx.continued
            swapped = ms.swapped(state_tracers, keep) if ms is not None else nullcontext()
            with swapped, cx.activate(), reads:
                out = adapter.call(fn, spec, traced_leaves, objects)
        except BaseException as exc:
            if cx.continuation is not None and cx.continuation.on:
                cx.continuation.finish(None, objects, callers, ms, reads.originals, leaves)
                raise
            raised = None if cx.error is not None else objects.raised_after_changes(exc)
            if raised is None and cx.error is None:
                lifts = [root._lift for root in cx.mutated.values()]
                raised = objects.raised_after_writes(exc, lifts)
            objects.restore_leaves()  # NOTE: a capture tried again starts from the caller's,
            reads.originals.restore()  # and from the Python values the program read
            if cx.error is not None and exc is not cx.error:
                raise cx.error from exc
            if raised is not None:
                cx.limitation(raised)
            raise
        if cx.continuation is not None and cx.continuation.error is not None:
            cx.continuation.finish(out, objects, callers, ms, reads.originals, leaves)
            raise cx.continuation.error  # NOTE: the fallback, whose this_call is the result
        if cx.error is not None:
            raise cx.error
        cx.current = "the random number generator"
        cx.rng.before(cx)  # NOTE: a manual_seed after the last torch call
        if [t._version for t in state] != versions:
            changed = [
                e.path
                for e, t, v in zip(ms.entries, state, versions)  # type: ignore[union-attr]
                if t._version != v
            ]
            raise GraphCaptureError(
                "capture",
                f"capture wrote parameter(s) {changed}: a call "
                "wrote them in place without a capture rule seeing it",
                kind="limitation",
            )
        try:
            pyroots = reads.finish(objects.made)
        except GraphCaptureError:  # NOTE: after the Python ran to its end: for later calls
            once = this_call(
                cx,
                ms,
                reads.originals,
                lambda: _finish(cx, out, spec, leaves, paths, ms, state, [], [], objects),
            )
            ran.extend([once] if once is not None else [])
            raise
        return _finish(cx, out, spec, leaves, paths, ms, state, pyroots, reads.keys, objects)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)


def _output_leaves(
    cx: CaptureContext, out: Any, call_leaves: list[Any], state: list[Any], objects: InputObjects
) -> tuple[Any, list[Any], list[Value], list[str | None], list[Any]]:
    """The output's structure and leaves, the graph's outputs, the memory format eager gave
    each (:func:`plait.frontend.output_views.eager_layout`) and the leaves as the program gave
    them; ``out`` also holds the final
    contents of the input containers the program changed (:mod:`plait.frontend.input_writes`),
    and a container of the call's is a leaf standing for the caller's own."""
    cx.current = "returning the output"

    def capture_made(x: Any) -> bool:
        return isinstance(x, Tracer) or objects.is_input(x)

    def holds_capture_made(obj: Any) -> bool:
        """An object made by the program is rebuilt from its attributes when it holds a traced
        tensor or a container of the call (one that holds neither is returned as it is)."""
        return not objects.is_input(obj) and pytree.find_hidden(obj, capture_made, "") is not None

    hidden = pytree.find_hidden_in(out, capture_made, "output", holds_capture_made)
    if hidden is not None:
        # NOTE: never kept as a constant: it would return this capture's tensors on every call
        cx.limitation(
            f"the output or an input object holds a tensor (or an input container) at {hidden}, "
            "inside an object plait cannot rebuild; return tensors in tuples, lists, dicts, "
            "namedtuples, torch.return_types, dataclasses (ModelOutput) or objects that "
            "copy.copy rebuilds from their attributes"
        )
    try:
        out_spec, raw, _ = pytree.flatten(out, "output", holds_capture_made, objects.is_input)
    except ValueError as exc:
        cx.limitation(f"the output cannot be rebuilt: {exc}")
    leaves: list[Any] = []
    values: list[Value] = []
    layouts: list[str | None] = []
    shared = output_views.shared_roots([cx.tracer(x) for x in raw if isinstance(x, Tracer)])
    indices: dict[int, int] = {}  # NOTE: a tracer's graph output
    for leaf in raw:
        if isinstance(leaf, Tracer):
            tr = cx.tracer(leaf)
            stride_choices.on_output(cx, tr)
            lift = tr._lift
            view = _input_view(cx, tr, call_leaves, state)
            if tr._root is None and lift is not None and (lift.writeback or lift.kind == "param"):
                cx.value(tr)
                leaves.append(("input", lift))
            elif view is not None:
                leaves.append(view)
            elif (of := _output_view(cx, tr, shared)) is not None:
                leaves.append(of)
            else:
                values.append(cx.value(tr))
                layouts.append(output_views.eager_layout(tr._plain))
                _note_format(cx, tr)
                indices.setdefault(id(tr), len(values) - 1)
                leaves.append(("graph", (len(values) - 1, id(tr), tr._root is None)))
        elif isinstance(leaf, TracedSize):
            leaves.append(("value", torch.Size(cx.int(d) for d in leaf)))
        elif isinstance(leaf, TracedInt):
            leaves.append(("value", cx.int(leaf)))
        elif objects.is_input(leaf):
            leaves.append(("object", objects.index[id(leaf)]))
        else:
            leaves.append(("value", leaf))
    for i, (kind, ref) in enumerate(leaves):
        if kind == "view":  # NOTE: the graph returns each base once (itself an output or not)
            root, *rest = ref
            if id(root) not in indices:
                _note_format(cx, root)
                values.append(cx.value(root))
                layouts.append(None)  # NOTE: a base: output_views lays it out for its views
                indices[id(root)] = len(values) - 1
            leaves[i] = ("view", (indices[id(root)], *rest))
    return out_spec, leaves, values, layouts, raw


def _note_format(cx: CaptureContext, tr: Tracer) -> None:
    """An output (or the base other outputs view) that eager laid out other than row-major, as
    its operands' layouts decided (channels_last), pins the strides of the tensors the program
    reads, so that a row-major call captures again and gets eager's row-major result."""
    if output_views.follows_layouts(tr._plain):
        cx.format_read = output_views.FORMAT_READ


def _output_view(cx: CaptureContext, tr: Tracer, shared: set[int]) -> tuple[str, Any] | None:
    """``("view", (root, tracer id, *geometry))`` for an output that views the memory of a
    tensor the program computed, which another output views too
    (:mod:`plait.frontend.output_views`); else None (the root itself is an output of its own)."""
    root = output_views.computed_root(tr)
    if root is None or root is tr or id(root) not in shared:
        return None
    geometry = output_views.geometry(tr, root)
    if geometry is None:
        return None
    syms = {
        s
        for d in (*cx.type_of(root).shape, *cx.type_of(tr).shape)
        if not isinstance(d, int)
        for s in d.free_symbols
    }
    if any(s not in cx.bindings for s in syms):
        return None  # NOTE: a size the data decides: the output keeps memory of its own
    if syms:
        cx.restart(syms, "the output is a view of another output")
    return ("view", (root, id(tr), *geometry))


def _input_view(
    cx: CaptureContext, tr: Tracer, call_leaves: list[Any], state: list[Any]
) -> tuple[str, Any] | None:
    """``("input", lift)`` or ``("alias", (lift, size, stride, offset, requires_grad[, dtype]))``
    for an output that shares memory with an input, parameter, buffer or constant (in eager it is a
    view of that tensor, so a write to either shows in the other); else None.

    NOTE: the view is made again on each call from the live tensor with ``as_strided`` (as
    AOTAutograd does), after the writes back: its geometry is relative to the tensor's own
    storage offset, and holds while the tensor keeps the strides it had at capture (guarded)."""
    root = tr._root
    if root is None or root._lift is None or storage_id(tr._plain) != storage_id(root._plain):
        return None
    base = root._plain
    reread: tuple[str, ...] = ()
    if tr._plain.dtype != root._plain.dtype:
        # NOTE: a view that reads the bits as another dtype (view_as_complex, view_as_real): its
        # geometry counts elements of its own dtype, so it is made of the input read as that dtype
        try:
            base = root._plain.view(tr._plain.dtype)
        except RuntimeError:
            return None  # NOTE: no such reading of the whole input: the graph's copy is returned
        reread = (str(tr._plain.dtype).removeprefix("torch."),)
    lift = root._lift
    if tr._plain is root._plain:  # NOTE: eager returned the tensor itself (x.contiguous())
        cx.value(root)
        return ("input", lift)
    original = _original(lift, call_leaves, state)
    if original.stride() != root._plain.stride():
        cx.limitation(
            f"the output is a view of {lift.name}, whose layout (strides {original.stride()}) "
            "capture did not keep; return a copy (.clone()) or pass a dense tensor"
        )
    ir_type = cx.type_of(root)
    syms = {
        s
        for d in (*ir_type.shape, *cx.type_of(tr).shape)
        if not isinstance(d, int)
        for s in d.free_symbols
        if s in cx.bindings
    }
    if syms:
        cx.restart(syms, f"the output is a view of {lift.name}")
    if cx.layout_read is None:
        cx.layout_read = f"an output that views {lift.name}"
    cx.value(root)
    offset = tr._plain.storage_offset() - base.storage_offset()
    geometry = (tuple(tr._plain.shape), tuple(tr._plain.stride()), offset, bool(tr._rg), *reread)
    return ("alias", (lift, *geometry))


def _original(lift: Lift, call_leaves: list[Any], state: list[Any]) -> torch.Tensor:
    """The caller's tensor a lifted input was traced from."""
    if lift.kind == "user":
        return call_leaves[lift.ref]
    if lift.kind in ("param", "buffer"):
        return state[lift.ref]
    return lift.ref


def _finish(
    cx: CaptureContext,
    out: Any,
    spec: Any,
    leaves: list[Any],
    paths: list[str],
    ms: ModuleState | None,
    state: list[Any],
    pyroots: list[Root],
    pykeys: list[Keyed],
    objects: InputObjects,
) -> CapturedProgram:
    _refuse_hidden_writes(cx, leaves, paths, objects)
    written = objects.changed()
    result = (out, objects.finals(written)) if written else out
    out_spec, out_leaves, values, layouts, raw = _output_leaves(cx, result, leaves, state, objects)
    attr_writes, attr_targets = tensor_attr_writes.recorded(cx, raw)
    mutations: list[tuple[Lift, int]] = []
    for root in cx.mutated.values():
        if root._lift is not None and root._lift.writeback:
            mutations.append((root._lift, len(values)))
            values.append(cx.value(root))
    keep_last_draw(cx, values)
    graph = cx.builder.graph
    lift_of = {id(lift.value): lift for lift in cx.lifts if lift.value is not None}
    graph.inputs.sort(
        key=lambda v: (
            _KIND_RANK[lift_of[id(v)].kind],
            lift_of[id(v)].ref
            if lift_of[id(v)].kind in ("param", "buffer")
            else lift_of[id(v)].order,
        )
    )
    position = {id(v): i for i, v in enumerate(graph.inputs)}
    slots = [_slot(lift_of[id(v)]) for v in graph.inputs]
    cx.builder.output(*values)
    built = cx.builder.build()
    if cx.unbacked:  # NOTE: nodes emitted outside a torch call (outputs, write-backs) too
        datadep.check_new_nodes(cx, 0)
    plan = plan_of(cx, ms, slots, mutations)
    plan.pyroots, plan.attr_targets = pyroots, attr_targets
    return CapturedProgram(
        graph=built,
        guards=build_guards(
            plan, spec, leaves, paths, ms, state, pykeys, [s.ref for s in const_slots(slots)]
        ),
        guard_plan=plan,
        semantic_hash=semantic_hash(built),
        inputs=slots,
        out_spec=out_spec,
        out_leaves=[_out_leaf(kind, ref, position) for kind, ref in out_leaves],
        out_layouts=layouts,
        mutations=[(position[id(lift.value)], o) for lift, o in mutations],
        written_objects=written,
        attr_writes=attr_writes,
        containers=bool(written) or any(kind == "object" for kind, _ in out_leaves),
        opaque_counts=dict(cx.opaque_counts),
        opaque_reasons=dict(cx.opaque_reasons),
        dynamic=cx.dynamic,
    )


def _refuse_hidden_writes(
    cx: CaptureContext, leaves: list[Any], paths: list[str], objects: InputObjects
) -> None:
    """An input leaf plait passed as it is (an object it does not open: slots, a custom copy
    protocol) that now holds a tensor of the capture: a compiled call would leave the caller's
    object as it was, so the program is refused, the object's attributes put back as they were
    (NOTE: modules have their own state checks)."""
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, (torch.Tensor, nn.Module)):
            continue
        hidden = pytree.find_hidden(leaf, _is_tracer, path)
        if hidden is not None:
            objects.restore_leaves()
            cx.current = "the program's input objects"
            cx.limitation(
                f"the program stored a tensor it made in {hidden}, inside an input object plait "
                "cannot write back after each call (it opens plain objects that copy.copy "
                "rebuilds from their __dict__); return the tensor instead"
            )
    changed = objects.leaf_changed() or objects.unwritable(objects.changed())
    if changed is not None:
        objects.restore_leaves()
        cx.current = "the program's input objects"
        cx.limitation(
            f"the program changed {changed} in place, an input plait passes as it is (a set, a "
            "list subclass, an array, an object with slots or in a cycle) or does not write "
            "back (a dataclass): a compiled call could not do it again"
        )


def _out_leaf(kind: str, ref: Any, position: dict[int, int]) -> OutputLeaf:
    if kind == "input":
        return OutputLeaf("input", position[id(ref.value)])
    if kind == "alias":
        lift, *geometry = ref
        return OutputLeaf("alias", (position[id(lift.value)], *geometry))
    return OutputLeaf(kind, ref)


def _slot(lift: Lift) -> InputSlot:
    if lift.kind == "user":
        return InputSlot("user", lift.ref)
    if lift.kind in ("param", "buffer"):
        return InputSlot("state", lift.ref)
    return InputSlot("const", lift.ref)
