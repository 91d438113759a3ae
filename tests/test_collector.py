"""The cyclic collector is paused while plait captures and compiles, and left as it was:
running after a compile when it ran before, off when the program had turned it off, through
nested and overlapping pauses."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import plait
import plait.api
from plait.collector import collector_paused


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_a_compile_pauses_the_collector_and_resumes_it(
    collector_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    compile_program = plait.api.compile_program

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return compile_program(*args, **kwargs)

    monkeypatch.setattr(plait.api, "compile_program", recording)
    compiled = plait.compile(
        lambda x: torch.relu(x) * 2.0, backend="stax", options={"cache": False}
    )
    x = torch.randn(8)
    assert torch.equal(compiled(x), torch.relu(x) * 2.0)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off(collector_on: None) -> None:
    gc.disable()
    compiled = plait.compile(lambda x: x.sin() + 1.0, backend="stax", options={"cache": False})
    x = torch.randn(8)
    assert torch.equal(compiled(x), x.sin() + 1.0)
    assert not gc.isenabled()


def test_nested_and_overlapping_pauses_resume_once_at_the_last_end(collector_on: None) -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # NOTE: the other thread's pause has not ended
    release.set()
    thread.join(10)
    assert gc.isenabled()
