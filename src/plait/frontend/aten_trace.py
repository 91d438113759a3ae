"""A call with no capture rule, traced to functional ATen ops and emitted as IR nodes.

``run_opaque`` asks :func:`trace_to_aten` first. The call runs on fake copies of its sample
values under ``make_fx`` with functionalization (``remove="mutations_and_views"``): a graph of
functional ATen ops. Each ATen node becomes the IR op the ATen -> IR table
(:mod:`plait.frontend.aten_table`) names for it, else a typed ``aten`` extern node whose types
come from the overload's meta kernel. Tensors the call creates from no input (``torch.tensor``
literals) become constants of the graph.

A random op (``torch.Tag.nondeterministic_seeded``) becomes a random ``aten`` node, a runtime
check (``_linalg_check_errors``, ``_assert_async``) an ``aten_check`` node; an in-place op left
inside a composite is its functional form (:func:`rebinding`) when it writes only fresh tensors
(:func:`writes_fresh`: made in the call by an op that views nothing, no view of them taken),
rebinding every node that is that tensor. When the call itself is in place (``writes``), the
graph's write-backs of its inputs (``copy_`` into a placeholder) rebind those inputs. When the
decomposition is refused or unfaithful, a builtin's own overload is tried
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
from plait.frontend.aten_single import single_node_graph
from plait.frontend.aten_table import emit_native
from plait.ir import TensorType, Value, get_op
from plait.ir.ops import AttrError, TypeRuleError
from plait.ir.ops.aten import CHECK_TOKEN, RUNTIME_CHECKS, is_seeded, overload_name
from plait.ir.types import DTYPE_NAMES

if TYPE_CHECKING:
    from plait.frontend.capture_values import Tracer
    from plait.frontend.tracer import CaptureContext

aten = torch.ops.aten
NOT_RUN: Any = object()

# NOTE: ATen ops whose result is a Python value read from tensor data
_DATA_READS = {aten._local_scalar_dense.default, aten.item.default}
_REFUSED_TAGS = {
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
    """The functional overload of an in-place op that writes its first argument alone:
    ``add_.Tensor`` -> ``add.Tensor``, ``copy_`` -> ``copy``, and for an in-place view op its
    ``_copy`` form (``squeeze_.dim`` -> ``squeeze_copy.dim``, ``t_`` -> ``t_copy``); else None.

    NOTE: ``as_strided_`` has none: its result depends on the storage layout of the tensor it
    restrides, which the IR (values, not storage) does not describe."""
    name = op._schema.name.split("::", 1)[1]
    if (
        _written(op) != [0]
        or not name.endswith("_")
        or name.startswith("_")
        or name == "as_strided_"
    ):
        return None
    pure = getattr(getattr(aten, name[:-1], None), op._overloadname, None)
    if not isinstance(pure, torch._ops.OpOverload) or pure._schema.is_mutable:
        return None
    return functional_form(pure)


def _written(op: torch._ops.OpOverload) -> list[int]:
    return [
        i
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


def rebinding(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, list[int]] | None:
    """``(functional op, written argument positions)`` for a mutable overload: an in-place op's
    :func:`out_of_place` form (it returns the new value of argument 0), else the overload's
    ``_functional`` variant (``rrelu_with_noise`` -> ``rrelu_with_noise_functional``), which
    returns the op's results and then the new value of each written argument. None when
    there is neither."""
    pure = out_of_place(op)
    if pure is not None:
        return pure, [0]
    name = op._schema.name.split("::", 1)[1]
    packet = getattr(aten, f"{name}_functional", None)
    functional = getattr(packet, op._overloadname, None) if packet is not None else None
    if not isinstance(functional, torch._ops.OpOverload):
        return None
    fs = functional._schema
    if fs.is_mutable or any(r.alias_info is not None for r in fs.returns):
        return None
    written = _written(op)
    if len(fs.returns) != len(op._schema.returns) + len(written):
        return None
    return functional, written


def _aliasing(node: Any) -> bool:
    target = getattr(node, "target", None)
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None for r in target._schema.returns)


def _same_tensor(node: Any) -> bool:
    """Whether ``node`` is an in-place op whose result is its first argument, the same tensor
    (``fill_``, ``sub_``, ``squeeze_``)."""
    target = getattr(node, "target", None)
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.returns:
        return False
    ret = target._schema.returns[0].alias_info
    arg = target._schema.arguments[0].alias_info if target._schema.arguments else None
    return ret is not None and ret.is_write and arg is not None and ret.before_set == arg.before_set


def tensor_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node that made the tensor ``node`` is (through a chain of in-place ops)."""
    while (
        node.op == "call_function"
        and _same_tensor(node)
        and isinstance(node.args[0], torch.fx.Node)
    ):
        node = node.args[0]
    return node


def same_tensor_nodes(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Per root (:func:`tensor_root`), the nodes that are that one tensor: the root and the
    in-place ops that wrote it and returned it."""
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        members.setdefault(tensor_root(node), []).append(node)
    return members


def _fresh(root: torch.fx.Node, members: list[torch.fx.Node]) -> bool:
    """Whether the tensor made by ``root`` is made inside the call by an op that views nothing,
    and no view of it is taken (by any node that is that tensor): then writing it in place and
    rebinding it to the new value compute the same."""
    if root.op != "call_function":
        return False
    maker = root.args[0] if root.target.__module__ == "_operator" else root  # NOTE: getitem
    if not isinstance(maker, torch.fx.Node) or maker.op != "call_function" or _aliasing(maker):
        return False
    same = set(members)
    return not any(_aliasing(u) and u not in same for m in members for u in m.users)


def _arg(node: torch.fx.Node, op: torch._ops.OpOverload, i: int) -> Any:
    if i < len(node.args):
        return node.args[i]
    return node.kwargs.get(op._schema.arguments[i].name)


def writes_fresh(node: torch.fx.Node, members: dict[torch.fx.Node, list[torch.fx.Node]]) -> bool:
    """Whether the mutable op ``node`` (inside a composite that functionalization does not see
    into) has a :func:`rebinding` and writes only fresh tensors (:func:`_fresh`)."""
    target: Any = node.target
    found = rebinding(target)
    if found is None:
        return False
    for i in found[1]:
        dst = _arg(node, target, i)
        if not isinstance(dst, torch.fx.Node):
            return False
        root = tensor_root(dst)
        if not _fresh(root, members.get(root, [root])):
            return False
    return True


def _input_write(node: torch.fx.Node, placeholders: set[torch.fx.Node]) -> bool:
    """Whether ``node`` is functionalization's write-back of an input (``copy_`` into it)."""
    return node.target is aten.copy_.default and node.args[0] in placeholders


def _check_graph(gm: torch.fx.GraphModule, writes_inputs: bool = False) -> str | None:
    """Why the ATen graph is not a faithful functional program, or None. ``writes_inputs``: the
    call writes its tensor arguments in place (functionalization's ``copy_`` into them are then
    the writes the caller rebinds)."""
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    members = same_tensor_nodes(gm)
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            return f"the traced graph has a {node.op} node"
        if node.op == "get_attr" and not isinstance(getattr(gm, node.target), torch.Tensor):
            kind = type(getattr(gm, node.target)).__name__
            return f"the traced graph holds a {kind}, not a tensor (a torch.Generator argument?)"
        if node.op != "call_function":
            continue
        target = node.target
        if _input_write(node, placeholders):
            if not writes_inputs or node.users:
                return "it writes an input in place"
            continue
        if target.__module__ == "_operator" and target.__name__ == "getitem":
            continue
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            return f"the traced graph calls {target}, not an ATen operator"
        if target in _DATA_READS:
            return "it reads tensor data into a Python value (item())"
        if target in RUNTIME_CHECKS:
            continue  # NOTE: an aten_check node, run in program order
        for tag, why in _REFUSED_TAGS.items():
            if tag in target.tags:
                return f"aten.{target.__name__} {why}"
        if target._schema.is_mutable and not writes_fresh(node, members):
            return f"aten.{target.__name__} writes its arguments"
        vals = node.meta.get("val")
        leaves = vals if isinstance(vals, (tuple, list)) else [vals]
        if not leaves or not all(_static_tensor(v) for v in leaves):
            return f"aten.{target.__name__} returns something other than static-shape tensors"
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    results = output.args[0]
    if results is None:
        return None  # NOTE: a call run for its checks alone
    leaves = list(results) if isinstance(results, (tuple, list)) else [results]
    # NOTE: a None among the results (``need_weights=False``'s weights) stays None: which
    # results are None is the traced program's structure, fixed by the call's literals
    if not all(x is None or isinstance(x, torch.fx.Node) for x in leaves):
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


def _written_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders the graph writes back (functionalization's ``copy_``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = {n.args[0] for n in gm.graph.nodes if _input_write(n, set(placeholders))}
    return [i for i, p in enumerate(placeholders) if p in found]


def _draws(gm: torch.fx.GraphModule) -> bool:
    return any(
        isinstance(n.target, torch._ops.OpOverload) and is_seeded(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function"
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
        # NOTE: whether a gradient flows through the call (eager autograd differentiates the
        # nodes' reference calls then)
        self.grad = cx.grad_enabled and any(t._rg for t in inputs)
        self.gm = gm
        self.inputs = inputs
        self.env: dict[torch.fx.Node, Any] = {}
        self.members = same_tensor_nodes(gm)
        self.placeholders: list[torch.fx.Node] = []
        # NOTE: (input position, its new value): functionalization's write-backs of inputs
        self.writes: list[tuple[int, Value]] = []

    def run(self) -> list[Value | None] | str:
        placeholders = iter(self.inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.cx.value(next(placeholders))
                self.placeholders.append(node)
            elif node.op == "get_attr":
                const = getattr(self.gm, node.target)
                self.env[node] = self.cx.value(self.cx.lift_const(const))
            elif node.op == "call_function":
                if node.target.__module__ == "_operator":  # getitem of a multi-output node
                    self.env[node] = self.env[node.args[0]][node.args[1]]
                    continue
                if _input_write(node, set(self.placeholders)):
                    position = self.placeholders.index(node.args[0])
                    self.writes.append((position, self.env[node.args[1]]))
                    continue
                emitted = self.call(node)
                if isinstance(emitted, str):
                    return emitted
                self.env[node] = emitted
            elif node.op == "output":
                results = node.args[0]
                if results is None:
                    return []  # NOTE: a call run for its checks alone (_assert_async)
                leaves = list(results) if isinstance(results, (tuple, list)) else [results]
                return [None if x is None else self.env[x] for x in leaves]
        return "the traced graph has no output"

    def call(self, node: torch.fx.Node) -> Any:
        target: Any = node.target
        if target in RUNTIME_CHECKS:
            return self._aten(node, target, [CHECK_TOKEN], "aten_check")
        found = rebinding(target) if target._schema.is_mutable else None
        op, written = found if found is not None else (functional_form(target), [])
        if op is None:
            return f"aten.{target.__name__} aliases its input and has no _copy form"
        vals = node.meta["val"]
        expected = [TensorType.of(v) for v in (vals if isinstance(vals, (tuple, list)) else [vals])]
        variant = bool(written) and op is not out_of_place(target)  # NOTE: a _functional op
        if variant and self.grad:
            # NOTE: rrelu_with_noise_functional's backward reads the noise argument, not the
            # noise it drew: its gradient is not eager's
            return f"aten.{op.__name__} has no gradient of aten.{target.__name__}'s"
        if variant:
            expected += [TensorType.of(_arg(node, target, i).meta["val"]) for i in written]
        value = self._native(op, node, expected)
        if value is None:
            value = self._aten(node, op, expected)
        if isinstance(value, str) or not written:
            return value
        if not variant:  # NOTE: an in-place op's new value is its result
            self._rebind(_arg(node, target, 0), value)
            return value
        results = len(target._schema.returns)
        for i, new in zip(written, value[results:]):
            self._rebind(_arg(node, target, i), new)
        return value[:results] if isinstance(vals, (tuple, list)) else value[0]

    def _rebind(self, written: torch.fx.Node, new: Value) -> None:
        """NOTE: the written tensor is ``new`` from here on, under every node that is it."""
        for m in self.members.get(tensor_root(written), [written]):
            if m in self.env:
                self.env[m] = new

    def _native(self, op: Any, node: torch.fx.Node, expected: list[TensorType]) -> Any:
        if len(expected) != 1 or is_seeded(op):
            return None
        args = _plain(torch.fx.node.map_arg(node.args, lambda n: self.env[n]))
        kwargs = _plain(torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n]))
        try:
            value = emit_native(self.cx.builder, op, tuple(args), dict(kwargs))
        except (TypeRuleError, AttrError, TypeError, ValueError):
            return None
        if value is None or value.type != expected[0]:
            return None  # NOTE: a mismatched node is left dead; dead-code elimination drops it
        return value

    def _aten(
        self, node: torch.fx.Node, op: Any, expected: list[TensorType], kind: str = "aten"
    ) -> Any:
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
        if kind == "aten" and not operands:
            kind = "aten_factory"
        try:
            if operands:
                values = self.cx.builder.call(kind, operands, name=name, overload=overload, **attrs)
            else:
                values = self.cx.builder.call(kind, name=name, overload=overload, **attrs)
        except (TypeRuleError, AttrError, TypeError, ValueError) as exc:
            return f"plait's {kind} node rejects aten.{op.__name__}: {exc}"
        if [v.type for v in values] != expected:
            return f"the meta kernel of aten.{op.__name__} disagrees with the traced types"
        return (
            list(values)
            if len(expected) > 1 or isinstance(node.meta.get("val"), (tuple, list))
            else values[0]
        )

    def drop_effects(self, first: int) -> None:
        """NOTE: after a refused emission, the random and check nodes it emitted (and what
        reads them) leave the graph: dead, they would still draw or raise."""
        nodes = self.cx.builder.graph.nodes
        gone: set[int] = set()
        kept = nodes[:first]
        for n in nodes[first:]:
            effect = n.op == "aten_check" or get_op(n.op).is_random(n.attrs)
            if effect or any(id(v) in gone for v in n.input_values()):
                gone.update(id(v) for v in n.outputs)
            else:
                kept.append(n)
        nodes[:] = kept


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
    written = sorted({i for gm, _ in candidates for i in _written_inputs(gm)})
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
        emitter = _Emitter(cx, gm, inputs)
        first = len(cx.builder.graph.nodes)
        values = emitter.run()
        if isinstance(values, str) or len(values) != len(outs):
            emitter.drop_effects(first)
            reasons.append(values if isinstance(values, str) else "another number of results")
            continue
        break
    else:
        return Refused(reasons[0], sampled)
    for i, new in emitter.writes:
        cx.assign(inputs[i], new)
        cx.check(cx.value(inputs[i]), inputs[i]._plain)
    if sampled is None:
        return None
    grad = cx.grad_enabled and any(t._rg for t in inputs)
    wrapped = [None if v is None else _result(cx, v, o, inputs, grad) for v, o in zip(values, outs)]
    if isinstance(sampled, (tuple, list)):
        return pytree.same_type(sampled, wrapped)
    return wrapped[0]


def _candidates(
    func: Any, pargs: Any, pkwargs: Any, writes: bool
) -> tuple[list[tuple[torch.fx.GraphModule, list[Any]]], list[str]]:
    """The ATen graphs the call may be (its decomposition, then the one overload a builtin
    binds), each that passes :func:`_check_graph`, and why the others do not."""
    found: list[tuple[torch.fx.GraphModule, list[Any]]] = []
    reasons: list[str] = []
    traced = _trace(func, pargs, pkwargs)
    if isinstance(traced, str):
        reasons.append(traced)
    else:
        why = _check_graph(traced[0], writes_inputs=writes)
        if why is None:
            found.append(traced)
        else:
            reasons.append(why)
    # NOTE: the one overload a builtin binds, when its decomposition is refused or is not
    # eager's computation (a composite that decomposes otherwise under tracing: eigvalsh asks
    # whether a gradient may be needed, fake tensors say yes, and it computes eigenvectors too)
    single = None if writes else single_node_graph(func, pargs, pkwargs)
    if single is not None and not isinstance(single, str) and _check_graph(single[0]) is None:
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
    if not _same_results(got, outs):
        return "its ATen graph computes other values than eager on the sample"
    if not all(_same_values(inputs[i], tensors[i]) for i in written):
        return "its ATen graph writes other values into its inputs than eager"
    return None


def _same_state(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))
