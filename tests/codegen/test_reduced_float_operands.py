"""A bfloat16/float16 kernel reads an operand of another dtype as eager's kernel does.

PyTorch's TensorIterator casts every operand to the op's common dtype before its kernel runs: a
Python number, a 0-dim tensor of another float dtype or an integer tensor is rounded to 16 bits
(``bf16 + 1.3`` adds 1.296875, ``bf16 + 257`` adds 256, ``bf16 < 1.3`` compares with 1.296875).
Only ``mul`` and ``div`` read a second operand of one element at float precision
(``original_scalar_value<opmath_t>``): ``bf16 * 1.3`` multiplies by 1.3f, ``1.3 * bf16`` too
(Python calls ``mul(bf16, 1.3)``), but ``torch.mul(tensor(1.3), bf16)`` rounds it. The kernels
kept every such operand at float32 precision: one ulp off for a single add (inside the contract),
a flipped comparison (integers and bools are exact) and, through a chain that cancels, values
outside the contract. Arithmetic and comparisons are compared bitwise (each op rounds once, as
eager's); pow, atan2 and tanh within the contract's pointwise tolerance (eager's vector and
scalar loops differ there by an ulp), which a float32 exponent or base misses by several ulps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from tests.util import assert_bitwise, contract_tol

HALF = (torch.bfloat16, torch.float16)


def _draw(seed: int, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Values of both signs, with the 16-bit neighbours of 1.3 among them (where a comparison
    with 1.3 rounded or not differs)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(4096, generator=gen, dtype=torch.float64) * scale).to(dtype)
    near = torch.linspace(1.2, 1.4, 64, dtype=torch.float64).to(dtype)
    x[:64], x[64:128] = near, -near
    return x


def _ints(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 100)
    return torch.randint(-5000, 5000, (4096,), generator=gen, dtype=torch.int32)


CASES: dict[str, Callable[..., torch.Tensor]] = {
    "add_float": lambda x, i, z: x + 1.3,
    "radd_float": lambda x, i, z: 1.3 + x,
    "sub_float": lambda x, i, z: x - 1.3,
    "rsub_float": lambda x, i, z: 1.3 - x,
    "add_int": lambda x, i, z: x + 2049,
    "add_alpha": lambda x, i, z: torch.add(x, x * 0.7, alpha=1.3),
    "sub_alpha": lambda x, i, z: torch.sub(x, x * 0.7, alpha=1.3),
    "add_int_tensor": lambda x, i, z: x + i,
    "mul_int_tensor": lambda x, i, z: x * i,
    "add_0d": lambda x, i, z: x + z,
    "mul_0d_second": lambda x, i, z: x * z,
    "mul_0d_first": lambda x, i, z: z * x,
    "mul_float": lambda x, i, z: x * 1.3,
    "rmul_float": lambda x, i, z: 1.3 * x,
    "div_float": lambda x, i, z: x / 1.3,
    "floor_div_float": lambda x, i, z: torch.div(x, 1.3, rounding_mode="floor"),
    "div_0d_first": lambda x, i, z: torch.div(z, x),
    "lt_float": lambda x, i, z: x < 1.3,
    "eq_float": lambda x, i, z: x == 1.3,
    "ge_0d": lambda x, i, z: x >= z,
}
# NOTE: libm functions: eager's vector and scalar loops differ by an ulp, so within the contract
TRANSCENDENTAL: dict[str, Callable[..., torch.Tensor]] = {
    "pow_float": lambda x, i, z: x.abs() ** 1.3,
    "rpow_float": lambda x, i, z: 1.3**x,
    "atan2_0d": lambda x, i, z: torch.atan2(x * 0.001, z),
    "chain": lambda x, i, z: ((x * x + 1.1) * 0.3 - x).tanh() * x,
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(CASES) + sorted(TRANSCENDENTAL))
def test_operand_rounded_as_eager(name: str, dtype: torch.dtype) -> None:
    fn = CASES.get(name) or TRANSCENDENTAL[name]
    compiled = plait.compile(fn, backend="stax")
    z = torch.tensor(1.3)  # NOTE: a float32 0-dim tensor: the op's common dtype stays 16-bit
    scale = 300.0 if "int" in name or name.startswith("pow") else 3.0
    with torch.no_grad():
        for seed in range(2):
            x, i = _draw(seed, dtype, scale), _ints(seed)
            got, want = compiled(x, i, z), fn(x, i, z)
            what = f"{name} {dtype} draw {seed}"
            if name in CASES:
                assert_bitwise(got, want, what)
            else:
                torch.testing.assert_close(
                    got, want, equal_nan=True, msg=what, **contract_tol("pointwise", dtype)
                )
