"""Every op in the registry declares its derivative: a rule, or that it has none."""

from __future__ import annotations

from plait.ir import all_ops
from plait.ir.ops.vjp import has_rule, is_differentiable


def test_every_op_declares_its_derivative() -> None:
    missing = sorted(name for name in all_ops() if not has_rule(name))
    assert not missing, f"ops with no derivative rule and not declared nondifferentiable: {missing}"


def test_float_results_of_differentiable_ops_have_rules() -> None:
    assert is_differentiable("mul") and not is_differentiable("eq")
