"""PyTorch's OpInfo samples of the native math ops through ``plait.compile``: each must pass.

The sweep's harness (benchmarks/opinfo_sweep.py) calls each compiled sample three times beside
eager (its values, a fresh draw, that draw with NaN, +-inf and -0.0), in both grad modes. Here
the only acceptable outcome is ``pass``: a mismatch, a zero of the other sign, an error, and a
fallback (an opaque node or an eager fallback in the manifest) all fail, since these ops have IR
ops, capture rules and C++ kernels of their own.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from benchmarks import opinfo_sweep

SAMPLES_PER_OP = 2

NATIVE_MATH: tuple[str, ...] = (
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "expm1", "log1p", "log2", "log10", "exp2", "erfc",
    "floor", "ceil", "trunc", "round", "round.decimals_3", "round.decimals_neg_3", "frac",
    "sign", "sgn", "signbit", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
    "square", "positive", "deg2rad", "rad2deg",
    "atan2", "hypot", "copysign", "fmod", "remainder", "__rmod__", "fmax", "fmin", "xlogy",
    "logical_xor", "nan_to_num",
    "all", "any", "count_nonzero", "nansum", "prod", "logsumexp",
    "nn.functional.leaky_relu", "nn.functional.hardsigmoid", "nn.functional.hardswish",
    "nn.functional.elu", "nn.functional.selu", "nn.functional.celu", "nn.functional.softplus",
    "nn.functional.mish", "nn.functional.logsigmoid", "nn.functional.hardshrink",
    "nn.functional.softshrink", "nn.functional.threshold", "nn.functional.relu6",
    "nn.functional.softsign", "nn.functional.tanhshrink",
)  # fmt: skip


# NOTE: eager's answer for the sign of a zero depends on an element's position here (its vector
# loop writes +0.0 in softshrink's dead band, its scalar loop, which takes a contiguous tensor's
# last elements and every strided one, x * 0): plait gives the scalar loop's answer everywhere,
# so a zero of the other sign is eager's own inconsistency (tests/codegen/test_native_math.py
# holds the op to one of eager's answers per element).
SIGN_OF_ZERO_BY_POSITION = frozenset({"nn.functional.softshrink"})


@functools.cache
def _ops() -> dict[str, Any]:
    return {opinfo_sweep.op_key(op): op for op in opinfo_sweep.float32_ops()}


def test_the_list_names_existing_ops() -> None:
    missing = [key for key in NATIVE_MATH if key not in _ops()]
    assert not missing, f"not in this torch's op_db: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("key", NATIVE_MATH)
def test_opinfo_samples_pass_natively(key: str) -> None:
    outcomes = list(
        opinfo_sweep.run_op(_ops()[key], limit=SAMPLES_PER_OP, grad_modes=opinfo_sweep.GRAD_MODES)
    )
    judged = [o for o in outcomes if o.category != "not_judged"]
    assert judged, f"{key}: eager rejected every sample"
    allowed = {"pass", "signed_zero"} if key in SIGN_OF_ZERO_BY_POSITION else {"pass"}
    wrong = [o for o in judged if o.category not in allowed]
    assert not wrong, "\n".join(
        f"{o.op} sample {o.index} ({o.desc}), {o.grad_mode}, {o.draw}: {o.category}: {o.detail}"
        f" {o.fallbacks}"
        for o in wrong
    )
