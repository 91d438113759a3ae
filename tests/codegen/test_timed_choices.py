"""Library choices made by timing are remembered per machine (``plait.codegen.timed_choices``):
a later compile of the same call, in this process or another, replays the first decision instead
of timing again, so compiles of one program on one machine compute the same bits."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.codegen import timed_choices, timed_matmul
from plait.codegen.onednn_postops import mkl_linear_available

KEY = ("timed", "MKL's packed GEMM", ("linear", "(8, 4)"))


def test_a_second_store_on_the_same_directory_replays_without_measuring(tmp_path: Path) -> None:
    first = timed_choices.TimedChoices(tmp_path)
    assert first.decide(KEY, lambda: "MKL was faster") == "MKL was faster"
    other_process = timed_choices.TimedChoices(tmp_path)
    assert other_process.decide(KEY, lambda: pytest.fail("measured again")) == "MKL was faster"


def test_of_two_deciding_at_once_the_first_written_wins(tmp_path: Path) -> None:
    a, b = timed_choices.TimedChoices(tmp_path), timed_choices.TimedChoices(tmp_path)
    assert a.decide(KEY, lambda: None) is None
    # NOTE: b measured before it saw a's file (its memory is empty): it adopts a's decision
    assert b._write(b._digest(KEY), "MKL was faster") is None


def test_a_corrupt_file_is_measured_again(tmp_path: Path) -> None:
    store = timed_choices.TimedChoices(tmp_path)
    store.decide(KEY, lambda: None)
    (path,) = tmp_path.glob("*/*.json")
    path.write_text("{not json")
    assert timed_choices.TimedChoices(tmp_path).decide(KEY, lambda: "again") == "again"


def test_a_damaged_file_is_passed_over_alike_by_every_process(tmp_path: Path) -> None:
    """A decision's file left damaged (a crash between its link and its data reaching the disk)
    is never replaced: the next decision goes beside it, first written wins there, and every
    later process reads that one instead of timing again."""
    timed_choices.TimedChoices(tmp_path).decide(KEY, lambda: None)
    (path,) = tmp_path.glob("*/*.json")
    path.write_text("")
    first, second = timed_choices.TimedChoices(tmp_path), timed_choices.TimedChoices(tmp_path)

    def measure() -> str:
        # NOTE: the second process decides while the first measures
        assert second.decide(KEY, lambda: "decided meanwhile") == "decided meanwhile"
        return "measured here"

    assert first.decide(KEY, measure) == "decided meanwhile"
    later = timed_choices.TimedChoices(tmp_path)
    assert later.decide(KEY, lambda: pytest.fail("measured again")) == "decided meanwhile"


@pytest.mark.parametrize("on_disk", [True, False], ids=["cache", "no-cache"])
def test_in_one_process_the_first_decision_remembered_wins(tmp_path: Path, on_disk: bool) -> None:
    """Two compiles of one call timing it at once (another thread's decision lands while this
    one measures): both get the first decision, with or without a writable cache."""
    store = timed_choices.TimedChoices(tmp_path if on_disk else None)

    def measure() -> str:
        assert store.decide(KEY, lambda: "decided meanwhile") == "decided meanwhile"
        return "measured here"

    assert store.decide(KEY, measure) == "decided meanwhile"
    assert store.decide(KEY, lambda: pytest.fail("measured again")) == "decided meanwhile"


def _plant(path: Path, what: str, elsewhere: Path) -> None:
    """Something other than a small regular JSON file where a decision's file goes."""
    if what == "deeply nested":
        path.write_text("[" * 100_000)
    elif what == "oversized":
        path.write_text(json.dumps({"refused": "x" * (1 << 20)}))
    elif what == "symlink":
        elsewhere.write_text(json.dumps({"refused": "planted elsewhere"}))
        path.symlink_to(elsewhere)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("what", ["deeply nested", "oversized", "symlink", "fifo"])
def test_a_file_that_is_not_a_small_regular_json_file_is_measured_again(
    tmp_path: Path, what: str
) -> None:
    """Never a crash, a hang (a FIFO opened for reading waits for a writer) or a decision read
    through a link or from a file no decision makes."""
    store = timed_choices.TimedChoices(tmp_path / "timed")
    path = next(store._slots(store._digest(KEY)))
    path.parent.mkdir(parents=True)
    _plant(path, what, tmp_path / "elsewhere.json")
    got: list[object] = []
    worker = threading.Thread(
        target=lambda: got.append(store.decide(KEY, lambda: "measured")), daemon=True
    )
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive() and what == "fifo":
        # NOTE: let the blocked reader go (it reads an empty file) before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert got == ["measured"], what


def test_another_thread_count_is_another_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = timed_choices.TimedChoices(tmp_path)
    store.decide(KEY, lambda: None)
    *same, threads = timed_choices.machine()
    monkeypatch.setattr(timed_choices, "machine", lambda: (*same, str(int(threads) + 1)))
    assert store.decide(KEY, lambda: "timed at another thread count") is not None


def test_another_library_instruction_set_is_another_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN and MKL pick their kernels by what the environment lets them use: a decision
    timed under one setting is not the other's."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    store = timed_choices.TimedChoices(tmp_path)
    store.decide(KEY, lambda: None)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert store.decide(KEY, lambda: "timed with oneDNN narrowed") is not None


@pytest.mark.skipif(
    not timed_matmul.strict_float32() or not mkl_linear_available(),
    reason="no timed choice of float32 linears here (no MKL packed linear)",
)
def test_a_second_compile_replays_the_first_ones_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[Any] = []
    real = timed_matmul.timings

    def counted(*args: Any) -> tuple[float, float]:
        measured.append(args)
        return real(*args)

    monkeypatch.setattr(timed_matmul, "timings", counted)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(5))
    options = {"cache": False}
    with torch.no_grad():
        first = plait.compile(model, backend="stax", options=options)(x)
        timed = len(measured)
        second = plait.compile(model, backend="stax", options=options)(x)
    assert timed > 0
    assert len(measured) == timed  # NOTE: nothing timed the second time
    assert torch.equal(first, second)  # NOTE: the same libraries: the same bits


def _linear_details(manifest: Any) -> list[str]:
    nodes = manifest.executor["evidence"]["nodes"]
    return [n["detail"] for n in nodes if n["op"] == "linear"]


@pytest.mark.skipif(
    not timed_matmul.strict_float32() or not mkl_linear_available(),
    reason="no timed choice of float32 linears here (no MKL packed linear)",
)
def test_an_artifact_loads_with_the_exporting_compiles_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded where nothing is remembered and timing would pick the other library, the
    program runs the libraries the artifact's references were computed with."""
    model, path = _exported_where_onednn_won(tmp_path, monkeypatch)
    monkeypatch.setattr(timed_matmul, "timings", lambda *a: (2e-6, 1e-6))  # NOTE: MKL would win
    loaded, fresh_x = _loaded(path)
    details = _linear_details(loaded.builds[-1].manifest)
    assert details and all(d.startswith("oneDNN") for d in details), details
    assert plait.verify(path).ok
    # NOTE: what a compile here picks without the artifact's choices: the other library
    with torch.no_grad():
        plain = plait.compile(model, backend="stax", options={"cache": False})
        plain(fresh_x)
    mine = _linear_details(plain.specializations[-1].manifest)
    assert mine and all(d.startswith("MKL") for d in mine), mine


def _exported_where_onednn_won(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[nn.Module, str]:
    """A small MLP exported where timing chose oneDNN for its linears, and a fresh store of
    timed choices (another machine's cache) for what follows."""
    monkeypatch.setattr(timed_matmul, "timings", lambda *a: (1e-6, 2e-6))  # NOTE: oneDNN wins
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(5))
    path = plait.export(model, (x,), native=False).save(str(tmp_path / "model.plait"))
    fresh = timed_choices.TimedChoices(tmp_path / "another-cache")
    monkeypatch.setattr(timed_choices, "store", lambda: fresh)
    return model, path


def _loaded(path: str) -> tuple[Any, torch.Tensor]:
    """The artifact at ``path`` loaded and called once on a fresh draw (its plan made here)."""
    loaded = plait.load(path)
    fresh_x = torch.randn(16, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        loaded(fresh_x)
    return loaded, fresh_x


@pytest.mark.skipif(
    not timed_matmul.strict_float32() or not mkl_linear_available(),
    reason="no timed choice of float32 linears here (no MKL packed linear)",
)
def test_an_artifact_loaded_on_another_machine_times_its_calls_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporting machine's choices are for that machine (its CPU, PyTorch, thread count):
    loaded at another thread count, the calls are timed where they run, and the program is
    still judged within the contract against the artifact's references."""
    _, path = _exported_where_onednn_won(tmp_path, monkeypatch)
    *same, threads = timed_choices.machine()
    monkeypatch.setattr(timed_choices, "machine", lambda: (*same, str(int(threads) + 1)))
    monkeypatch.setattr(timed_matmul, "timings", lambda *a: (2e-6, 1e-6))  # NOTE: MKL wins here
    loaded, _ = _loaded(path)
    details = _linear_details(loaded.builds[-1].manifest)
    assert details and all(d.startswith("MKL") for d in details), details
    assert plait.verify(path).ok
