"""Small models and helpers for the artifact cache tests (each test uses its own cache dir)."""

from __future__ import annotations

import itertools
import os
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.cache import LocalStore
from plait.cache import store as store_mod


class ConvNet(nn.Module):
    """Conv + BN + ReLU + a residual add + linear: frozen and folded under inference, native
    kernels (the pooling and the residual) under the training pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x)).relu()
        y = y + y.sigmoid()
        return self.head(y.mean(dim=(2, 3)))


def convnet(seed: int = 0) -> ConvNet:
    torch.manual_seed(seed)
    return ConvNet().eval()


def sample(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def run(
    model: Any, x: Any, cache: Path | str | bool, **kwargs: Any
) -> tuple[torch.Tensor, plait.api.Specialization]:
    options = {
        "cache": str(cache) if isinstance(cache, Path) else cache,
        "warm_start": "fingerprint",
    }
    options.update(kwargs.pop("options", {}))
    compiled = plait.compile(model, options=options, **kwargs)
    with torch.no_grad():
        out = compiled(x)
    return out, compiled.specializations[-1]


def status(spec: Any) -> str:
    return str(spec.manifest.cache.get("status"))


def artifact_entries(store: Any) -> list[Any]:
    """The compiled artifacts among ``store``'s entries (snapshots and records left out: a
    compile also writes a first-run hint, plait.speculative_run)."""
    return [e for e in store.list() if "kind" not in e.meta]


def stax_entry(cache: Path) -> tuple[LocalStore, str]:
    """The store at ``cache`` and the key of its one Stax artifact entry."""
    store = LocalStore(cache)
    (entry,) = [e for e in store.list() if e.meta.get("executor") == "stax"]
    return store, entry.key


def call_program(program: Any, x: torch.Tensor) -> torch.Tensor:
    """Run a Stax program on ``x`` with its graph's constants (one output)."""
    graph = program.graph
    args = [x if v.kind == "user" else graph.constants[v.name] for v in graph.inputs]
    with torch.no_grad():
        (y,) = program(*args)
    return y


def store_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's clock as a counter, a second per reading: the time a write records and the
    mtime a read sets (``os.utime(path)``) both advance on every use, and start after anything
    written for real, so the order of entries never rests on the timer's resolution."""
    ticks = itertools.count(int(time.time()) + 3600)
    real_utime = os.utime

    def utime(path: Any, times: Any = None, **kwargs: Any) -> None:
        if times is None and "ns" not in kwargs:
            now = float(next(ticks))
            times = (now, now)
        real_utime(path, times, **kwargs)

    clock = types.SimpleNamespace(time=lambda: float(next(ticks)))
    monkeypatch.setattr(store_mod, "time", clock)
    monkeypatch.setattr(store_mod, "os", _OsWith(utime))


class _OsWith(types.ModuleType):
    """``os`` as the store sees it, with its own ``utime``."""

    def __init__(self, utime: Any) -> None:
        super().__init__("os")
        self.utime = utime

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)
