"""NumPy arrays and iterators a program reads change in place, under the same identity: an
array is guarded by its contents (a write to one element recompiles, and the results follow
eager's); an iterator is compared by its position, so a program that advances one changes a
value it reads while it runs: the loud eager fallback (a graph would repeat the value it
yielded at capture)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_bitwise, contract_tol

NO_CACHE = {"cache": False}
TABLE = np.random.default_rng(0).standard_normal(6).astype(np.float32)
BIG = np.random.default_rng(1).standard_normal(1 << 15).astype(np.float32)  # NOTE: past inline


def _element(x: torch.Tensor) -> torch.Tensor:
    return x * float(TABLE[2])


def _converted(x: torch.Tensor) -> torch.Tensor:
    return x + torch.tensor(TABLE)


def _sliced(x: torch.Tensor) -> torch.Tensor:
    return x * torch.as_tensor(TABLE[1:4]).sum()


def _big(x: torch.Tensor) -> torch.Tensor:
    return x + torch.tensor(BIG[-6:])


def _write(table: np.ndarray) -> None:
    """New values in place (the array keeps its identity)."""
    table[:] = np.random.default_rng().standard_normal(table.shape, dtype=np.float32)


@pytest.mark.parametrize(
    ("program", "table"),
    [(_element, TABLE), (_converted, TABLE), (_sliced, TABLE), (_big, BIG)],
    ids=["element", "converted", "sliced", "past_inline"],
)
def test_an_array_written_in_place_recompiles(program: Callable[..., Any], table: Any) -> None:
    saved = table.copy()
    try:
        compiled = plait.compile(program, options=NO_CACHE)
        for _ in range(3):
            x = torch.randn(6)
            # NOTE: a reduction (the slice's sum) may add in another order
            torch.testing.assert_close(
                compiled(x), program(x), **contract_tol("reduction", torch.float32)
            )
            _write(table)
        assert len(compiled.specializations) == 3
    finally:
        table[:] = saved


def test_an_unchanged_array_keeps_its_compiled_program() -> None:
    compiled = plait.compile(_converted, options=NO_CACHE)
    for _ in range(3):
        x = torch.randn(6)
        assert_bitwise(compiled(x), _converted(x))
    assert len(compiled.specializations) == 1


def test_an_array_of_python_objects_runs_eagerly_with_a_warning() -> None:
    table = np.array([1.5, "a"], dtype=object)

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * table[0]

    compiled = plait.compile(program, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="NumPy array of Python objects"):
        x = torch.randn(3)
        assert_bitwise(compiled(x), program(x))


def _counting(start: int) -> Callable[[torch.Tensor], torch.Tensor]:
    it = iter(range(start, start + 100))

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * next(it)

    return program


def _generating(start: int) -> Callable[[torch.Tensor], torch.Tensor]:
    gen = (float(i) / 3 for i in range(start, start + 100))

    def program(x: torch.Tensor) -> torch.Tensor:
        return x + next(gen)

    return program


@pytest.mark.parametrize("make", [_counting, _generating], ids=["iterator", "generator"])
def test_a_program_that_advances_an_iterator_runs_eagerly(make: Callable[..., Any]) -> None:
    start = int(torch.randint(0, 50, ()).item())
    eager, compiled = make(start), plait.compile(make(start), options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="changes Python values it reads while it runs"):
        for _ in range(4):
            x = torch.randn(3)
            assert_bitwise(compiled(x), eager(x))


def test_fullgraph_names_the_iterator() -> None:
    compiled = plait.compile(_counting(1), fullgraph=True, options=NO_CACHE)
    with pytest.raises(GraphCaptureError, match=r"while it runs.*closure variable it"):
        compiled(torch.randn(3))


def test_a_generator_yielding_one_value_from_one_place_keeps_its_graph() -> None:
    """Suspended at its yield, ``while True: yield k`` is where it was after each call: the
    graph holds, guarded by ``k``."""
    k = float(torch.randn(()).item())

    def constant() -> Any:
        while True:
            yield k

    running = constant()
    next(running)

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * next(running)

    compiled = plait.compile(program, options=NO_CACHE)
    for _ in range(3):
        x = torch.randn(3)
        assert_bitwise(compiled(x), program(x))
    assert len(compiled.specializations) == 1
