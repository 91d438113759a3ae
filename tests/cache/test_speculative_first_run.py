"""A warm start's first run overlapped with its capture (plait.speculative_run): the early result
is returned only when the captured program asks for the hinted artifact and reads the inputs the
early run read; a stale hint, an input written meanwhile, a corrupt artifact or a failed capture
each leave the call as it would be without the hint. Results against eager PyTorch on fresh
inputs, and bit for bit against the same artifact run after capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.api
import plait.cache.compiled
import plait.speculative_run
from plait.cache import LocalStore
from plait.cache.lookup import CacheWarning
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.cache.helpers import artifact_entries, convnet
from tests.util import assert_bitwise, contract_tol, torch_threads

ROOT = Path(__file__).resolve().parents[2]
DURING = "during capture (the hinted artifact)"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The early run needs a core the call's own intra-op threads leave free."""
    with torch_threads(1):
        yield


def _fresh(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def _call(model: nn.Module, cache: Path, x: torch.Tensor, **options: Any) -> tuple[Any, Any]:
    compiled = plait.compile(model, options={"cache": str(cache), **options})
    with torch.no_grad():
        out = compiled(x)
    return out, compiled.specializations[0].manifest.cache


def _eager(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


def _hints(cache: Path) -> list[dict[str, Any]]:
    store = LocalStore(cache)
    entries = [e for e in store.list() if e.meta.get("kind") == "first-run hint"]
    return [json.loads(store.get(e.key) or b"") for e in entries]


def test_a_warm_start_returns_the_early_run_which_is_the_artifacts_own_answer(
    tmp_path: Path,
) -> None:
    model = convnet()
    _, cold = _call(model, tmp_path, _fresh(1))
    assert cold["status"] == "miss" and "first run" not in cold
    (hint,) = _hints(tmp_path)
    assert hint["artifact"] == cold["key"]
    for seed in (2, 3):
        x = _fresh(seed)
        out, warm = _call(model, tmp_path, x)
        assert warm["status"] == "hit" and warm["first run"] == DURING, warm
        torch.testing.assert_close(out, _eager(model, x), **contract_tol("model", torch.float32))
        after, plain = _call(model, tmp_path, x, speculative=False)
        assert plain["status"] == "hit" and "first run" not in plain
        assert_bitwise(out, after, "the early run against the same artifact after capture")
    assert len(_hints(tmp_path)) == 1  # NOTE: a hint that holds is not written again


def test_a_hint_naming_another_programs_artifact_is_discarded_and_rewritten(
    tmp_path: Path,
) -> None:
    _call(convnet(seed=0), tmp_path, _fresh(1))
    other = convnet(seed=5)  # NOTE: other weights: the same front, another artifact key
    x = _fresh(2)
    out, first = _call(other, tmp_path, x)
    assert first["status"] == "miss"
    assert first["first run"].startswith("after capture: the captured program's key"), first
    torch.testing.assert_close(out, _eager(other, x), **contract_tol("model", torch.float32))
    (hint,) = _hints(tmp_path)
    assert hint["artifact"] == first["key"]
    _, again = _call(other, tmp_path, _fresh(3))
    assert again["first run"] == DURING


def test_an_input_written_while_the_early_run_read_it_runs_after_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = convnet()
    _call(model, tmp_path, _fresh(1))
    x = _fresh(2)
    capture = plait.api._Engine._capture

    def capture_then_write(self: Any, *args: Any) -> Any:
        out = capture(self, *args)
        x.mul_(-2.0)  # NOTE: between the early run's read and the call's own run
        return out

    monkeypatch.setattr(plait.api._Engine, "_capture", capture_then_write)
    out, cache = _call(model, tmp_path, x)
    assert cache["status"] == "hit"
    assert cache["first run"] == "after capture: an input was written while the early run read it"
    torch.testing.assert_close(out, _eager(model, x), **contract_tol("model", torch.float32))


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)  # NOTE: a write to state: its early run would write it twice
        return self.lin(x) * self.calls


class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_no_early_run_where_it_could_differ_from_the_calls_own(tmp_path: Path) -> None:
    counting = _Counting()
    with torch.no_grad():
        plait.compile(counting, options={"cache": str(tmp_path)})(torch.randn(3, 6))
    assert _hints(tmp_path) == []  # NOTE: a program that writes its state gets no hint
    model = convnet()
    _call(model, tmp_path, _fresh(1))
    compiled = plait.compile(model, options={"cache": str(tmp_path)})
    x = _fresh(2)
    with _Mode(), torch.no_grad(), pytest.warns(CaptureFallbackWarning, match="Mode"):
        out = compiled(x)
    assert compiled.specializations == []  # NOTE: a mode's call runs as written, uncompiled
    torch.testing.assert_close(out, _eager(model, x), **contract_tol("model", torch.float32))
    compiled = plait.compile(model, options={"cache": str(tmp_path)})
    compiled(x)  # NOTE: grad mode on: the hint's key differs, and none is read
    assert "first run" not in compiled.specializations[0].manifest.cache
    torch.set_num_threads(os.cpu_count() or 1)
    _, busy = _call(model, tmp_path, x)
    assert "first run" not in busy  # NOTE: no core left free by the call's own threads


def test_a_corrupt_hinted_artifact_is_reported_once_and_rebuilt(tmp_path: Path) -> None:
    model = convnet()
    _call(model, tmp_path, _fresh(1))
    store = LocalStore(tmp_path)
    (entry,) = artifact_entries(store)
    path = store.path(entry.key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    x = _fresh(2)
    with pytest.warns(CacheWarning, match="discarded") as caught:
        out, cache = _call(model, tmp_path, x)
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert cache["status"] == "miss"
    assert cache["first run"] == "after capture: the hinted artifact did not load"
    torch.testing.assert_close(out, _eager(model, x), **contract_tol("model", torch.float32))
    assert store.verify().ok


class _Branchy(nn.Module):
    branch = False

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.branch and y.sum() > 0:  # NOTE: data-dependent: fullgraph refuses it
            return -y
        return y


def test_a_capture_that_fails_leaves_no_early_run_behind(tmp_path: Path) -> None:
    model = _Branchy().eval()
    with torch.no_grad():
        plait.compile(model, options={"cache": str(tmp_path)})(torch.randn(3, 6))
    assert len(_hints(tmp_path)) == 1
    interval = sys.getswitchinterval()
    _Branchy.branch = True
    try:
        compiled = plait.compile(model, fullgraph=True, options={"cache": str(tmp_path)})
        with torch.no_grad(), pytest.raises(GraphCaptureError):
            compiled(torch.randn(3, 6))
    finally:
        _Branchy.branch = False
    assert sys.getswitchinterval() == interval
    assert not [t for t in threading.enumerate() if t.name == "plait-early-run"]


CHILD = """
import json, sys
import torch
import plait
from tests.cache.helpers import convnet
from tests.util import contract_tol
x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(int(sys.argv[1])))
model = convnet()
compiled = plait.compile(model)
with torch.no_grad():
    out = compiled(x)
    torch.testing.assert_close(out, model(x), **contract_tol("model", torch.float32))
cache = compiled.specializations[0].manifest.cache
print(json.dumps({"status": cache["status"], "first": cache.get("first run")}))
"""


@pytest.mark.slow
def test_a_new_process_runs_its_first_call_during_capture(tmp_path: Path) -> None:
    environ = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    results = []
    for seed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, seed], cwd=ROOT, env=environ, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert results[0] == {"status": "miss", "first": None}, results
    assert results[1] == {"status": "hit", "first": DURING}, results


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def _wait_for(done: Any) -> None:
    for _ in range(6000):
        if done():
            return
        threading.Event().wait(0.01)
    raise AssertionError("timed out")


def test_early_runs_of_calls_in_two_threads_restore_the_switch_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = convnet(), _Linear().eval()
    inputs = [_fresh(1), torch.randn(3, 6)]
    for model, x in zip((first, second), inputs):
        _call(model, tmp_path, x)
    gates = [threading.Event(), threading.Event()]
    pending = list(gates)
    executor = plait.speculative_run.stax_executor

    def gated(*args: Any) -> Any:
        execute, gate = executor(*args), pending.pop(0)

        def run(values: list[Any]) -> Any:
            assert gate.wait(60)
            return execute(values)

        return run

    monkeypatch.setattr(plait.speculative_run, "stax_executor", gated)
    interval = sys.getswitchinterval()
    compiled = [plait.compile(m, options={"cache": str(tmp_path)}) for m in (first, second)]
    outs: list[Any] = [None, None]

    def call(i: int) -> None:
        with torch.no_grad():
            outs[i] = compiled[i](inputs[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in (0, 1)]
    threads[0].start()  # NOTE: its early run waits; its call waits for it, past capture
    _wait_for(lambda: compiled[0].specializations)
    threads[1].start()  # NOTE: its early run starts while the first one is in flight
    _wait_for(lambda: compiled[1].specializations)
    for gate, thread in zip(gates, threads):
        gate.set()  # NOTE: the first early run ends first
        thread.join(60)
    assert sys.getswitchinterval() == interval
    for i, model in enumerate((first, second)):
        assert compiled[i].specializations[0].manifest.cache["first run"] == DURING
        torch.testing.assert_close(
            outs[i], _eager(model, inputs[i]), **contract_tol("model", torch.float32)
        )
    assert not plait.cache.compiled._AHEAD


class _MaybeReturnsItsList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.mode = "plain"

    def forward(self, xs: list[torch.Tensor]) -> Any:
        y = self.lin(xs[0])
        if self.mode == "returns":
            return y, xs
        if self.mode == "appends":
            xs.append("seen")  # NOTE: the same graph: no tensor is written
        return y


@pytest.mark.parametrize("mode", ["returns", "appends"])
def test_a_program_with_the_hinted_artifact_that_returns_or_writes_its_input_list(
    tmp_path: Path, mode: str
) -> None:
    model = _MaybeReturnsItsList().eval()
    with torch.no_grad():
        plait.compile(model, options={"cache": str(tmp_path)})([torch.randn(3, 6)])
    model.mode = mode  # NOTE: the same graph, so the same artifact: the hint's
    results, x = [], torch.randn(3, 6)
    for speculative in (True, False):
        xs = [x]
        compiled = plait.compile(
            model, options={"cache": str(tmp_path), "speculative": speculative}
        )
        with torch.no_grad():
            out = compiled(xs)
        cache = compiled.specializations[0].manifest.cache
        assert cache["status"] == "hit", (speculative, cache)
        assert cache.get("first run") == (DURING if speculative else None)
        expected = _eager(model.lin, xs[0])
        y = out[0] if mode == "returns" else out
        torch.testing.assert_close(y, expected, **contract_tol("model", torch.float32))
        if mode == "returns":
            assert out[1] is xs
        else:
            assert xs == [x, "seen"]
        results.append(y)
    assert_bitwise(results[0], results[1], "the early run against the run after capture")
    assert not plait.cache.compiled._AHEAD


class _Logged(torch.Tensor):
    threads: list[str] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.threads.append(threading.current_thread().name)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_input_gets_no_early_run(tmp_path: Path) -> None:
    model = _Linear().eval()
    # NOTE: the linear is PyTorch's call (plait's native kernel off), which hands the subclass
    # on as eager does: a native kernel's result is a plain tensor
    native_off = {"stax": {"pointwise": False}}
    _call(model, tmp_path, torch.randn(3, 6).as_subclass(_Logged), **native_off)
    x = torch.randn(3, 6).as_subclass(_Logged)
    _Logged.threads.clear()
    out, cache = _call(model, tmp_path, x, **native_off)
    # NOTE: its __torch_function__ is the user's Python: never run in another thread
    assert set(_Logged.threads) == {threading.current_thread().name}, set(_Logged.threads)
    assert cache["status"] == "hit" and "first run" not in cache
    assert type(out) is _Logged
    expected = _eager(model, x.as_subclass(torch.Tensor))
    torch.testing.assert_close(
        out.as_subclass(torch.Tensor), expected, **contract_tol("model", torch.float32)
    )


class _NoStart(threading.Thread):
    def start(self) -> None:
        if self.name == "plait-early-run":
            raise RuntimeError("can't start new thread")
        super().start()


def test_an_early_run_whose_thread_does_not_start_leaves_the_call_as_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = convnet()
    _call(model, tmp_path, _fresh(1))
    interval = sys.getswitchinterval()
    monkeypatch.setattr(threading, "Thread", _NoStart)
    x = _fresh(2)
    out, cache = _call(model, tmp_path, x)
    assert cache["status"] == "hit" and "first run" not in cache
    torch.testing.assert_close(out, _eager(model, x), **contract_tol("model", torch.float32))
    assert sys.getswitchinterval() == interval
    assert not plait.cache.compiled._AHEAD
