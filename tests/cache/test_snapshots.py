"""Warm starts without capture (plait.cache.snapshots): a saved program is used only for the
program it was captured from. Each change of what the program depends on (its code, its
defaults, a module-level value it reads, a module attribute, the call) captures again, says why,
and answers like eager; what cannot be checked without capture is never snapshotted.

A new ``plait.compile`` of the same model in this process starts like a new process would: no
specialization, the artifact cache and its snapshots on disk."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.api
from plait.cache import LocalStore
from plait.cache.lookup import CacheWarning
from plait.frontend import InputAdapter, capture_program
from plait.frontend.guard_plan import GuardPlan, build_guards
from tests.cache.helpers import convnet, run, sample
from tests.util import contract_tol

# NOTE: the contract's rows, none wider than what these tests held the answers to before: matmul
# (the models are linear layers and a conv; the conv row is wider), pointwise where the linear
# model's answer was held to an atol of 1e-6. Warm answers were measured within 2 ulps of eager's.
SOURCE = """
import torch
from torch import nn

SCALE = {scale}


def helper(y, k={k}):
    return y * k


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 5)
        self.shift = 0.5

    def forward(self, x):
        return helper(self.lin(x).relu() * SCALE + self.shift)
"""


@pytest.fixture
def user_module(tmp_path: Path) -> Iterator[Any]:
    """A model defined in a module file of its own, which a test may rewrite and reload."""
    name = f"plait_snapshot_model_{tmp_path.name.replace('-', '_')}"
    path = tmp_path / f"{name}.py"

    def write(scale: float = 2.0, k: float = 3.0) -> Any:
        path.write_text(SOURCE.format(scale=scale, k=k))
        importlib.invalidate_caches()
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        return importlib.import_module(name)

    sys.path.insert(0, str(tmp_path))
    try:
        yield write
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def _fresh(seed: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))


def _call(model: nn.Module, cache: Path) -> tuple[torch.Tensor, Any]:
    out, spec = run(model, _fresh(7), cache)
    with torch.no_grad():
        expected = model(_fresh(7))
    torch.testing.assert_close(out, expected, **contract_tol("pointwise", torch.float32))
    return out, spec


def _capture_note(spec: Any) -> str:
    return str(spec.manifest.cache["capture"])


def _no_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("captured although a snapshot holds")

    monkeypatch.setattr(plait.api, "capture_program", refuse)


def test_second_compile_uses_the_snapshot_and_captures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = convnet()
    _, cold = run(model, sample(), tmp_path)
    assert _capture_note(cold).startswith("captured: no snapshot") and "saved" in _capture_note(
        cold
    )
    _no_capture(monkeypatch)
    x = sample(seed=11)  # NOTE: fresh values, same signature
    out, warm = run(model, x, tmp_path)
    assert _capture_note(warm).startswith("snapshot"), _capture_note(warm)
    assert warm.manifest.cache["status"] == "hit"
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **contract_tol("matmul", torch.float32))
    assert warm.program.guards.key_texts() == cold.program.guards.key_texts()
    assert sorted(warm.guards.key_texts()) == sorted(cold.guards.key_texts())
    assert warm.semantic_hash == cold.semantic_hash


def test_changed_code_is_captured_again(tmp_path: Path, user_module: Any) -> None:
    mod = user_module()
    torch.manual_seed(0)
    model = mod.Net().eval()
    _call(model, tmp_path / "c")
    _, warm = _call(model, tmp_path / "c")
    assert _capture_note(warm).startswith("snapshot")
    state = model.state_dict()
    mod = user_module(k=5.0)  # NOTE: the helper's default changes; the class does not
    model = mod.Net().eval()
    model.load_state_dict(state)
    _, spec = _call(model, tmp_path / "c")
    assert "helper changed since the capture" in _capture_note(spec), _capture_note(spec)


def test_changed_global_is_captured_again(tmp_path: Path, user_module: Any) -> None:
    mod = user_module()
    model = mod.Net().eval()
    _call(model, tmp_path / "c")
    mod.SCALE = -1.0  # NOTE: a module-level value the forward reads
    _, spec = _call(model, tmp_path / "c")
    assert "Net.forward changed since the capture" in _capture_note(spec), _capture_note(spec)


def test_changed_attribute_or_call_misses_the_snapshot(tmp_path: Path, user_module: Any) -> None:
    mod = user_module()
    model = mod.Net().eval()
    _call(model, tmp_path / "c")
    model.shift = 1.5
    _, spec = _call(model, tmp_path / "c")
    assert _capture_note(spec).startswith("captured: no snapshot"), _capture_note(spec)
    x = torch.randn(3, 6)
    out, spec = run(model, x, tmp_path / "c")
    assert _capture_note(spec).startswith("captured: no snapshot")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **contract_tol("pointwise", torch.float32))
    model.train()
    _, spec = _call(model, tmp_path / "c")
    assert _capture_note(spec).startswith("captured: no snapshot")


def test_what_cannot_be_checked_is_never_snapshotted(tmp_path: Path) -> None:
    f = plait.compile(
        lambda x: x * 2 + 1, options={"warm_start": "fingerprint", "cache": str(tmp_path)}
    )
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x * 2 + 1)
    assert "no name to find it again" in _capture_note(f.specializations[0])

    model = convnet()
    model.conv.register_forward_hook(lambda m, i, o: o * 2)
    out, spec = run(model, sample(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(out, model(sample()), **contract_tol("matmul", torch.float32))
    assert "has hooks (_forward_hooks)" in _capture_note(spec)
    assert not any(e.meta.get("kind") == "snapshot" for e in LocalStore(tmp_path).list())


def test_a_corrupt_snapshot_is_discarded_and_captured_again(tmp_path: Path) -> None:
    model = convnet()
    run(model, sample(), tmp_path)
    store = LocalStore(tmp_path)
    (snap,) = [e for e in store.list() if e.meta.get("kind") == "snapshot"]
    path = store.path(snap.key)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="discarded"):  # NOTE: warned, as artifact entries are
        out, spec = run(model, sample(seed=3), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(
            out, model(sample(seed=3)), **contract_tol("matmul", torch.float32)
        )
    assert "discarded" in _capture_note(spec), _capture_note(spec)


def _programs() -> list[tuple[str, Any, tuple, bool]]:
    def branchy(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.relu() * n if x.shape[0] > 2 else x.sigmoid()

    def writes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * y

    def layout(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.is_contiguous() else x + 1

    def nested(d: dict) -> tuple:
        return d["a"] @ d["b"], [d["a"].sum()]

    return [
        ("branchy", branchy, (torch.randn(4, 3), 3), False),
        ("dynamic", branchy, (torch.randn(5, 3), 2), True),
        ("writes", writes, (torch.randn(3), torch.randn(3)), False),
        ("layout", layout, (torch.randn(4, 4).t(),), False),
        ("nested", nested, ({"a": torch.randn(2, 3), "b": torch.randn(3, 2)},), False),
        ("module", convnet(), (sample(),), False),
    ]


@pytest.mark.parametrize("name,fn,args,dynamic", _programs(), ids=[p[0] for p in _programs()])
def test_guard_plan_rebuilds_capture_guards(name: str, fn: Any, args: tuple, dynamic: bool) -> None:
    """The plan's JSON round trip and a rebuild for the same call give capture's guards."""
    from plait.frontend import ModuleState

    prog = capture_program(fn, args, dynamic=dynamic)
    plan = GuardPlan.from_json(prog.guard_plan.to_json())
    spec, leaves, paths = InputAdapter(fn).flatten(args, {})
    ms = ModuleState(fn) if isinstance(fn, nn.Module) else None
    rebuilt = build_guards(plan, spec, leaves, paths, ms, ms.fetch() if ms else ())
    assert rebuilt.key_texts() == prog.guards.key_texts()
    assert rebuilt.texts() == prog.guards.texts()


def test_a_collection_during_capture_does_not_count_as_program_code(tmp_path: Path) -> None:
    """A gc callback (hypothesis installs one) or the __del__ of unrelated garbage may run in
    the middle of a capture: not the program's code, and not a reason to refuse a snapshot."""
    import gc

    ran: list[str] = []

    def callback(phase: str, info: dict) -> None:
        ran.append(phase)

    class Cycle:
        def __del__(self) -> None:
            ran.append("del")

    def garbage() -> None:
        for _ in range(2000):
            c = Cycle()
            c.me = c  # type: ignore[attr-defined]

    gc.callbacks.append(callback)
    try:
        garbage()
        model = convnet()
        out, spec = run(model, sample(), tmp_path)
        assert _capture_note(spec).endswith("saved"), _capture_note(spec)
        gc.collect()
        assert "del" in ran and "start" in ran  # NOTE: the garbage was there to collect
    finally:
        gc.callbacks.remove(callback)
    with torch.no_grad():
        torch.testing.assert_close(out, model(sample()), **contract_tol("matmul", torch.float32))
