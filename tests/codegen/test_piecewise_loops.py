"""A kernel whose innermost dim is chosen piece by piece (``cat``, ``stack`` and ``pad`` along
the last dim) prints that loop once per piece, so each piece reads its input without a clamp
or a choice per element (the C++ compiler folds both over the piece's bounds); the values equal
eager PyTorch bitwise on fresh draws, for float, 16-bit and integer inputs."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import assert_bitwise

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-movement")]

Fn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# NOTE: name -> (function of three [rows, 24] inputs, the pieces its innermost loop has)
CASES: dict[str, tuple[Fn, int]] = {
    "cat-three": (lambda a, b, c: torch.cat([a * 2, b, c - 1], dim=-1), 3),
    "cat-two-widths": (lambda a, b, c: torch.cat([a[:, :5], b + c], dim=1) * 3, 2),
    "rotate-half": (lambda a, b, c: torch.cat([-a[:, 12:], a[:, :12]], dim=-1) * b, 2),
    "pad-last": (lambda a, b, c: F.pad(a + b, (3, 5), value=1), 3),
    "stack-last": (lambda a, b, c: torch.stack([a, b * c], dim=-1).flatten(1) + 1, 2),
}


def _loops_of_last_variable(source: str) -> int:
    names = re.findall(r"for \(int64_t (\w+) = \w+;", source)
    return sum(1 for n in names if n == names[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_piecewise_innermost_loops_match_eager(name: str, dtype: torch.dtype) -> None:
    fn, pieces = CASES[name]
    compiled = plait.compile(fn, backend="stax")
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        args = [(torch.randn(6, 24, generator=g) * 50).to(dtype) for _ in range(3)]
        assert_bitwise(compiled(*args), fn(*args), f"{name} {dtype}")
    program = compiled.specializations[-1].compiled.program
    loops = [_loops_of_last_variable(k.source) for k in program.kernels]
    assert max(loops) == pieces, [k.source for k in program.kernels]
