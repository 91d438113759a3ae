"""Every entry of the ATen -> IR table emits an IR op that computes exactly what its ATen
overload computes: the IR graph, run by the reference interpreter on fresh random values, is
bitwise equal to the overload on the same values."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plait.frontend.aten_table import ATEN_TO_IR, emit_native
from plait.ir import GraphBuilder, TensorType, interpret

aten = torch.ops.aten


class T:
    """A tensor argument of an example: shape, dtype, values of at least ``low`` when ``pos``,
    inside (-1, 1) when ``unit``."""

    def __init__(
        self,
        *shape: int,
        dtype: torch.dtype = torch.float32,
        pos: bool = False,
        unit: bool = False,
        low: float = 0.25,
    ):
        self.shape, self.dtype, self.pos, self.unit, self.low = shape, dtype, pos, unit, low

    def draw(self, gen: torch.Generator) -> torch.Tensor:
        if self.dtype == torch.bool:
            return torch.rand(self.shape, generator=gen) > 0.5
        if not self.dtype.is_floating_point:
            return torch.randint(-100, 100, self.shape, generator=gen, dtype=self.dtype)
        x = torch.randn(self.shape, generator=gen, dtype=self.dtype)
        if self.unit:  # NOTE: inside (-1, 1), where asin, acos and atanh are defined
            return x.tanh() * 0.99
        return x.abs() + self.low if self.pos else x


F34, P34, U34 = T(3, 4), T(3, 4, pos=True), T(3, 4, unit=True)
I34, B34 = T(3, 4, dtype=torch.int64), T(3, 4, dtype=torch.bool)
_UNARY = (
    *("exp", "neg", "abs", "relu", "sigmoid", "tanh", "erf", "reciprocal", "silu"),
    *("sin", "cos", "tan", "atan", "sinh", "cosh", "asinh", "expm1", "exp2", "erfc"),
    *("floor", "ceil", "trunc", "frac", "sign", "signbit", "isnan", "isinf", "isfinite"),
    *("isposinf", "isneginf", "hardsigmoid", "hardswish", "mish", "round"),
)
_POSITIVE = ("log", "sqrt", "rsqrt", "log1p", "log2", "log10")
_UNIT = ("asin", "acos", "atanh")
_BINARY = ("mul", "eq", "ne", "lt", "le", "gt", "ge")

EXAMPLES: dict[Any, tuple[tuple, dict]] = {
    **{getattr(aten, n).default: ((F34,), {}) for n in _UNARY},
    **{getattr(aten, n).default: ((P34,), {}) for n in _POSITIVE},
    aten.logical_not.default: ((T(3, 4, dtype=torch.bool),), {}),
    **{getattr(aten, n).default: ((U34,), {}) for n in _UNIT},
    aten.acosh.default: ((T(3, 4, pos=True, low=1.0),), {}),
    aten.bitwise_not.default: ((I34,), {}),
    aten.logical_xor.default: ((F34, B34), {}),
    **{getattr(aten, n).default: ((F34, T(4)), {}) for n in ("atan2", "hypot", "fmax", "fmin")},
    aten.copysign.Tensor: ((F34, T(4)), {}),
    aten.xlogy.Tensor: ((F34, P34), {}),
    aten.fmod.Tensor: ((F34, P34), {}),
    aten.remainder.Tensor: ((F34, P34), {}),
    **{getattr(aten, f"bitwise_{n}").Tensor: ((I34, I34), {}) for n in ("and", "or", "xor")},
    aten.round.decimals: ((F34,), {"decimals": 2}),
    aten.leaky_relu.default: ((F34, 0.2), {}),
    aten.hardshrink.default: ((F34, 0.3), {}),
    aten.softshrink.default: ((F34, 0.3), {}),
    aten.threshold.default: ((F34, 0.1, 2.0), {}),
    aten.elu.default: ((F34, 1.5, 1.0, 1.0), {}),
    aten.softplus.default: ((F34, 2.0, 10.0), {}),
    aten.prod.default: ((F34,), {}),
    aten.all.default: ((B34,), {}),
    aten.any.default: ((B34,), {}),
    **{getattr(aten, n).Tensor: ((F34, T(4)), {}) for n in _BINARY},
    **{getattr(aten, n).Scalar: ((F34, 0.5), {}) for n in _BINARY},
    aten.maximum.default: ((F34, F34), {}),
    aten.minimum.default: ((F34, T(1, 4)), {}),
    aten.logical_and.default: ((F34, T(3, 4, dtype=torch.bool)), {}),
    aten.logical_or.default: ((T(3, 4, dtype=torch.bool), F34), {}),
    aten.add.Tensor: ((F34, F34), {"alpha": 2}),
    aten.add.Scalar: ((F34, 1.5), {}),
    aten.sub.Tensor: ((F34, T(4)), {}),
    aten.sub.Scalar: ((F34, 3), {}),
    aten.div.Tensor: ((F34, P34), {}),
    aten.div.Scalar: ((F34, 3.0), {}),
    aten.pow.Tensor_Scalar: ((F34, 3), {}),
    aten.pow.Tensor_Tensor: ((P34, F34), {}),
    aten.where.self: ((T(3, 4, dtype=torch.bool), F34, T(4)), {}),
    aten.gelu.default: ((F34,), {"approximate": "tanh"}),
    aten.clamp.default: ((F34, -0.5, 0.5), {}),
    aten.tril.default: ((T(4, 4), 1), {}),
    aten.triu.default: ((T(4, 4), -1), {}),
    aten._to_copy.default: ((F34,), {"dtype": torch.float64}),
    aten.sum.dim_IntList: ((T(3, 4, 5), [2, 0], True), {}),
    aten.sum.default: ((F34,), {"dtype": torch.float64}),
    aten.mean.dim: ((T(3, 4, 5), [1]), {}),
    aten.mean.default: ((F34,), {}),
    aten.amax.default: ((F34, [1], True), {}),
    aten.amin.default: ((F34, [0]), {}),
    aten._softmax.default: ((F34, 1, False), {}),
    aten._log_softmax.default: ((F34, 0, False), {}),
    aten.view_copy.default: ((F34, [2, 6]), {}),
    aten._unsafe_view.default: ((F34, [12]), {}),
    aten.permute_copy.default: ((T(2, 3, 4), [2, 0, 1]), {}),
    aten.expand_copy.default: ((T(3, 1), [2, 3, 4]), {}),
    aten.transpose_copy.int: ((T(2, 3, 4), 0, 2), {}),
    aten.unsqueeze_copy.default: ((F34, 1), {}),
    aten.squeeze_copy.dims: ((T(3, 1, 4, 1), [1, 3]), {}),
    aten.squeeze_copy.dim: ((T(3, 1, 4), 1), {}),
    aten.select_copy.int: ((F34, 1, 2), {}),
    aten.detach_copy.default: ((F34,), {}),
    aten.cat.default: (([T(2, 4), F34],), {}),
    aten.mm.default: ((T(2, 3), F34), {}),
    aten.bmm.default: ((T(2, 2, 3), T(2, 3, 4)), {}),
}


def test_every_entry_has_an_example() -> None:
    assert set(EXAMPLES) == set(ATEN_TO_IR)


def _bind(x: Any, f: Any) -> Any:
    if isinstance(x, T):
        return f(x)
    if isinstance(x, list):
        return [_bind(v, f) for v in x]
    return x


@pytest.mark.parametrize("op", list(EXAMPLES), ids=str)
def test_entry_computes_what_its_overload_computes(op: Any) -> None:
    args, kwargs = EXAMPLES[op]
    gb = GraphBuilder()
    specs: list[T] = []

    def as_input(t: T) -> Any:
        specs.append(t)
        return gb.input(f"x{len(specs)}", TensorType(t.shape, t.dtype))

    value = emit_native(gb, op, tuple(_bind(a, as_input) for a in args), kwargs)
    assert value is not None, f"{op}: the entry did not map its example"
    gb.output(value)
    graph = gb.build()
    for seed in (1, 2):  # NOTE: fresh draws, never zeros
        gen = torch.Generator().manual_seed(seed)
        values = [t.draw(gen) for t in specs]
        it = iter(values)
        want = op(*[_bind(a, lambda _, it=it: next(it)) for a in args], **kwargs)
        (got,) = interpret(graph, values)
        assert got.dtype == want.dtype and got.shape == want.shape, op
        assert torch.equal(got, want), f"{op}: the IR op differs from the overload"


def test_arguments_an_ir_op_lacks_leave_the_node_unmapped() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3, 4), torch.float32))
    # NOTE: aten.div.Tensor has no rounding mode; _to_copy with a layout; expand implicit=True
    assert emit_native(gb, aten._to_copy.default, (x,), {"layout": torch.strided}) is None
    assert emit_native(gb, aten.expand_copy.default, (x, [3, 4]), {"implicit": True}) is None
    assert emit_native(gb, aten._softmax.default, (x, 1, True), {}) is None
    assert emit_native(gb, aten.lgamma.default, (x,), {}) is None  # NOTE: no entry
