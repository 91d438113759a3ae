"""A call with no capture rule, traced to functional ATen ops and emitted as IR nodes.

``run_opaque`` asks :func:`trace_to_aten` first. The call runs on fake copies of its sample
values under ``make_fx`` with functionalization (``remove="mutations_and_views"``): a graph of
functional ATen ops, checked by :mod:`plait.frontend.aten_graph` and written into the capture's
graph by :mod:`plait.frontend.aten_emit` (each ATen node the IR op the ATen -> IR table names for
it, else a typed ``aten`` extern node). Tensors the call creates from no input (``torch.tensor``
literals) become constants of the graph.

A random op (``torch.Tag.nondeterministic_seeded``) becomes a random ``aten`` node, a runtime
check (``_linalg_check_errors``, ``_assert_async``) an ``aten_check`` node; an in-place op left
inside a composite is its functional form when it writes only fresh tensors
(:func:`plait.frontend.aten_graph.writes_fresh`). When the call itself is in place (``writes``),
the graph's write-backs of its inputs (``copy_`` into a placeholder) rebind those inputs. When
the decomposition is refused or unfaithful, a builtin's own overload is tried
(:mod:`plait.frontend.aten_single`).

NOTE: the graph must be a faithful program, else the call is refused (the caller keeps the
opaque path, whose fallback is counted and reported):
- a read of tensor data (``item()``, ``_local_scalar_dense``; a branch on a value: fake tensors
  raise), a data-dependent output shape (``nonzero``, ``masked_select``: unbacked sizes);
- any other write to an input, or an in-place op with no functional form or on a shared tensor;
- a non-tensor result, or a result of a dtype the IR lacks;
- anything else make_fx, fake tensors or a meta kernel cannot do.
Then the ATen graph runs on the real samples, from the generator state the call started in: its
results (and the inputs it writes) must equal eager's bit for bit (NaN positions and zero signs
included) and it must leave the generator where eager's call left it, or the call is refused.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> prog = capture_program(lambda x: torch.lgamma(x) * 2, (torch.rand(3),))
    >>> [(n.op, n.attrs.get("name")) for n in prog.graph.nodes]
    [('aten', 'lgamma'), ('mul', None)]
"""

from __future__ import annotations

import types
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.utils._pytree as torch_pytree
from torch.fx.experimental.proxy_tensor import make_fx

from plait.frontend import pytree
from plait.frontend.aten_emit import AtenEmitter
from plait.frontend.aten_graph import check_graph, written_inputs
from plait.frontend.aten_single import distinct_tensors, single_node_graph
from plait.ir import Value
from plait.ir.ops.aten import is_seeded

if TYPE_CHECKING:
    from plait.frontend.capture_values import Tracer
    from plait.frontend.tracer import CaptureContext

NOT_RUN: Any = object()


@dataclass
class Refused:
    """Why the call is no ATen program; ``sampled`` is eager's result when it already ran."""

    reason: str
    sampled: Any = NOT_RUN


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _trace(func: Any, pargs: Any, pkwargs: Any) -> tuple[torch.fx.GraphModule, list[Any]] | str:
    """The call as a functional ATen graph over its tensor arguments (in pytree order), or why
    not."""
    leaves, spec = torch_pytree.tree_flatten((pargs, pkwargs))
    tensors = distinct_tensors(leaves)
    place = {id(t): i for i, t in enumerate(tensors)}

    def call(*values: torch.Tensor) -> Any:
        a, k = torch_pytree.tree_unflatten(
            [values[place[id(x)]] if isinstance(x, torch.Tensor) else x for x in leaves], spec
        )
        return func(*a, **k)

    rng = torch.random.get_rng_state()
    try:
        with (
            torch._C.DisableTorchFunctionSubclass(),
            torch.no_grad(),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")  # NOTE: eager's run of the call warns, once
            functional = torch.func.functionalize(call, remove="mutations_and_views")
            gm = make_fx(functional, tracing_mode="fake")(*tensors)
    except Exception as exc:
        return f"make_fx cannot trace it to ATen ops ({_first_line(exc)})"
    finally:
        torch.random.set_rng_state(rng)
    return gm, tensors


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point():
        both_nan = a.isnan() & b.isnan()
        same = (a == b) & (torch.signbit(a) == torch.signbit(b))
        return bool((same | both_nan).all())
    return bool(torch.equal(a, b))


def _run_graph(gm: torch.fx.GraphModule, tensors: list[Any]) -> list[Any]:
    with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
        got = gm(*tensors)
    if got is None:
        return []
    return list(got) if isinstance(got, (tuple, list)) else [got]


def _same_results(got: list[Any], outs: list[Any]) -> bool:
    return len(got) == len(outs) and all(
        (g is None and o is None)
        or (isinstance(o, torch.Tensor) and isinstance(g, torch.Tensor) and _same_values(g, o))
        for g, o in zip(got, outs)
    )


# NOTE: kernels whose last bits follow their operands' strides and the CPU's blocking: the
# functional graph hands them contiguous copies where eager passes strided views
_PRODUCTS = ("mm", "bmm", "addmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu")


def _products_within_contract(gm: torch.fx.GraphModule, got: list[Any], outs: list[Any]) -> bool:
    """Whether a graph with matrix products or attention gives eager's results within the
    contract (the attention class where it attends, else matmul's): NaN and infinities where
    eager's, finite values close. Its products read contiguous copies of what eager reads
    strided (functionalization makes each view a copy), and on some CPUs (AVX-512) such a
    product rounds otherwise; a graph of other ops must give eager's bits."""
    ops = {
        n.target.__name__.split(".")[0]
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    }
    if not ops & set(_PRODUCTS) or len(got) != len(outs):
        return False
    import plait.contract

    op_class = "attention" if any("attention" in op for op in ops) else "matmul"
    contract = plait.contract.load()
    for g, o in zip(got, outs):
        if g is None and o is None:
            continue
        if not (isinstance(g, torch.Tensor) and isinstance(o, torch.Tensor)):
            return False
        if g.shape != o.shape or g.dtype != o.dtype or not o.is_floating_point():
            return False
        tol = contract.tolerance(op_class, o.dtype)
        if not torch.allclose(g, o, rtol=tol.rtol, atol=tol.atol, equal_nan=True):
            return False
        if not torch.equal(g.isinf(), o.isinf()) or not torch.equal(g.isnan(), o.isnan()):
            return False
    return True


def _draws(gm: torch.fx.GraphModule) -> bool:
    return any(
        isinstance(n.target, torch._ops.OpOverload) and is_seeded(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


def _result(cx: CaptureContext, value: Value, out: Any, inputs: list[Tracer], grad: bool) -> Any:
    """The tracer of one result: the argument itself when eager returns its argument
    (``atleast_2d`` of a 2-D tensor, ``conj`` of a real one), else a new tracer; one that
    aliases an argument (a view) is an alias the IR cannot describe, never written through."""
    for t in inputs:
        if out is t._plain:
            return t
    w = cx.new_output(value, out, inputs, grad)
    if w._root is not None:
        w._steps = None  # NOTE: never replayed or written through
    return w


def _rng_state() -> torch.Tensor:
    return torch.default_generator.get_state()


def trace_to_aten(
    cx: CaptureContext,
    func: Any,
    args: tuple,
    kwargs: dict,
    sampled: Any = NOT_RUN,
    writes: bool = False,
) -> Any:
    """``func(*args, **kwargs)`` as IR nodes through its ATen graph: the call's result (tracers
    shaped like eager's), or :class:`Refused` saying why not (nothing emitted is used then).
    ``writes``: the call writes its tensor arguments; each write rebinds the argument's tracer.

    NOTE: a graph with random ops must draw what eager draws: from the generator state the call
    started in, it must give eager's results bit for bit and leave the generator where eager
    left it (the RNG tracker then sees the draws accounted for by its random nodes)."""
    if cx.dynamic:
        return Refused("ATen tracing takes static shapes (dynamic=True)", sampled)
    found: list[Tracer] = []
    pargs = cx.unwrap(args, found)
    pkwargs = cx.unwrap(kwargs, found)
    if not found and not isinstance(func, types.BuiltinFunctionType):
        # NOTE: a Python function with no tensor argument may set global state
        # (torch.set_default_dtype): traced, it would run twice
        return Refused("no tensor argument, and not a builtin torch factory", sampled)
    candidates, reasons = _candidates(func, pargs, pkwargs, writes)
    if not candidates:
        return Refused(reasons[0], sampled)
    by_plain = {id(t._plain): t for t in found}
    tensors = candidates[0][1]
    if not all(id(t) in by_plain for t in tensors):
        return Refused("a tensor argument is out of reach of the ATen trace", sampled)
    inputs = [by_plain[id(t)] for t in tensors]
    written = sorted({i for gm, _ in candidates for i in written_inputs(gm)})
    if written and sampled is not NOT_RUN:
        return Refused("it writes an input in place", sampled)
    # NOTE: the graph runs on the inputs as they were before eager's call wrote them
    before = [t.clone() if i in written else t for i, t in enumerate(tensors)]
    start = cx.rng.expected if sampled is not NOT_RUN else _rng_state()
    if sampled is NOT_RUN:
        sampled, _ = cx.sample(func, args, kwargs)
    outs = list(sampled) if isinstance(sampled, (tuple, list)) else [sampled]
    if sampled is None:
        outs = []  # NOTE: a check alone; its graph must return nothing too
    elif not any(isinstance(o, torch.Tensor) for o in outs) or not all(
        o is None or isinstance(o, torch.Tensor) for o in outs
    ):
        return Refused(f"it returns {type(sampled).__name__}, not tensors", sampled)
    moved = cx.rng.draws()
    for gm, _ in candidates:
        why = _unfaithful(gm, before, tensors, written, outs, start, moved)
        if why is not None:
            reasons.append(why)
            continue
        emitter = AtenEmitter(cx, gm, inputs)
        first = len(cx.builder.graph.nodes)
        values = emitter.run()
        if isinstance(values, str) or len(values) != len(outs):
            emitter.drop_effects(first)
            reasons.append(values if isinstance(values, str) else "another number of results")
            continue
        if any((v is None) != (o is None) for v, o in zip(values, outs)):
            # NOTE: a result eager leaves undefined (None) that its node computes, or the other
            # way round (a kernel that defines more than its arguments ask for)
            emitter.drop_effects(first)
            reasons.append("its nodes define other results than eager's call")
            continue
        break
    else:
        return Refused(reasons[0], sampled)
    grad = cx.grad_enabled and any(t._rg for t in inputs)
    for i, new in emitter.writes:
        cx.assign(inputs[i], new, grad)
        cx.check(cx.value(inputs[i]), inputs[i]._plain)
    if sampled is None:
        return None
    wrapped = [None if v is None else _result(cx, v, o, inputs, grad) for v, o in zip(values, outs)]
    if isinstance(sampled, (tuple, list)):
        return pytree.same_type(sampled, wrapped)
    return wrapped[0]


def _candidates(
    func: Any, pargs: Any, pkwargs: Any, writes: bool
) -> tuple[list[tuple[torch.fx.GraphModule, list[Any]]], list[str]]:
    """The ATen graphs the call may be (its decomposition, then the one overload a builtin
    binds), each that passes :func:`check_graph`, and why the others do not."""
    found: list[tuple[torch.fx.GraphModule, list[Any]]] = []
    reasons: list[str] = []
    traced = _trace(func, pargs, pkwargs)
    if isinstance(traced, str):
        reasons.append(traced)
    else:
        why = check_graph(traced[0], writes_inputs=writes)
        if why is None:
            found.append(traced)
        else:
            reasons.append(why)
    # NOTE: the one overload a builtin binds, when its decomposition is refused or is not
    # eager's computation (a composite that decomposes otherwise under tracing: eigvalsh asks
    # whether a gradient may be needed, fake tensors say yes, and it computes eigenvectors too)
    single = None if writes else single_node_graph(func, pargs, pkwargs)
    if single is not None and not isinstance(single, str) and check_graph(single[0]) is None:
        found.append(single)
    # NOTE: every graph takes the call's tensor arguments in one (pytree) order
    return [(gm, ts) for gm, ts in found if _same_list(ts, found[0][1])], reasons


def _same_list(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _unfaithful(
    gm: torch.fx.GraphModule,
    inputs: list[Any],
    tensors: list[Any],
    written: list[int],
    outs: list[Any],
    start: torch.Tensor,
    moved: bool,
) -> str | None:
    """Why the graph, run on ``inputs`` (the samples before eager's call) from generator state
    ``start``, is not eager's call (which returned ``outs``, left the written ``tensors`` and
    the generator as they are now), or None."""
    if moved and not _draws(gm):
        return "it moved the random number generator"
    end = _rng_state()
    try:
        torch.default_generator.set_state(start)
        got = _run_graph(gm, inputs)
        drew_as_eager = _same_state(_rng_state(), end)
    except Exception as exc:
        return f"its ATen graph fails on the sample ({_first_line(exc)})"
    finally:
        torch.default_generator.set_state(end)
    if not drew_as_eager:
        return "its ATen graph draws other random numbers than eager"
    if not _same_results(got, outs) and not _products_within_contract(gm, got, outs):
        return "its ATen graph computes other values than eager on the sample"
    if not all(_same_values(inputs[i], tensors[i]) for i in written):
        return "its ATen graph writes other values into its inputs than eager"
    return None


def _same_state(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))
