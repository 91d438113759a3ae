"""State a program reads through library code is guarded: a change between calls recompiles,
and the second call equals eager on fresh inputs (plait.frontend.library_reads).

Before, each of these baked the capture's answer into the graph and gave a stale result after
the change: ``torch.backends.mha.get_fastpath_enabled()`` (a library function's frame, whose
reads were not recorded), a logger's level (a library object, compared by identity), a
``functools`` cache's results (filled before the capture, or cleared after it), and getters of
process state PyTorch implements in C (``torch.is_anomaly_enabled()``,
``torch.backends.cudnn.deterministic``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning
from plait.frontend import capture_program
from plait.frontend.pyvalues import keyed
from plait.frontend.saved_roots import resolve
from tests.util import assert_bitwise, set_backend_flag

NO_CACHE = {"cache": False}
LOG = logging.getLogger("tests.capture.library_state")
TABLE = {"k": 2.0}


def _x() -> torch.Tensor:
    return torch.randn(3, 4)


def _changed_then_equal(
    program: Callable[[torch.Tensor], torch.Tensor], change: Callable[[], None], compiles: int = 2
) -> Any:
    """Compile and call ``program``, ``change`` the state it reads, call again on fresh inputs:
    the same as eager, with ``compiles`` specializations made."""
    compiled = plait.compile(program, options=NO_CACHE)
    x = _x()
    assert_bitwise(compiled(x), program(x), "before the change")
    change()
    for _ in range(2):
        x = _x()
        assert_bitwise(compiled(x), program(x), "after the change")
    assert len(compiled.specializations) == compiles
    return compiled


@pytest.fixture
def fastpath() -> Iterator[None]:
    before = torch.backends.mha.get_fastpath_enabled()
    yield
    torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("first", [True, False])
def test_a_branch_on_the_attention_fast_path_flag_follows_it(fastpath: None, first: bool) -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if torch.backends.mha.get_fastpath_enabled() else x * 3.0

    torch.backends.mha.set_fastpath_enabled(first)
    flip = lambda: torch.backends.mha.set_fastpath_enabled(not first)
    compiled = _changed_then_equal(program, flip)
    assert "get_fastpath_enabled" in (compiled.specializations[-1].reason or "")


@pytest.fixture
def log_levels() -> Iterator[None]:
    loggers = [LOG, LOG.parent]
    before = [lg.level for lg in loggers if lg is not None]
    yield
    for lg, level in zip(loggers, before):
        assert lg is not None
        lg.setLevel(level)
    logging.disable(logging.NOTSET)


def _enabled(x: torch.Tensor) -> torch.Tensor:
    if LOG.isEnabledFor(logging.DEBUG):
        x = x * 2.0
    return x + 1.0


def _level(x: torch.Tensor) -> torch.Tensor:
    return x * float(LOG.level)


def _effective(x: torch.Tensor) -> torch.Tensor:
    return x * float(LOG.getEffectiveLevel())


def _got_by_name(x: torch.Tensor) -> torch.Tensor:
    if logging.getLogger("tests.capture.library_state").isEnabledFor(logging.DEBUG):
        x = x * 2.0
    return x + 1.0


@pytest.mark.parametrize("program", [_enabled, _level, _effective, _got_by_name])
def test_a_logger_level_set_after_compiling_recompiles(
    log_levels: None, program: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    LOG.setLevel(logging.INFO)
    _changed_then_equal(program, lambda: LOG.setLevel(logging.DEBUG))


@pytest.mark.parametrize("program", [_enabled, _effective])
def test_a_parent_logger_level_and_logging_disable_recompile(
    log_levels: None, program: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    assert LOG.parent is not None
    LOG.setLevel(logging.NOTSET)
    LOG.parent.setLevel(logging.INFO)
    compiled = _changed_then_equal(program, lambda: LOG.parent.setLevel(logging.DEBUG))  # type: ignore[union-attr]
    logging.disable(logging.CRITICAL)
    x = _x()
    assert_bitwise(compiled(x), program(x))


def _cached_reader() -> tuple[Callable[[], float], Callable[[int], float]]:
    @functools.lru_cache
    def bounded() -> float:
        return TABLE["k"]

    @functools.cache
    def unbounded(n: int) -> float:
        return TABLE["k"] * n

    return bounded, unbounded


@pytest.mark.parametrize("kind", ["lru_cache", "cache"])
@pytest.mark.parametrize("filled", [True, False])
def test_a_cached_result_is_eagers_until_the_cache_is_cleared(kind: str, filled: bool) -> None:
    """Eager returns the cached result whatever the function would compute now; after
    cache_clear() it computes again from the changed state. The graph's result follows."""
    bounded, unbounded = _cached_reader()

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * (bounded() if kind == "lru_cache" else unbounded(2))

    TABLE["k"] = 2.0
    if filled:
        program(_x())  # NOTE: the capture then finds the result cached
    compiled = plait.compile(program, options=NO_CACHE)
    try:
        for k in (5.0, 7.0):
            x = _x()
            assert_bitwise(compiled(x), program(x), "before the change")
            TABLE["k"] = k  # NOTE: the cache still holds the old result: eager returns it
            x = _x()
            assert_bitwise(compiled(x), program(x), "changed, not cleared")
            (bounded if kind == "lru_cache" else unbounded).cache_clear()
            x = _x()
            assert_bitwise(compiled(x), program(x), "cleared")
    finally:
        TABLE["k"] = 2.0


def test_an_entry_for_other_arguments_keeps_the_graph() -> None:
    _, unbounded = _cached_reader()

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * unbounded(2)

    compiled = plait.compile(program, options=NO_CACHE)
    x = _x()
    assert_bitwise(compiled(x), program(x))
    unbounded(3)  # NOTE: a new entry; the one the program reads is unchanged
    x = _x()
    assert_bitwise(compiled(x), program(x))
    assert len(compiled.specializations) == 1


@pytest.fixture
def anomaly() -> Iterator[None]:
    before = torch.is_anomaly_enabled()
    yield
    torch.autograd.set_detect_anomaly(before)


def test_a_getter_of_process_state_is_asked_again(anomaly: None) -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if torch.is_anomaly_enabled() else x * 3.0

    torch.autograd.set_detect_anomaly(False)
    _changed_then_equal(program, lambda: torch.autograd.set_detect_anomaly(True))


@pytest.fixture
def cudnn_flags() -> Iterator[None]:
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    yield
    set_backend_flag(torch.backends.cudnn, "deterministic", before[0])
    set_backend_flag(torch.backends.cudnn, "benchmark", before[1])


def test_a_property_of_a_backends_module_is_read_again(cudnn_flags: None) -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if torch.backends.cudnn.deterministic else x * 3.0

    set_backend_flag(torch.backends.cudnn, "deterministic", False)

    def change() -> None:
        set_backend_flag(torch.backends.cudnn, "deterministic", True)

    _changed_then_equal(program, change)


@pytest.fixture
def warn_always() -> Iterator[None]:
    before = torch.is_warn_always_enabled()
    yield
    torch.set_warn_always(before)


def test_a_python_getter_of_process_state_is_asked_again(warn_always: None) -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if torch.is_warn_always_enabled() else x * 3.0

    torch.set_warn_always(False)
    _changed_then_equal(program, lambda: torch.set_warn_always(True))


def test_a_bounded_cache_whose_entry_was_evicted_and_computed_again_is_read_anew() -> None:
    """``lru_cache(maxsize=1)`` reuses its one entry's link for each new key: the entry the
    program reads, evicted by another and computed again from changed state, is a new result
    under the same link; an entry for other arguments alone keeps the graph."""

    @functools.lru_cache(maxsize=1)
    def scaled(n: int) -> float:
        return TABLE["k"] * n

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * scaled(2)

    compiled = plait.compile(program, options=NO_CACHE)
    try:
        x = _x()
        assert_bitwise(compiled(x), program(x))
        scaled(3)  # NOTE: evicts 2 (a miss)
        TABLE["k"] = 9.0
        scaled(2)  # NOTE: 2 again, from the changed state, in the same link
        x = _x()
        assert_bitwise(compiled(x), program(x), "recomputed under the same link")
        assert len(compiled.specializations) == 2
    finally:
        TABLE["k"] = 2.0


def test_a_miss_for_other_arguments_of_a_bounded_cache_keeps_the_graph() -> None:
    @functools.lru_cache(maxsize=8)
    def scaled(n: int) -> float:
        return TABLE["k"] * n

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * scaled(2)

    compiled = plait.compile(program, options=NO_CACHE)
    for n in (3, 4):
        x = _x()
        assert_bitwise(compiled(x), program(x))
        scaled(n)  # NOTE: a miss; the entry the program reads is unchanged
    x = _x()
    assert_bitwise(compiled(x), program(x))
    assert len(compiled.specializations) == 1


def test_library_reads_are_found_again_from_their_saved_form(
    log_levels: None, warn_always: None, cudnn_flags: None
) -> None:
    """A warm start rebuilds the guard from the roots' saved descriptions: a logger by name, a
    backends module's property, a getter, the fast-path flag's module global."""

    def program(x: torch.Tensor) -> torch.Tensor:
        x = x * 2.0 if logging.getLogger("tests.capture.library_state").isEnabledFor(10) else x
        x = x * 3.0 if torch.backends.cudnn.deterministic else x
        x = x * 5.0 if torch.is_warn_always_enabled() else x
        return x * 7.0 if torch.backends.mha.get_fastpath_enabled() else x

    prog = capture_program(program, (_x(),))
    saved = prog.guard_plan.to_json()["pyreads"]
    kinds = {d[0] for d in saved}
    assert {"logger", "modprop", "getter", "global"} <= kinds, saved
    for desc in saved:
        root = resolve(desc, None)
        assert root.desc == desc
        assert keyed(root).key == keyed(root).key  # NOTE: readable again in this process
    LOG.setLevel(logging.DEBUG)
    found = {tuple(map(str, d)): keyed(resolve(d, None)).key for d in saved}
    LOG.setLevel(logging.INFO)
    assert found != {tuple(map(str, d)): keyed(resolve(d, None)).key for d in saved}


@pytest.mark.parametrize("maxsize", [None, 8])
def test_a_tensor_the_capture_stores_in_a_cache_is_eagers_after_the_call(
    maxsize: int | None,
) -> None:
    """A cached function the program calls with a constant computes a tensor: during the
    capture, a tensor of the capture, which the cache kept (the capture cannot see the C
    cache fill). Every later call, eager or compiled, got it back and raised. The entry is
    taken out, the call runs eagerly (loudly) and fills the cache with eager's tensor."""

    @functools.lru_cache(maxsize=maxsize)
    def freqs(n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) * 0.5

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * freqs(4)

    compiled = plait.compile(program, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="functools cache"):
        x = torch.randn(4)
        assert_bitwise(compiled(x), program(x), "the call that captured")
    assert type(freqs(4)) is torch.Tensor  # NOTE: eager's, not one of the capture's
    for _ in range(2):
        x = torch.randn(4)
        assert_bitwise(compiled(x), program(x), "a later call")


@pytest.mark.xfail(
    strict=True,
    reason="a cache hit during the capture is not seen (a C call, no frame): the entry it "
    "read, evicted by a later miss of the same capture, is guarded by no root, and a later "
    "call that computes it again from changed state reuses the graph",
)
def test_an_entry_read_then_evicted_during_the_capture_is_computed_again() -> None:
    """The capture reads scaled(1) from the cache (a result from before TABLE changed), then
    scaled(2) evicts it. Eager's next call computes scaled(1) from the changed TABLE; the
    graph holds the evicted result."""

    @functools.lru_cache(maxsize=1)
    def scaled(n: int) -> float:
        return TABLE["k"] * n

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * scaled(1) + scaled(2)

    try:
        scaled(1)
        TABLE["k"] = 5.0  # NOTE: eager still returns 2.0 for scaled(1), until it is evicted
        compiled = plait.compile(program, options=NO_CACHE)
        compiled(_x())  # NOTE: as eager's first call: x * 2.0 + 10.0; the cache holds 2 only
        x = _x()
        assert_bitwise(compiled(x), program(x), "scaled(1) computed again")
    finally:
        TABLE["k"] = 2.0


def test_a_handler_added_after_compiling_recompiles_a_branch_on_has_handlers() -> None:
    log = logging.getLogger("tests.capture.library_state.handlers")
    log.propagate = False

    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if log.hasHandlers() else x * 3.0

    handler = logging.NullHandler()
    try:
        _changed_then_equal(program, lambda: log.addHandler(handler))
    finally:
        log.removeHandler(handler)
        log.propagate = True
