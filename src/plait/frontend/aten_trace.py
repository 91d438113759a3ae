"""A call with no capture rule, traced to functional ATen ops and emitted as IR nodes.

``run_opaque`` asks :func:`trace_to_aten` first. The call runs on fake copies of its sample
values under ``make_fx`` with functionalization (``remove="mutations_and_views"``): a graph of
functional ATen ops. Each ATen node becomes the IR op the ATen -> IR table
(:mod:`plait.frontend.aten_table`) names for it, else a typed ``aten`` extern node whose types
come from the overload's meta kernel. Tensors the call creates from no input (``torch.tensor``
literals) become constants of the graph.

NOTE: the graph must be a faithful program, else the call is refused (the caller keeps the
opaque path, whose fallback is counted and reported):
- a read of tensor data (``item()``, ``_local_scalar_dense``; a branch on a value: fake tensors
  raise), a data-dependent output shape (``nonzero``, ``masked_select``: unbacked sizes);
- a random op (``torch.Tag.nondeterministic_seeded``: the RNG path captures those);
- a write to an input (``copy_`` into a placeholder); an in-place
  op left inside a composite is its out-of-place form only when it writes a fresh tensor that
  no view shares;
- a non-tensor result, or a result of a dtype the IR lacks;
- anything else make_fx, fake tensors or a meta kernel cannot do.
Then the ATen graph runs on the real samples: its results must equal eager's bit for bit (NaN
positions and zero signs included), or the call is refused.

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
from plait.frontend.aten_table import emit_native
from plait.ir import TensorType, Value
from plait.ir.ops import AttrError, TypeRuleError
from plait.ir.ops.aten import overload_name
from plait.ir.types import DTYPE_NAMES

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext, Tracer

aten = torch.ops.aten
NOT_RUN: Any = object()

# NOTE: ATen ops whose result is a Python value read from tensor data
_DATA_READS = {aten._local_scalar_dense.default, aten.item.default}
_REFUSED_TAGS = {
    torch.Tag.nondeterministic_seeded: "draws random numbers (the RNG path captures those)",
    torch.Tag.dynamic_output_shape: "has an output shape that depends on the values",
    torch.Tag.data_dependent_output: "computes a Python value from tensor data",
}


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
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]

    def call(*values: torch.Tensor) -> Any:
        it = iter(values)
        a, k = torch_pytree.tree_unflatten(
            [next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec
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


def _static_tensor(val: Any) -> bool:
    return (
        isinstance(val, torch.Tensor)
        and val.dtype in DTYPE_NAMES
        and all(isinstance(d, int) for d in val.shape)
    )


def out_of_place(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The out-of-place overload of an in-place op that writes its first argument alone
    (``add_.Tensor`` -> ``add.Tensor``, ``copy_`` -> ``copy``), else None."""
    schema = op._schema
    writes = [
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    name = schema.name.split("::", 1)[1]
    if writes != [0] or not name.endswith("_") or name.startswith("_"):
        return None
    pure = getattr(getattr(aten, name[:-1], None), op._overloadname, None)
    if not isinstance(pure, torch._ops.OpOverload) or pure._schema.is_mutable:
        return None
    return pure if not any(r.alias_info is not None for r in pure._schema.returns) else None


def _aliasing(node: Any) -> bool:
    target = getattr(node, "target", None)
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None for r in target._schema.returns)


def _writes_fresh(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an in-place op (inside a composite that functionalization does not
    see into) writing a tensor that a non-aliasing op of the graph made and that no view
    shares: then its out-of-place form, rebinding that tensor, computes the same values."""
    target: Any = node.target
    if out_of_place(target) is None or not node.args:
        return False
    dst: Any = node.args[0]
    if not isinstance(dst, torch.fx.Node) or dst.op != "call_function":
        return False
    maker = dst.args[0] if dst.target.__module__ == "_operator" else dst  # NOTE: getitem
    if not isinstance(maker, torch.fx.Node) or maker.op != "call_function" or _aliasing(maker):
        return False
    return not any(_aliasing(u) and u is not node for u in dst.users)


def _check_graph(gm: torch.fx.GraphModule) -> str | None:
    """Why the ATen graph is not a faithful functional program, or None."""
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            return f"the traced graph has a {node.op} node"
        if node.op != "call_function":
            continue
        target = node.target
        if target is torch.ops.aten.copy_.default and node.args[0] in placeholders:
            return "it writes an input in place"
        if target.__module__ == "_operator" and target.__name__ == "getitem":
            continue
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            return f"the traced graph calls {target}, not an ATen operator"
        if target in _DATA_READS:
            return "it reads tensor data into a Python value (item())"
        for tag, why in _REFUSED_TAGS.items():
            if tag in target.tags:
                return f"aten.{target.__name__} {why}"
        if target._schema.is_mutable and not _writes_fresh(node):
            return f"aten.{target.__name__} writes its arguments"
        vals = node.meta.get("val")
        leaves = vals if isinstance(vals, (tuple, list)) else [vals]
        if not leaves or not all(_static_tensor(v) for v in leaves):
            return f"aten.{target.__name__} returns something other than static-shape tensors"
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    results = output.args[0]
    leaves = list(results) if isinstance(results, (tuple, list)) else [results]
    if not all(isinstance(x, torch.fx.Node) for x in leaves):
        return "a result is not a tensor the graph computes"
    return None


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point():
        both_nan = a.isnan() & b.isnan()
        same = (a == b) & (torch.signbit(a) == torch.signbit(b))
        return bool((same | both_nan).all())
    return bool(torch.equal(a, b))


def _faithful(gm: torch.fx.GraphModule, tensors: list[Any], outs: list[Any]) -> bool:
    """Whether the ATen graph, run on the real samples, gives eager's results exactly."""
    with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
        got = gm(*tensors)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    return len(got) == len(outs) and all(
        isinstance(o, torch.Tensor) and _same_values(g, o) for g, o in zip(got, outs)
    )


def _plain(x: Any) -> Any:
    """fx's immutable lists and dicts as Python lists and dicts (tuples stay tuples)."""
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def functional_form(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``op``, or for a view op left in the functionalized graph (inside a composite that
    functionalization does not see into) its ``_copy`` form: in a graph that writes nothing,
    a view and its copy hold the same values. None for a view op with no ``_copy`` form."""
    if not any(r.alias_info is not None for r in op._schema.returns):
        return op
    if op._schema.is_mutable:
        return None
    packet = getattr(aten, f"{op._schema.name.split('::', 1)[1]}_copy", None)
    found = getattr(packet, op._overloadname, None) if packet is not None else None
    return found if isinstance(found, torch._ops.OpOverload) else None


class _Emitter:
    """Writes the IR nodes of one ATen graph into the capture's graph."""

    def __init__(self, cx: CaptureContext, gm: torch.fx.GraphModule, inputs: list[Tracer]):
        self.cx = cx
        self.gm = gm
        self.inputs = inputs
        self.env: dict[torch.fx.Node, Any] = {}

    def run(self) -> list[Value] | str:
        placeholders = iter(self.inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.cx.value(next(placeholders))
            elif node.op == "get_attr":
                const = getattr(self.gm, node.target)
                self.env[node] = self.cx.value(self.cx.lift_const(const))
            elif node.op == "call_function":
                if node.target.__module__ == "_operator":  # getitem of a multi-output node
                    self.env[node] = self.env[node.args[0]][node.args[1]]
                    continue
                emitted = self.call(node)
                if isinstance(emitted, str):
                    return emitted
                self.env[node] = emitted
            elif node.op == "output":
                results = node.args[0]
                leaves = list(results) if isinstance(results, (tuple, list)) else [results]
                return [self.env[x] for x in leaves]
        return "the traced graph has no output"

    def call(self, node: torch.fx.Node) -> Any:
        target: Any = node.target
        pure = out_of_place(target) if target._schema.is_mutable else None
        op = pure or functional_form(target)
        if op is None:
            return f"aten.{target.__name__} aliases its input and has no _copy form"
        args = _plain(torch.fx.node.map_arg(node.args, lambda n: self.env[n]))
        kwargs = _plain(torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n]))
        vals = node.meta["val"]
        expected = [TensorType.of(v) for v in (vals if isinstance(vals, (tuple, list)) else [vals])]
        value = self._native(op, args, kwargs, expected)
        if value is None:
            value = self._aten(node, op, expected)
        if pure is not None and not isinstance(value, str):
            written: Any = node.args[0]
            self.env[written] = value  # NOTE: the written tensor is the result from here on
        return value

    def _native(self, op: Any, args: Any, kwargs: Any, expected: list[TensorType]) -> Any:
        if len(expected) != 1:
            return None
        try:
            value = emit_native(self.cx.builder, op, tuple(args), dict(kwargs))
        except (TypeRuleError, AttrError, TypeError, ValueError):
            return None
        if value is None or value.type != expected[0]:
            return None  # NOTE: a mismatched node is left dead; dead-code elimination drops it
        return value

    def _aten(self, node: torch.fx.Node, op: Any, expected: list[TensorType]) -> Any:
        from plait.frontend.opaque import NotLiteral, call_spec

        markers: dict[int, torch.fx.Node] = {}

        def mark(n: torch.fx.Node) -> Any:
            t = torch.empty(0)
            markers[id(t)] = n
            keep.append(t)
            return t

        keep: list[torch.Tensor] = []
        args = _plain(torch.fx.node.map_arg(node.args, mark))
        kwargs = _plain(torch.fx.node.map_arg(node.kwargs, mark))
        try:
            tensors, attrs = call_spec(tuple(args), dict(kwargs))
        except NotLiteral as exc:
            return f"an argument of aten.{op.__name__} has no literal form: {exc}"
        name, overload = overload_name(op)
        operands = [self.env[markers[id(t)]] for t in tensors]
        try:
            if operands:
                values = self.cx.builder.call(
                    "aten", operands, name=name, overload=overload, **attrs
                )
            else:
                values = self.cx.builder.call("aten_factory", name=name, overload=overload, **attrs)
        except (TypeRuleError, AttrError, TypeError, ValueError) as exc:
            return f"plait's aten node rejects aten.{op.__name__}: {exc}"
        if [v.type for v in values] != expected:
            return f"the meta kernel of aten.{op.__name__} disagrees with the traced types"
        return values[0] if not isinstance(node.meta["val"], (tuple, list)) else list(values)


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


def trace_to_aten(
    cx: CaptureContext, func: Any, args: tuple, kwargs: dict, sampled: Any = NOT_RUN
) -> Any:
    """``func(*args, **kwargs)`` as IR nodes through its ATen graph: the call's result (tracers
    shaped like eager's), or :class:`Refused` saying why not (nothing emitted is used then)."""
    if cx.dynamic:
        return Refused("ATen tracing takes static shapes (dynamic=True)", sampled)
    found: list[Tracer] = []
    pargs = cx.unwrap(args, found)
    pkwargs = cx.unwrap(kwargs, found)
    if not found and not isinstance(func, types.BuiltinFunctionType):
        # NOTE: a Python function with no tensor argument may set global state
        # (torch.set_default_dtype): traced, it would run twice
        return Refused("no tensor argument, and not a builtin torch factory", sampled)
    traced = _trace(func, pargs, pkwargs)
    if isinstance(traced, str):
        return Refused(traced, sampled)
    gm, tensors = traced
    by_plain = {id(t._plain): t for t in found}
    if not all(id(t) in by_plain for t in tensors):
        return Refused("a tensor argument is out of reach of the ATen trace", sampled)
    inputs = [by_plain[id(t)] for t in tensors]
    why = _check_graph(gm)
    if why is not None:
        return Refused(why, sampled)
    if sampled is NOT_RUN:
        sampled, _ = cx.sample(func, args, kwargs)
        if cx.rng.draws():
            return Refused("it moved the random number generator", sampled)
    outs = list(sampled) if isinstance(sampled, (tuple, list)) else [sampled]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        return Refused(f"it returns {type(sampled).__name__}, not tensors", sampled)
    try:
        faithful = _faithful(gm, tensors, outs)
    except Exception as exc:
        return Refused(f"its ATen graph fails on the sample ({_first_line(exc)})", sampled)
    if not faithful:
        return Refused("its ATen graph computes other values than eager on the sample", sampled)
    values = _Emitter(cx, gm, inputs).run()
    if isinstance(values, str):
        return Refused(values, sampled)
    if len(values) != len(outs):
        return Refused("its ATen graph returns another number of results", sampled)
    grad = cx.grad_enabled and any(t._rg for t in inputs)
    wrapped = [_result(cx, v, o, inputs, grad) for v, o in zip(values, outs)]
    if isinstance(sampled, (tuple, list)):
        return pytree.same_type(sampled, wrapped)
    return wrapped[0]
