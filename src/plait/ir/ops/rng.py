"""Ops of the global random number generator: seeding, saving and restoring its state, and
PyTorch's random functions run as they are.

Every op here is ``Category.RANDOM``: passes never merge, fold or reorder them among themselves
(the order of draws is the program's), and the executors run them in program order, so a
compiled program draws exactly the numbers eager does and leaves the generator in the same state.

- ``rng_seed {seed}``: ``torch.manual_seed(seed)``; returns the seed (an ``i64[]`` token).
- ``rng_get_state {size}``: the CPU generator's state (``u8[size]``, a copy).
- ``rng_set_state(state)``: restores it; returns an ``i64[]`` token.
- ``random_call(tensors...) {target, out_types, literals, kwliterals}`` and ``random_factory``
  (no tensor operand): a PyTorch random function (``torch.rand_like``, ``torch.bernoulli``,
  ``torch.randn``, ``torch.randperm``...), its arguments encoded as in ``opaque``
  (``{"dtype": "float64"}``, ``{"device": "cpu"}``, ``{"tuple": [2, 3]}``, ...).

Example:
    >>> from plait.ir.ops import get_op
    >>> get_op("rng_seed").is_random({"seed": 0})
    True
"""

from __future__ import annotations

from typing import Any

import torch

from plait.ir.graph import Operand
from plait.ir.ops.call_autograd import ZERO_GRADIENT_DRAWS, call_probe
from plait.ir.ops.call_literals import decode_call, resolve_target, run_call
from plait.ir.ops.pointwise_grads import zero_grads
from plait.ir.ops.registry import VARIADIC, Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.ops.vjp import NoDerivativeError, VjpContext, nondifferentiable, vjp
from plait.ir.parser import parse_type
from plait.ir.types import FLOAT_DTYPES, TensorType, Type

_TOKEN = TensorType((), torch.int64, "cpu")


def _seed(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.tensor(seed, dtype=torch.int64)


def _set_state(state: torch.Tensor) -> torch.Tensor:
    torch.default_generator.set_state(state)
    return torch.zeros((), dtype=torch.int64)


register(
    OpDef(
        "rng_seed",
        Category.RANDOM,
        (),
        (Attr("seed", "int"),),
        lambda seed: [_TOKEN],
        _seed,
        (torch.int64,),
        "torch.manual_seed(seed) at this point of the program",
    )
)
register(
    OpDef(
        "rng_get_state",
        Category.RANDOM,
        (),
        (Attr("size", "int"),),
        lambda size: [TensorType((size,), torch.uint8, "cpu")],
        lambda size: torch.default_generator.get_state(),
        (torch.uint8,),
        "the CPU generator's state at this point of the program",
    )
)


def _set_state_rule(state: Type) -> list[Type]:
    if not isinstance(state, TensorType) or state.dtype != torch.uint8 or state.rank != 1:
        raise TypeRuleError(f"rng_set_state: the state is a u8 vector, got {state}")
    return [_TOKEN]


register(
    OpDef(
        "rng_set_state",
        Category.RANDOM,
        (Param("state"),),
        (),
        _set_state_rule,
        _set_state,
        (torch.int64,),
        "restores the CPU generator's state",
    )
)


def _random_rule(*args: Any, target: str, out_types: str, literals: str, kwliterals: str) -> Any:
    resolve_target(target)
    decode_call([None] * len(args[0]) if args else [], literals, kwliterals)
    types = [parse_type(s.strip()) for s in out_types.split(";") if s.strip()]
    if not types:
        raise TypeRuleError("random call: out_types must name at least one output type")
    return types


_CALL_ATTRS = (
    Attr("target", "str"),
    Attr("out_types", "str"),
    Attr("literals", "str", ""),
    Attr("kwliterals", "str", ""),
)
register(
    OpDef(
        "random_call",
        Category.RANDOM,
        (Param("args", VARIADIC),),
        _CALL_ATTRS,
        _random_rule,
        lambda args, target, out_types, literals, kwliterals: run_call(
            list(args), target, literals, kwliterals
        ),
        FLOAT_DTYPES,
        "a PyTorch random function with tensor arguments, run by PyTorch in program order",
        fixed_outputs=None,
    )
)
register(
    OpDef(
        "random_factory",
        Category.RANDOM,
        (),
        _CALL_ATTRS,
        _random_rule,
        lambda target, out_types, literals, kwliterals: run_call([], target, literals, kwliterals),
        FLOAT_DTYPES,
        "a PyTorch random factory (no tensor argument), run by PyTorch in program order",
        fixed_outputs=None,
    )
)


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: the generator's ops compute no float of the program's values; a random factory has no
# operand to differentiate.
nondifferentiable("rng_seed", "rng_get_state", "rng_set_state", "random_factory")


@vjp("random_call")
def _random_call_vjp(ctx: VjpContext) -> list[Operand | None]:
    """No gradient where eager has none (``rand_like``: its result is not differentiable) or a
    zero one (the call is one draw of :data:`ZERO_GRADIENT_DRAWS`: ``torch.bernoulli(p)``,
    ``torch.normal(mean, std)``); any other call is refused: its gradient depends on the numbers
    it drew (``F.rrelu``'s slopes), which running it again in the backward would not give back."""
    target = ctx.attrs["target"]
    probe = call_probe(ctx, target)
    if probe is not None:
        seeded = [i for i, g in enumerate(ctx.grads) if g is not None]
        if len(probe.differentiable) == len(ctx.outputs) and not any(
            probe.differentiable[i] for i in seeded
        ):
            return [None] * len(ctx.inputs)
        if probe.calls and all(c in ZERO_GRADIENT_DRAWS for c in probe.calls):
            return zero_grads(ctx)  # NOTE: eager's zeros (an optimizer steps on them), not None
    raise NoDerivativeError(
        f"random_call {target}: its gradient depends on the random numbers it drew, which "
        "plait cannot replay in the backward"
        + ("" if probe is not None else " (its call cannot be probed on fake tensors)")
    )
