"""A shape read during capture passes the program's tests of a ``torch.Size`` as eager's does.

``x.shape`` is plait's own tuple of traced dims during capture (``torch.Size`` cannot be
subclassed); ``isinstance(x.shape, torch.Size)``, its text and its arithmetic must read as
eager's, or the program compiles the other branch.
"""

from __future__ import annotations

import pytest
import torch

import plait


def branch_on_size(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if isinstance(x.shape, torch.Size) else x - 1


def branch_on_size_of_slice(x: torch.Tensor) -> torch.Tensor:
    return x + 3 if isinstance(x.size()[1:], torch.Size) else x - 3


def size_text(x: torch.Tensor) -> tuple[torch.Tensor, str, str]:
    return x.sum(0), str(x.shape), repr(x.size())


def size_arithmetic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Size, torch.Size]:
    return x.reshape(-1), x.shape * 2, 2 * x.shape[1:]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("f", [branch_on_size, branch_on_size_of_slice, size_text, size_arithmetic])
def test_shape_reads_as_eager_size(f: object, dynamic: bool) -> None:
    compiled = plait.compile(f, fullgraph=True, dynamic=dynamic, options={"cache": False})
    for seed, shape in ((1, (2, 3)), (2, (2, 3)), (3, (4, 5))):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        want, got = f(x), compiled(x)  # type: ignore[operator]
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        assert len(want) == len(got)
        for w, g in zip(want, got):
            if isinstance(w, torch.Tensor):
                assert torch.equal(g, w)
            else:
                assert type(g) is type(w) and g == w, (w, g)
