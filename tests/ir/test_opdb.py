"""Every op of the registry against the op database: the reference implementation equals the
PyTorch call a user writes, bitwise, and the type rule predicts the result, statically and with
symbolic dims."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch

from plait.ir import TensorType, Value, get_op
from plait.ir.ops import TypeRuleError
from plait.ir.types import NoneType, ScalarType, scalar_type_of
from plait.symbolic import evaluate, symbol
from tests.ir.opdb import cases, samples
from tests.util import assert_bitwise

CASES = cases()


def _flat(args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(a if isinstance(a, list) else [a])
    return out


def _as_operand(x: Any, type_of: Any) -> Any:
    return Value("v", type_of(x)) if isinstance(x, torch.Tensor) else x


def _results(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _run_both(op: str, sample: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    opdef = get_op(op)
    attrs = opdef.check_attrs(sample.attrs)
    flat = _flat(sample.args)
    seed = torch.seed()
    torch.manual_seed(seed)
    ours = opdef.run(flat, attrs)
    torch.manual_seed(seed)
    theirs = _results(sample.torch_fn())
    return ours, theirs


@pytest.mark.parametrize(("op", "dtype"), CASES, ids=[f"{o}-{d}" for o, d in CASES])
def test_reference_matches_torch(op: str, dtype: torch.dtype) -> None:
    cases_run = samples(op, dtype)
    assert cases_run, f"no samples for {op} {dtype}"
    for sample in cases_run:
        ours, theirs = _run_both(op, sample)
        assert len(ours) == len(theirs), sample.desc
        for a, b in zip(ours, theirs):
            assert_bitwise(a, b, f"{op} {dtype} {sample.desc}")


@pytest.mark.parametrize(("op", "dtype"), CASES, ids=[f"{o}-{d}" for o, d in CASES])
def test_type_rule_predicts_result(op: str, dtype: torch.dtype) -> None:
    opdef = get_op(op)
    for sample in samples(op, dtype):
        attrs = opdef.check_attrs(sample.attrs)
        flat = [_as_operand(x, TensorType.of) for x in _flat(sample.args)]
        predicted = opdef.output_types(flat, attrs)
        actual = _results(sample.torch_fn())
        assert len(predicted) == len(actual), sample.desc
        for t, a in zip(predicted, actual):
            assert str(t) == str(TensorType.of(a)), f"{op} {dtype} {sample.desc}"


def _symbolize(
    args: list[Any], static: set[int], by_size: dict[int, sympy.Symbol]
) -> tuple[list[Any], dict[str, int]]:
    """Replace every dim >= 2 by a symbol; equal sizes share one (a consistent assignment)."""
    bindings: dict[str, int] = {}

    def sym_type(x: torch.Tensor) -> TensorType:
        dims: list[Any] = []
        for n in x.shape:
            if n < 2:
                dims.append(int(n))
                continue
            if n not in by_size:
                by_size[n] = symbol(f"s{len(bindings)}")
                bindings[str(by_size[n])] = int(n)
            dims.append(by_size[n])
        return TensorType(tuple(dims), x.dtype, str(x.device))

    for i in static:  # sizes seen in static operands stay static everywhere
        for x in args[i] if isinstance(args[i], list) else [args[i]]:
            by_size.update({int(n): int(n) for n in x.shape})  # type: ignore[misc]
    out: list[Any] = []
    for i, a in enumerate(args):
        conv = TensorType.of if i in static else sym_type
        if isinstance(a, list):
            out.extend(_as_operand(x, conv) for x in a)
        else:
            out.append(_as_operand(a, conv))
    return out, bindings


def _symbolic_attrs(
    opdef: Any, attrs: dict[str, Any], by_size: dict[int, sympy.Symbol]
) -> dict[str, Any]:
    """Sizes carried in attributes (``dims`` kind: shapes, split sizes) become the same symbols
    as the operand dims they were derived from."""
    out = dict(attrs)
    for a in opdef.attrs:
        if a.kind.rstrip("?") == "dims" and out[a.name] is not None:
            out[a.name] = tuple(by_size.get(d, d) if isinstance(d, int) else d for d in out[a.name])
    return out


# Ops whose type rule needs static sizes, with the reason; everything else must work symbolically.
NEEDS_STATIC = {
    "chunk": "the number of outputs depends on the size",
    "arange": "no tensor operands",
    "rng_seed": "no tensor operands",
    "rng_get_state": "no tensor operands",
    "random_factory": "no tensor operands",
    "rng_set_state": "a generator state has the generator's fixed size",
    # split sizes must sum to a symbolic dim: see test_symbolic.py::test_split_symbolic
    "split": "sizes are attributes; covered by a hand-written symbolic case",
    "aten": "its meta kernel runs on static fake tensors (a clear TypeRuleError otherwise)",
    "aten_factory": "no tensor operands",
    "aten_datadep": "a data-dependent op takes operands of static shape (its result's sizes are "
    "unbacked, never symbolic sizes of an input)",
    "aten_check": "its operands are static (a clear TypeRuleError otherwise)",
    "batch_norm_relu": "an ATen call's meta kernel runs on static fake tensors",
    "batch_norm_relu_backward": "an ATen call's meta kernel runs on static fake tensors",
}


@pytest.mark.parametrize(("op", "dtype"), CASES, ids=[f"{o}-{d}" for o, d in CASES])
def test_type_rule_symbolic(op: str, dtype: torch.dtype) -> None:
    opdef = get_op(op)
    checked = 0
    for sample in samples(op, dtype):
        by_size: dict[int, sympy.Symbol] = {}
        flat, bindings = _symbolize(sample.args, sample.static, by_size)
        if not bindings:
            continue
        attrs = _symbolic_attrs(opdef, opdef.check_attrs(sample.attrs), by_size)
        try:
            predicted = opdef.output_types(flat, attrs)
        except TypeRuleError as exc:
            # A rule may decline a symbolic case, but only by asking for specialization.
            assert "symbolic" in str(exc) or "specialize" in str(exc), str(exc)
            continue
        actual = _results(sample.torch_fn())
        for t, a in zip(predicted, actual):
            assert isinstance(t, TensorType)
            sizes = tuple(evaluate(d, bindings) for d in t.shape)
            assert sizes == tuple(a.shape), f"{op} {sample.desc}: {t} with {bindings}"
            assert t.dtype == a.dtype
        checked += 1
    if op not in NEEDS_STATIC and op not in ("full", "zeros", "ones", "opaque"):
        assert checked, f"no symbolic sample checked for {op}"


def test_every_op_has_samples_for_every_dtype() -> None:
    missing = [(op, d) for op, d in CASES if not samples(op, d)]
    assert not missing


def test_scalar_operand_types() -> None:
    assert scalar_type_of(2) == ScalarType("int")
    assert scalar_type_of(2.0) == ScalarType("float")
    assert scalar_type_of(True) == ScalarType("bool")
    assert str(NoneType()) == "none"
    with pytest.raises(TypeError):
        scalar_type_of("x")
