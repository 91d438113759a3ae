"""Calls with no table entry: ATen nodes, else an ``opaque`` node that PyTorch runs, or a
capture error.

A call with no rule is first traced to functional ATen ops (:mod:`plait.frontend.aten_trace`):
IR ops and typed ``aten`` nodes, no fallback. When its ATen graph is no faithful program (a read
of tensor data, a random op, ...), under ``fullgraph=True`` it is a :class:`GraphCaptureError`
naming both reasons. Otherwise it becomes
an ``opaque`` node (counted; the compiled callable reports the counts) when the IR can express
it: at least one tensor argument, tensor outputs, static shapes, a ``torch.*`` name the IR can
resolve, and every other argument a *literal* the node can carry. So does a call whose rule
raises :class:`~plait.frontend.table.NoIROp` (an argument combination its IR op lacks). An
in-place call is functionalized: its out-of-place form (``op_`` -> ``op``, ``inplace=True`` ->
``inplace=False``) rebinds the written tensor. Anything else is a capture error
(``plait.compile`` then runs the program eagerly, recorded and with a warning).

Arguments travel as JSON (the node's ``literals``/``kwliterals`` attributes): tensors, by
position or keyword, are ``{"t": i}`` for operand ``i``; every other value is JSON data or a
one-key tagged object (``{"tuple": [...]}``, ``{"dtype": "float64"}``, ``{"slice": [...]}``,
``{"float": "<bits>"}``, ...) that :func:`plait.ir.ops.extern.decode_literal` gives back
exactly. Generators and other objects have no encoding and are refused.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> prog = capture_program(lambda x: x.cumprod(0), (torch.ones(3),), fullgraph=False)
    >>> [(n.op, n.attrs["name"], n.attrs["literals"]) for n in prog.graph.nodes]
    [('aten', 'cumprod', '[{"t": 0}, 0]')]
    >>> import torch.nn.functional as F  # NOTE: it checks ``torch.any(var < 0)``: data read
    >>> fn = lambda x, v: F.gaussian_nll_loss(x, x, v, reduction="sum")
    >>> prog = capture_program(fn, (torch.ones(3), torch.ones(3)), fullgraph=False)
    >>> [n.op for n in prog.graph.nodes]
    ['opaque']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from plait.frontend.aten_trace import NOT_RUN as _NOT_RUN
from plait.frontend.aten_trace import Refused, trace_to_aten
from plait.frontend.call_encoding import NotLiteral, call_spec
from plait.frontend.op_names import public_name
from plait.frontend.pytree import same_type
from plait.frontend.writes import inplace_index, write_targets
from plait.ir.ops.call_literals import resolve_target

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

_HINT = (
    "plait.compile(fullgraph=False) runs a call with no capture rule as an 'opaque' node that "
    "PyTorch executes (counted and reported), when the IR can express it."
)


def _target(func: Any) -> str | None:
    name = public_name(func)
    if name is None:
        return None
    try:
        resolve_target(name)
    except Exception:
        return None
    return name


def _why_not(cx: CaptureContext, func: Any) -> str | None:
    if cx.dynamic:
        return "opaque nodes need static shapes (dynamic=True)"
    if _target(func) is None:
        return "it has no torch.* name the IR can resolve"
    return None


def run_opaque(
    cx: CaptureContext,
    func: Any,
    args: tuple,
    kwargs: dict,
    *,
    rule_said: str | None = None,
    sampled: Any = _NOT_RUN,
) -> Any:
    """``func(*args, **kwargs)`` as an ``opaque`` node (or a random one). ``rule_said``: why
    the call's capture rule could not lower this call (a combination of arguments with no IR
    op); ``sampled``: PyTorch's result on the samples, when the rule already ran the call."""
    name = cx.current
    no_rule = (
        f"the capture rule of {name} cannot lower this call ({rule_said})"
        if rule_said
        else f"no capture rule maps {name} to plait's IR"
    )
    targets = write_targets(name, func, args, kwargs)
    if targets and sampled is _NOT_RUN:
        return _run_functionalized(cx, func, args, kwargs, targets, no_rule)
    if cx.autocast and sampled is _NOT_RUN:
        # NOTE: the call's operands as autocast gave them to its kernel, as a capture rule's
        # (the compiled program runs with autocast off); its sample is autocast's result
        from plait.frontend.autocast import autocast_inputs

        sampled = _sample_unwritten(cx, func, args, kwargs)
        args, kwargs = autocast_inputs(cx, func, sampled, args, kwargs, False)
    traced = trace_to_aten(cx, func, args, kwargs, sampled)
    if not isinstance(traced, Refused):
        return traced
    sampled = traced.sampled
    if cx.fullgraph:
        cx.fail("unsupported", f"{no_rule}, and no ATen program: {traced.reason}", _HINT)
    why = _why_not(cx, func)
    try:
        operands, literal_attrs = call_spec(args, kwargs)
    except NotLiteral as exc:
        why = why or str(exc)
    if why is not None:
        cx.fail(
            "unsupported",
            f"{no_rule}; no ATen program ({traced.reason}), and it cannot be an opaque node: {why}",
        )
    tracers = [cx.tracer(a) for a in operands]
    out = (
        _sample_unwritten(cx, func, args, kwargs, traced.reason) if sampled is _NOT_RUN else sampled
    )
    # NOTE: a call that moved the generator is random: a random node, run in program order
    random = cx.rng.draws()
    if not random and not tracers:
        cx.fail("unsupported", f"{name} has no tensor argument; an opaque node needs one")
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    # NOTE: a None in a returned tuple (MultiheadAttention's weights it was not asked for) is
    # no output of the node: the node's reference drops it, and the tuple is rebuilt around it
    tensors = [o for o in outs if o is not None]
    if not tensors or not all(isinstance(o, torch.Tensor) for o in tensors):
        cx.fail(
            "unsupported",
            f"{name} returns {type(out).__name__}; an opaque node returns tensors (and None in "
            "a tuple)",
        )
    out_types = [cx.type_of_plain(o) for o in tensors]
    target = _target(func)
    spelled = {"target": target, "out_types": "; ".join(str(t) for t in out_types)}
    if random and not tracers:
        values = cx.call("random_factory", **spelled, **literal_attrs)
    else:
        op = "random_call" if random else "opaque"
        values = cx.call(op, [cx.value(t) for t in tracers], **spelled, **literal_attrs)
    cx.opaque_counts[str(target)] += 1
    cx.opaque_reasons.setdefault(str(target), f"{no_rule}; no ATen program: {traced.reason}")
    grad = cx.grad_enabled and any(t._rg for t in tracers)
    wrapped = [cx.new_output(v, o, tracers, grad) for v, o in zip(values, tensors)]
    for w in wrapped:
        if w._root is not None:
            w._steps = None  # NOTE: an alias the IR cannot describe: never replayed or written
    if isinstance(out, (tuple, list)):
        results = iter(wrapped)
        return same_type(out, [None if o is None else next(results) for o in outs])
    return wrapped[0]


# NOTE: in-place ops whose ``op`` is not "the same values, out of place": they change a
# tensor's geometry (views taken before would read other elements), or draw random numbers
# (``Tensor.bernoulli(p)`` is not ``bernoulli_(p)``'s distribution, and a second draw moves
# the generator).
_NO_PURE_FORM = {
    *("t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_", "resize_"),
    *("resize_as_", "as_strided_", "set_", "share_memory_", "rename_", "refine_names_"),
    *("bernoulli_", "cauchy_", "exponential_", "geometric_", "log_normal_", "normal_"),
    *("random_", "uniform_"),
}


def _out_of_place(func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict] | None:
    """The out-of-place form of an in-place call that writes its first argument: ``op_`` is
    ``op`` (``Tensor.hardsigmoid_``, ``torch.relu_``), ``inplace=True`` is ``inplace=False``
    (``F.hardswish(x, inplace=True)``); None when there is none."""
    index = inplace_index(func)
    if index is not None:
        if "inplace" in kwargs:
            return func, args, {**kwargs, "inplace": False}
        if len(args) > index:
            return func, (*args[:index], False, *args[index + 1 :]), kwargs
        return None
    name = public_name(func)
    if name is None:
        return None
    owner, _, last = name.rpartition(".")
    if not last.endswith("_") or last.startswith("_") or last in _NO_PURE_FORM:
        return None
    try:
        pure = resolve_target(f"{owner}.{last[:-1]}")
    except Exception:
        return None
    return pure, args, kwargs


def _sample_unwritten(
    cx: CaptureContext, func: Any, args: tuple, kwargs: dict, no_aten: str = ""
) -> Any:
    """PyTorch's result on the samples of a call that declares no write; one that wrote its
    inputs anyway cannot be an opaque node."""
    found: list[Any] = []
    cx.unwrap((args, kwargs), found)
    versions = [t._plain._version for t in found]
    out, _ = cx.sample(func, args, kwargs)
    if [t._plain._version for t in found] != versions:
        cx.fail(
            "unsupported",
            f"{cx.current} updates its inputs in place; an opaque node cannot"
            + (f", and it is no ATen program: {no_aten}" if no_aten else ""),
        )
    return out


def _run_functionalized(
    cx: CaptureContext, func: Any, args: tuple, kwargs: dict, targets: list[Any], no_rule: str
) -> Any:
    """An in-place call with no rule: its out-of-place form (captured by its own rule, or an
    opaque node), whose result
    then rebinds the written tensor (the write-back machinery of in-place ops with a rule;
    a result of another dtype is cast back, as PyTorch's in-place ops do)."""
    pure = _out_of_place(func, args, kwargs) if len(targets) == 1 else None
    if pure is None or not args or targets[0] is not args[0]:
        # NOTE: its ATen graph, whose write-backs of the arguments rebind them (x.uniform_())
        cx.check_writable(targets)
        traced = trace_to_aten(cx, func, args, kwargs, writes=True)
        if not isinstance(traced, Refused):
            return traced
        cx.fail(
            "unsupported",
            f"{no_rule}, and it cannot be an opaque node: it writes its arguments in place and "
            "has no out-of-place form (an `op_` method's `op`, an `inplace=False` flag), and no "
            f"ATen program: {traced.reason}",
        )
    cx.check_writable(targets)
    pure_func, pure_args, pure_kwargs = pure
    # NOTE: the written tensor as a tracer (a captured constant is lifted), so the call below
    # reaches capture even when no other argument is a tracer
    pure_args = (cx.tracer(args[0]), *pure_args[1:])
    # NOTE: through dispatch: the out-of-place form's own rule if it has one, else opaque
    result = pure_func(*pure_args, **pure_kwargs)
    if not isinstance(result, torch.Tensor):
        cx.fail("unsupported", f"{no_rule}: its out-of-place form returns no single tensor")
    cx.sample(func, args, kwargs)  # NOTE: the write itself, on the samples
    target = cx.tracer(args[0])
    if not _same_bits(cx.tracer(result)._plain, target._plain):
        cx.fail(
            "unsupported",
            f"{no_rule}, and its out-of-place form computed other values than the in-place "
            "call on the capture sample; plait cannot functionalize it",
        )
    cx.assign(args[0], cx.value(result), cx.tracer(result)._rg)
    cx.check(cx.value(target), target._plain)
    return target


def _same_bits(computed: torch.Tensor, written: torch.Tensor) -> bool:
    """Whether ``computed``, cast to ``written``'s dtype as an in-place op casts, has its bits."""
    with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
        if computed.shape != written.shape:
            return False
        # NOTE: contiguous first: a strided view (``x[::2]``) has no byte view of its own
        a = computed.to(written.dtype).contiguous().reshape(-1).view(torch.uint8)
        b = written.contiguous().reshape(-1).view(torch.uint8)
        return bool(torch.equal(a, b))
