"""Reverse-mode derivative rules (vector-Jacobian products), registered beside each op.

A rule receives a :class:`VjpContext` for one forward node, inside the graph being extended
with its backward: the node's flat operands, attributes and outputs, the cotangent of each output
(``None`` where none flows) and which operands want a gradient. It appends the nodes that compute
those gradients through ``ctx.call`` and returns one entry per flat operand: a value of the
operand's type, or ``None`` (no gradient: not wanted, not a tensor, or not differentiable).

Ops whose results never carry a gradient (comparisons, bitwise ops, integer results, the
generator's ops) are declared with :func:`nondifferentiable`. Every other op has a rule; where no
IR formula is written the rule is :func:`torch_vjp_rule`: a ``torch_vjp`` extern node that runs
PyTorch's own autograd over the op's reference implementation (PyTorch's backward kernels,
exactly eager's derivative).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.ir.ops.vjp import VjpContext, vjp_rule
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float64))
    >>> y = b.call("sin", x)
    >>> g = b.input("g", TensorType((3,), torch.float64))
    >>> ctx = VjpContext(b, y.producer, (g,), (True,))
    >>> [n.op for n in (vjp_rule("sin")(ctx)[0].producer,)]
    ['mul']
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from plait.ir.builder import GraphBuilder
from plait.ir.errors import IRKeyError, IRValueError
from plait.ir.graph import Node, Operand, Value
from plait.ir.ops.call_literals import decode_literal
from plait.ir.ops.registry import (
    VARIADIC,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    get_op,
    register,
)
from plait.ir.types import FLOAT_DTYPES, TensorType, Type

# NOTE: extern.py registers rules from this module: its helpers are imported where they run.


class VjpContext:
    """What a rule sees of one forward node, and where it writes its backward."""

    def __init__(
        self,
        builder: GraphBuilder,
        node: Node,
        grads: Sequence[Value | None],
        needs: Sequence[bool],
    ) -> None:
        self.builder = builder
        self.node = node
        self.inputs: tuple[Operand, ...] = node.inputs
        self.attrs = node.attrs
        self.outputs: tuple[Value, ...] = node.outputs
        self.grads = tuple(grads)
        self.needs = tuple(needs)

    def call(self, op: str, *args: Any, **attrs: Any) -> Any:
        """Append ``op(*args, **attrs)`` to the backward."""
        return self.builder.call(op, *args, **attrs)

    def grad(self, i: int = 0) -> Value:
        """The cotangent of output ``i``: zeros of its type where none flows."""
        g = self.grads[i]
        return g if g is not None else self.zeros_like(self.outputs[i])

    def zeros_like(self, v: Value) -> Value:
        t = _tensor_type(v)
        return self.call("zeros", shape=t.shape, dtype=t.dtype, device=t.device)

    def sum_to(self, g: Value, target: Type) -> Value:
        """``g`` summed over the dims broadcasting added to ``target`` and cast to its dtype:
        the gradient of an operand a broadcasting op read."""
        t = _tensor_type(g)
        want = target.shape if isinstance(target, TensorType) else ()
        lead = len(t.shape) - len(want)
        dims = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(want) if n == 1 and t.shape[lead + i] != 1
        )
        if dims:
            g = self.call("sum", g, dims=dims, keepdim=False)
            if lead < len(t.shape) and any(n == 1 for n in want):
                g = self.call("reshape", g, shape=tuple(want))
        dtype = target.dtype if isinstance(target, TensorType) else t.dtype
        if _tensor_type(g).dtype != dtype:
            g = self.call("to_dtype", g, dtype=dtype)
        return g

    def wants(self, i: int) -> bool:
        return self.needs[i] and isinstance(self.inputs[i], Value)


VjpRule = Callable[[VjpContext], Sequence[Operand | None]]

_VJPS: dict[str, VjpRule] = {}
_NONDIFF: set[str] = set()


def vjp(*names: str) -> Callable[[VjpRule], VjpRule]:
    """Register ``rule`` as the derivative of each op in ``names`` (put it beside the op)."""

    def register_rule(rule: VjpRule) -> VjpRule:
        for name in names:
            if name in _VJPS or name in _NONDIFF:
                raise IRValueError(f"op {name!r} already has a derivative rule")
            _VJPS[name] = rule
        return rule

    return register_rule


def nondifferentiable(*names: str) -> None:
    """Declare that no gradient flows through these ops' results."""
    for name in names:
        if name in _VJPS or name in _NONDIFF:
            raise IRValueError(f"op {name!r} already has a derivative rule")
        _NONDIFF.add(name)


def vjp_rule(name: str) -> VjpRule | None:
    """The registered rule of op ``name``; None when the op is not differentiable."""
    if name in _NONDIFF:
        return None
    try:
        return _VJPS[name]
    except KeyError:
        raise IRKeyError(f"op {name!r} has no derivative rule (see plait.ir.ops.vjp)") from None


def has_rule(name: str) -> bool:
    return name in _VJPS or name in _NONDIFF


def is_differentiable(name: str) -> bool:
    return name in _VJPS


def _tensor_type(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType), f"%{v.name} is not a tensor"
    return v.type


# --- PyTorch's autograd as a rule --------------------------------------------------------------


def _encode(value: Any) -> Any:
    """An attribute value as JSON, in the literal forms :func:`decode_literal` reads."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": _float_hex(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, sympy.Expr):
        raise TypeRuleError("torch_vjp: symbolic attributes are not supported yet")
    raise TypeRuleError(f"torch_vjp: cannot encode attribute {value!r}")


def _float_hex(value: float) -> str:
    return struct.pack("<d", value).hex()


def torch_vjp_rule(ctx: VjpContext) -> list[Operand | None]:
    """The derivative PyTorch's autograd gives the op's reference implementation: one
    ``torch_vjp`` extern node computing every wanted gradient at once."""
    tensors: list[Value] = []
    layout: list[Any] = []
    for o in ctx.inputs:
        if isinstance(o, Value):
            layout.append({"t": len(tensors)})
            tensors.append(o)
        else:
            layout.append(_encode(o))
    wrt = tuple(i for i in range(len(ctx.inputs)) if ctx.wants(i) and _is_float(ctx.inputs[i]))
    seeded = tuple(i for i, g in enumerate(ctx.grads) if g is not None)
    if not wrt or not seeded:
        return [None] * len(ctx.inputs)
    cots = [ctx.grads[i] for i in seeded]
    grads = ctx.call(
        "torch_vjp",
        [*tensors, *cots],
        of=ctx.node.op,
        attrs=json.dumps({k: _encode(v) for k, v in ctx.attrs.items()}, sort_keys=True),
        operands=json.dumps(layout),
        seeded=seeded,
        wrt=wrt,
    )
    out: list[Operand | None] = [None] * len(ctx.inputs)
    for i, g in zip(wrt, grads if isinstance(grads, tuple) else (grads,)):
        out[i] = g
    return out


def _is_float(o: Operand) -> bool:
    return isinstance(o, Value) and isinstance(o.type, TensorType) and o.type.dtype in FLOAT_DTYPES


def _operands(args: Sequence[Any], operands: str) -> tuple[list[Any], int]:
    layout = json.loads(operands)
    used = sum(1 for x in layout if isinstance(x, dict) and set(x) == {"t"})
    return [decode_literal(x, list(args)) for x in layout], used


def _torch_vjp_rule(
    args: list[Type], of: str, attrs: str, operands: str, seeded: tuple, wrt: tuple
) -> list[Type]:
    get_op(of)
    layout = json.loads(operands)
    if not isinstance(layout, list):
        raise TypeRuleError("torch_vjp: operands must be a JSON list")
    flat, used = _operands(args, operands)
    if len(args) != used + len(seeded):
        raise TypeRuleError(
            f"torch_vjp: {len(args)} operands, the layout uses {used} and {len(seeded)} cotangents"
        )
    out: list[Type] = []
    for i in wrt:
        if not 0 <= i < len(flat) or not isinstance(flat[i], TensorType):
            raise TypeRuleError(f"torch_vjp: operand {i} is not a tensor")
        out.append(flat[i])
    return out


def _torch_vjp_ref(
    args: list[Any], of: str, attrs: str, operands: str, seeded: tuple, wrt: tuple
) -> Any:
    op = get_op(of)
    decoded = {k: decode_literal(v, []) for k, v in json.loads(attrs).items()}
    layout = json.loads(operands)
    used = sum(1 for x in layout if isinstance(x, dict) and set(x) == {"t"})
    tensors, cots = list(args[:used]), list(args[used:])
    flat = [decode_literal(x, tensors) for x in layout]
    leaves = []
    with torch.enable_grad():
        for i in wrt:
            flat[i] = flat[i].detach().requires_grad_(True)
            leaves.append(flat[i])
        outs = op.run(flat, decoded)
        roots = [outs[i] for i in seeded]
        found = torch.autograd.grad(roots, leaves, cots, allow_unused=True)
    return tuple(
        torch.zeros_like(leaf) if g is None else g.detach() for leaf, g in zip(leaves, found)
    )


register(
    OpDef(
        "torch_vjp",
        Category.EXTERN,
        (Param("args", VARIADIC),),
        (
            Attr("of", "str"),
            Attr("attrs", "str"),
            Attr("operands", "str"),
            Attr("seeded", "ints"),
            Attr("wrt", "ints"),
        ),
        _torch_vjp_rule,
        _torch_vjp_ref,
        FLOAT_DTYPES,
        "the gradients PyTorch's autograd gives op ``of`` (its reference implementation) for "
        "the cotangents of outputs ``seeded``, with respect to operands ``wrt``",
        fixed_outputs=None,
    )
)
nondifferentiable("torch_vjp")


class NoDerivativeError(ValueError):
    """A derivative rule cannot differentiate its node as asked (a random op whose gradient
    needs the numbers it drew); raised while the joint graph is built."""


def empty_batch_zeros(ctx: VjpContext, wanted: Sequence[int | None]) -> list[Operand | None]:
    """Zero gradients for the operands at ``wanted`` (an empty one for an empty operand):
    eager's batch-norm backward over a batch with no element, where the formula and ATen's
    backward meta kernel divide by the element count."""
    out: list[Operand | None] = [None] * len(ctx.inputs)
    for i in wanted:
        v = ctx.inputs[i] if i is not None else None
        if i is not None and isinstance(v, Value) and isinstance(v.type, TensorType):
            t = v.type
            out[i] = ctx.call("zeros", shape=t.shape, dtype=t.dtype, device=t.device)
    return out


def is_empty(o: Operand | None) -> bool:
    """Whether ``o`` is a tensor of static shape with no element."""
    t = o.type if isinstance(o, Value) else None
    return isinstance(t, TensorType) and t.is_static and 0 in t.shape


def tensor_type(o: Operand | None) -> TensorType:
    """The type of tensor operand ``o`` (a derivative rule's operand known to be a tensor)."""
    assert isinstance(o, Value) and isinstance(o.type, TensorType), f"{o!r} is not a tensor"
    return o.type


def all_static(*values: Operand | None) -> bool:
    """Whether every tensor among ``values`` has a static shape (what an ``aten`` node needs)."""
    return all(tensor_type(v).is_static for v in values if isinstance(v, Value))


def aten_node(ctx: VjpContext, name: str, tensors: list[Value], literals: list[Any]) -> tuple:
    """An ``aten`` node ``aten.<name>.default`` over ``tensors`` (``{"t": i}`` in ``literals``);
    its defined results."""
    return ctx.call("aten", tensors, name=name, overload="default", literals=json.dumps(literals))
