"""A Python value the program read, set again to an equal object, fails the native identity
check once: the Python read that follows finds the values unchanged and re-arms the check with
the objects it read (``rearms``), so later calls hold natively, without a Python read. The
re-armed check covers the new objects as the capture's covered the old ones: a later change
inside the new object, or the object replaced by an unequal one, compiles again and computes
with the new values. Skipped where the native evaluator is unavailable (guards run in Python)."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch

import plait
from plait.guards import GuardEnv, native
from tests.conformance.models import randn
from tests.util import contract_tol

pytestmark = pytest.mark.skipif(
    not native.status().available, reason="the re-arm is the native evaluator's"
)

TOL = contract_tol("pointwise", torch.float32)
SETTINGS: dict[str, Any] = {"shift": 0.5, "names": ["a", "b", "c"]}


def _program(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * len(SETTINGS["names"]) + SETTINGS["shift"]


@pytest.fixture
def settings() -> Any:
    saved = copy.deepcopy(SETTINGS)
    yield SETTINGS
    SETTINGS.clear()
    SETTINGS.update(saved)


def _evaluator(compiled: Any) -> Any:
    (spec,) = compiled.specializations
    assert spec.guards.evaluator == "native"
    return spec.guards.holds


def _call(compiled: Any, seed: int) -> None:
    x = randn(3, 4, seed=seed)
    torch.testing.assert_close(compiled(x), _program(x), **TOL)


def test_an_equal_object_set_again_is_read_once_then_checked_natively(settings: Any) -> None:
    compiled = plait.compile(_program)
    _call(compiled, 1)
    ev = _evaluator(compiled)
    reads, rearms = ev.python_reads, ev.rearms
    settings["names"] = list(settings["names"])  # NOTE: equal, another object
    _call(compiled, 2)
    assert (ev.python_reads, ev.rearms) == (reads + 1, rearms + 1)
    for seed in (3, 4, 5):
        _call(compiled, seed)
    assert (ev.python_reads, ev.rearms) == (reads + 1, rearms + 1)
    assert ev.rearm_errors == 0
    assert len(compiled.specializations) == 1


def test_a_change_inside_the_object_set_again_compiles_again(settings: Any) -> None:
    compiled = plait.compile(_program)
    _call(compiled, 1)
    fresh = list(settings["names"])
    settings["names"] = fresh
    _call(compiled, 2)
    assert _evaluator(compiled).rearms == 1
    fresh.append("d")  # NOTE: only the re-armed check (of the new list) sees this
    _call(compiled, 3)
    assert len(compiled.specializations) == 2


def test_an_unequal_object_compiles_again_and_is_not_re_armed(settings: Any) -> None:
    compiled = plait.compile(_program)
    _call(compiled, 1)
    ev = _evaluator(compiled)
    settings["shift"] = -settings["shift"]
    _call(compiled, 2)
    assert ev.rearms == 0
    assert len(compiled.specializations) == 2
    settings["shift"] = -settings["shift"]  # NOTE: back to the captured value
    _call(compiled, 3)
    assert len(compiled.specializations) == 2


def test_the_re_armed_check_agrees_with_the_python_read(settings: Any) -> None:
    compiled = plait.compile(_program)
    _call(compiled, 1)
    settings["names"] = list(settings["names"])
    _call(compiled, 2)
    (spec,) = compiled.specializations
    eng = compiled._plait
    tree, leaves, _ = eng.adapter.flatten((randn(3, 4, seed=4),), {})
    env = GuardEnv(tree, leaves, eng.fn, eng.fetch())
    assert spec.guards.holds(env) and spec.guards.holds_python(env)
    settings["names"][0] = "z"  # NOTE: equal length, another value: the key changes
    assert not spec.guards.holds(env) and not spec.guards.holds_python(env)


def test_threads_calling_while_another_sets_equal_objects_again(settings: Any) -> None:
    # NOTE: a re-arm installs new checks while other threads' runs hold the old ones
    compiled = plait.compile(_program)
    _call(compiled, 1)
    errors: list[BaseException] = []

    def calls(seed: int) -> None:
        try:
            for k in range(40):
                _call(compiled, seed * 100 + k)
        except BaseException as exc:  # NOTE: reported by the main thread
            errors.append(exc)

    def sets() -> None:
        for _ in range(200):
            settings["names"] = list(settings["names"])

    workers = [threading.Thread(target=calls, args=(s,)) for s in range(3)]
    workers.append(threading.Thread(target=sets))
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    assert _evaluator(compiled).rearm_errors == 0
    assert len(compiled.specializations) == 1


def test_objects_set_again_at_every_call_stop_the_re_arms(settings: Any) -> None:
    # NOTE: each re-arm costs about a read again: after four in a row, with no call held
    # natively between them, the guard reads in Python alone, as it did without re-arms
    compiled = plait.compile(_program)
    _call(compiled, 1)
    ev = _evaluator(compiled)
    reads = ev.python_reads
    for seed in range(2, 10):
        settings["names"] = list(settings["names"])
        _call(compiled, seed)
    assert ev.rearms == 4
    assert ev.python_reads == reads + 8
    _call(compiled, 10)  # NOTE: not re-armed since the fourth: the Python read decides
    assert (ev.python_reads, ev.rearms) == (reads + 9, 4)
    # NOTE: the writes stop; a read every 64 tries a re-arm, and the calls after it hold natively
    for seed in range(11, 11 + 64):
        _call(compiled, seed)
    assert ev.rearms == 5
    before = ev.python_reads
    for seed in range(100, 104):
        _call(compiled, seed)
    assert ev.python_reads == before
    assert len(compiled.specializations) == 1
