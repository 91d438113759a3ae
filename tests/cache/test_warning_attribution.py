"""A cache warning points at the user's call, however many frames PyTorch puts between it and
the cache: with a forward hook set, a fixed stack level attributed it to
``torch.nn.modules.module``, where a filter for PyTorch's own warnings (pytest's configuration
here ignores ``UserWarning`` from ``torch.*``) hid it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from plait.cache import LocalStore
from plait.cache.lookup import CacheWarning


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sigmoid() - 0.5


def _damage_artifact(cache: Path) -> None:
    store = LocalStore(cache)
    (entry,) = [e for e in store.list() if e.meta.get("kind") != "snapshot"]
    path = store.path(entry.key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("hook", ["none", "global", "module"])
def test_a_damaged_entry_is_warned_at_the_callers_line(tmp_path: Path, hook: str) -> None:
    torch.manual_seed(7)
    net = Net().eval()
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(8801))
    # NOTE: hooks run inside the program and are guarded (part of the key): both compiles run
    # under them, so the second looks up the damaged entry.
    handles = []
    if hook == "global":
        handles.append(nn.modules.module.register_module_forward_hook(lambda m, i, o: o))
    if hook == "module":
        handles.append(net.register_forward_hook(lambda m, i, o: o))
    try:
        with torch.no_grad():
            expected = net(x)
            first = plait.compile(
                net, backend="eager", options={"warm_start": "fingerprint", "cache": str(tmp_path)}
            )(x)
        assert torch.equal(first, expected)
        _damage_artifact(tmp_path)
        compiled = plait.compile(
            net, backend="eager", options={"warm_start": "fingerprint", "cache": str(tmp_path)}
        )
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            out = compiled(x)
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(out, expected)
    m = compiled.specializations[0].manifest
    assert m.cache["status"] == "miss" and "discarded" in m.cache["events"][0], m.cache
    (warned,) = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert "discarded" in str(warned.message)
    assert Path(warned.filename) == Path(__file__), (warned.filename, warned.lineno)
