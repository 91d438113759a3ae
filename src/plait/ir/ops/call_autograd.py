"""PyTorch's autograd on a call a node runs (opaque, aten and random nodes): probing a call on
fake tensors and differentiating it through ``torch_vjp``."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.ir.graph import Operand, Value
from plait.ir.ops.aten_overloads import resolve_overload
from plait.ir.ops.call_literals import decode_call, resolve_target
from plait.ir.ops.vjp import VjpContext, torch_vjp_rule
from plait.ir.types import FLOAT_DTYPES, TensorType, Type

# --- PyTorch's autograd on a call it runs (opaque, aten, random nodes) ---------------------------
# NOTE: random ATen overloads whose eager derivative is zero for every operand (derivatives.yaml:
# zeros_like; the draw does not depend on the operand's value differentiably). A call made of
# these draws alone has no gradient; tests/autograd/test_vjp_extern.py checks each against eager.
# normal_functional is what functionalization makes of Tensor.normal_: PyTorch's autograd has
# no formula for it, eager's in-place op has (bernoulli.p is not here: eager's torch.bernoulli(x,
# p) refuses a gradient, and its Tensor.bernoulli_(p) gives a zero one; one overload for both).
ZERO_GRADIENT_DRAWS = frozenset(
    {
        "aten.bernoulli.default",
        "aten.bernoulli.Tensor",
        "aten.normal_functional.default",
        "aten.uniform.default",
        "aten.normal.Tensor_float",
        "aten.normal.float_Tensor",
        "aten.normal.Tensor_Tensor",
        "aten.exponential.default",
        "aten.geometric.default",
        "aten.log_normal.default",
        "aten.cauchy.default",
        "aten.poisson.default",
    }
)


@dataclass(frozen=True)
class CallProbe:
    """What PyTorch makes of one call, run once on fake tensors with the wanted operands
    requiring grad: whether autograd differentiates each result, the ATen overloads it
    dispatched (``aten.flip.default``) and those of them that draw random numbers."""

    differentiable: tuple[bool, ...]
    calls: tuple[str, ...]
    draws: tuple[str, ...]


def draws_random(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether ATen overload ``func`` called so draws from the generator: it is tagged
    ``nondeterministic_seeded`` and no argument turns its randomness off (``train=False``,
    ``dropout=0``, ``dropout_p=0``: the RNN and attention overloads)."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    bound = {arg.name: value for arg, value in zip(func._schema.arguments, args)}
    bound.update(kwargs)
    if bound.get("train") is False:
        return False
    return not any(bound.get(name) in (0, 0.0) for name in ("dropout", "dropout_p"))


@functools.lru_cache(maxsize=1024)
def probe_call(
    target: str, literals: str, kwliterals: str, operands: tuple[Type, ...], wanted: tuple[int, ...]
) -> CallProbe | None:
    """Run ``target`` (``aten.<name>.<overload>`` or a ``torch.*`` callable) with the node's
    arguments on fake CPU tensors, ``operands[i]`` requiring grad for ``i`` in ``wanted``; None
    when it cannot run so (no fake kernel, a symbolic shape)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    if target.startswith("aten."):
        fn: Any = resolve_overload(*target.removeprefix("aten.").rsplit(".", 1))
    else:
        fn = resolve_target(target)
    calls: list[str] = []
    draws: list[str] = []

    class Dispatched(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func.namespace == "aten":
                calls.append(str(func))
                if draws_random(func, args, kwargs):
                    draws.append(str(func))
            return func(*args, **kwargs)

    if not all(isinstance(t, TensorType) and t.is_static for t in operands):
        return None
    try:
        # NOTE: fake CPU tensors whatever the node's device: autograd on fake CUDA tensors needs
        # a CUDA build, and differentiability and draws do not depend on the device
        with torch._C.DisableTorchFunction(), FakeTensorMode():
            fakes = [torch.empty(t.shape, dtype=t.dtype) for t in operands]  # type: ignore[union-attr]
            for i in wanted:
                fakes[i].requires_grad_(True)
            args, keywords = decode_call(fakes, literals, kwliterals)
            with torch.enable_grad(), Dispatched():
                out = fn(*args, **keywords)
    except Exception:  # NOTE: no fake kernel for this call: the caller assumes the worst
        return None
    outs = [o for o in out if o is not None] if isinstance(out, (tuple, list)) else [out]
    differentiable = tuple(isinstance(o, torch.Tensor) and o.requires_grad for o in outs)
    return CallProbe(differentiable, tuple(calls), tuple(draws))


def call_probe(ctx: VjpContext, target: str) -> CallProbe | None:
    """:func:`probe_call` for the node of ``ctx`` (an opaque, aten or random call node)."""
    if not all(isinstance(o, Value) for o in ctx.inputs):
        return None
    types = tuple(o.type for o in ctx.inputs if isinstance(o, Value))
    wanted = tuple(
        i
        for i, t in enumerate(types)
        if ctx.wants(i) and isinstance(t, TensorType) and t.dtype in FLOAT_DTYPES
    )
    return probe_call(target, ctx.attrs["literals"], ctx.attrs["kwliterals"], types, wanted)


def differentiated_call(ctx: VjpContext, probe: CallProbe | None) -> list[Operand | None]:
    """``torch_vjp`` over the node's reference, seeded with the cotangents of the results
    PyTorch's autograd differentiates (all of them when ``probe`` is None): a result it does not
    (``empty_like``, ``rand_like``) has no gradient, and ``torch.autograd.grad`` refuses it."""
    grads = list(ctx.grads)
    if probe is not None and len(probe.differentiable) == len(grads):
        grads = [g if d else None for g, d in zip(grads, probe.differentiable)]
    return torch_vjp_rule(VjpContext(ctx.builder, ctx.node, grads, ctx.needs))
