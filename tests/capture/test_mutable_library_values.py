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
from plait.errors import CaptureFallbackWarning, ClockReadWarning, GraphCaptureError
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


def _containers() -> list[tuple[str, Any, Callable[[Any], float], Callable[[Any, float], None]]]:
    """(name, container, read one value, write one value in place)."""
    import array
    import collections
    import contextvars
    import threading
    import types

    def set_first(c: Any, v: float) -> None:
        c[0] = v

    def set_byte(c: Any, v: float) -> None:
        c[0] = int(v * 100) % 256

    def set_var(c: Any, v: float) -> None:
        c.set(v)

    def set_attr(c: Any, v: float) -> None:
        c.scale = v

    def draw() -> float:
        return float(torch.rand(()).item())

    def update(c: Any, v: float) -> None:
        c.maps[0].update(scale=v) if isinstance(c, collections.ChainMap) else backing.update(
            scale=v
        )

    backing = dict(scale=draw())
    view = memoryview(bytearray(torch.randint(0, 256, (2,)).tolist()))
    var: contextvars.ContextVar[float] = contextvars.ContextVar("scale")
    var.set(draw())
    local = threading.local()
    local.scale = draw()
    chain = collections.ChainMap({"scale": draw()}, {})
    return [
        ("deque", collections.deque(torch.rand(2).tolist()), lambda c: c[0], set_first),
        ("bytearray", bytearray(torch.randint(0, 256, (2,)).tolist()), lambda c: c[0], set_byte),
        ("memoryview", view, lambda c: c[0], set_byte),
        ("array", array.array("f", torch.rand(2).tolist()), lambda c: c[0], set_first),
        ("contextvar", var, lambda c: c.get(), set_var),
        ("thread_local", local, lambda c: c.scale, set_attr),
        ("mapping_proxy", types.MappingProxyType(backing), lambda c: c["scale"], update),
        ("chain_map", chain, lambda c: c["scale"], update),
    ]  # fmt: skip


@pytest.mark.parametrize("case", _containers(), ids=lambda c: c[0])
def test_a_library_container_written_in_place_recompiles(case: Any) -> None:
    _, box, read, write = case

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * read(box)

    compiled = plait.compile(program, options=NO_CACHE)
    for _ in range(3):
        x = torch.randn(4)
        assert_bitwise(compiled(x), program(x))
        write(box, abs(float(torch.randn(()).item())) + 1.0)


def test_a_program_rotating_a_deque_runs_eagerly() -> None:
    import collections

    ring = collections.deque(torch.randn(3).tolist())

    def program(x: torch.Tensor) -> torch.Tensor:
        ring.rotate(1)
        return x * ring[0]

    twin = collections.deque(ring)

    def eager(x: torch.Tensor) -> torch.Tensor:
        twin.rotate(1)
        return x * twin[0]

    compiled = plait.compile(program, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="changes Python values it reads"):
        for _ in range(4):
            x = torch.randn(3)
            assert_bitwise(compiled(x), eager(x))


class _Settings:
    def __init__(self, scale: float) -> None:
        self.scale = scale


def test_the_object_a_weak_reference_holds_is_guarded() -> None:
    import weakref

    target = _Settings(float(torch.randn(()).item()))
    ref = weakref.ref(target)

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * ref().scale

    compiled = plait.compile(program, options=NO_CACHE)
    for _ in range(3):
        x = torch.randn(3)
        assert_bitwise(compiled(x), program(x))
        target.scale = float(torch.randn(()).item())


def test_a_program_that_reads_the_clock_compiles_with_a_warning() -> None:
    import time

    def program(x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        y = x.sin()
        _ = time.perf_counter() - start
        return y

    compiled = plait.compile(program, options=NO_CACHE)
    with pytest.warns(ClockReadWarning, match=r"time\.perf_counter"):
        compiled(torch.randn(3))
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), program(x), **contract_tol("pointwise", torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.uint8])
def test_numpy_scalars_are_operands_as_python_numbers(dtype: torch.dtype) -> None:
    """``x * TABLE.sum()`` passes a ``np.float32``: compiled (no fallback), promoted and
    rounded as eager does, and guarded through the array it came from."""

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * TABLE[:3].sum() + np.int64(TABLE.size)

    saved = TABLE.copy()
    try:
        compiled = plait.compile(program, fullgraph=True, options=NO_CACHE)
        for _ in range(2):
            x = (torch.rand(5) * 20).to(dtype)
            torch.testing.assert_close(
                compiled(x), program(x), **contract_tol("pointwise", program(x).dtype)
            )
            _write(TABLE)
    finally:
        TABLE[:] = saved


def test_a_list_of_plain_values_a_library_module_holds_is_guarded_by_items() -> None:
    """``"--double" in sys.argv``: a library module's list, compared by its items."""
    import sys

    flag = f"--scale-{int(torch.randint(0, 10**6, ()).item())}"

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if flag in sys.argv else x - 1

    compiled = plait.compile(program, options=NO_CACHE)
    x = torch.randn(3)
    assert_bitwise(compiled(x), program(x))
    sys.argv.append(flag)
    try:
        assert_bitwise(compiled(x), program(x))
    finally:
        sys.argv.remove(flag)
    assert_bitwise(compiled(x), program(x))
