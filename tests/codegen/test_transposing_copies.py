"""Transposing copies (attention's heads split and merged, channel shuffles, patches) compile to
C++ loops whose innermost loop reads its input at affine, contiguous-or-strided addresses: no
division or modulo of the innermost loop variable for every element, which kept such a copy
from vectorizing (a GPT-2 block's head merge ran 15x slower than the same copy as loops over
the input's dims). The values equal eager PyTorch bitwise on fresh draws: these calls move data.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

import plait
from tests.util import assert_bitwise

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-movement")]


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d) * 2


def _split_heads(x: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    return x.view(b, t, 4, c // 4).transpose(1, 2).contiguous() + 1


def _channel_shuffle(x: torch.Tensor) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w) - 1


def _patches(x: torch.Tensor) -> torch.Tensor:
    n, c, h, w = x.shape
    p = 4
    y = x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return y.reshape(n, (h // p) * (w // p), p * p * c) * 3


CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "merge-heads": (_merge_heads, (2, 4, 16, 32)),
    "split-heads": (_split_heads, (2, 16, 128)),
    "channel-shuffle": (_channel_shuffle, (2, 8, 6, 10)),
    "patches": (_patches, (2, 3, 16, 16)),
}


def _innermost_divisions(source: str) -> list[str]:
    """The lines of a kernel's innermost loop that divide or take the modulo of its variable."""
    loops = re.findall(r"for \(int64_t (\w+) = 0;", source)
    if not loops:
        return []
    v = loops[-1]
    body = source[source.rindex(f"for (int64_t {v} = 0;") :]
    return [line for line in body.splitlines() if re.search(rf"\({v}\)\s*[/%]", line)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_transposing_copy_loops_read_without_per_element_division(name: str) -> None:
    fn, shape = CASES[name]
    compiled = plait.compile(fn, backend="stax")
    for seed in range(3):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        assert_bitwise(compiled(x), fn(x), name)
    program = compiled.specializations[-1].compiled.program
    sources = [k.source for k in program.kernels]
    assert sources, f"{name}: no native kernel ran the copy"
    for source in sources:
        assert _innermost_divisions(source) == [], source
