"""``plait.explain`` reports how a block's calls actually ran: a hook registered below a block
(here on ``blocks.1.fc1``, after the block compiled) makes the block's calls run split, its
Python eagerly and its submodules as regions; explain then lists it as split with the hook as
the reason, counts its ops as eager, and lists it as compiled again once the hook is removed.
What ran is observed independently: a profile function counts the runs of the block's Python
``forward`` (a compiled region runs none), and every answer is compared with eager on fresh
random inputs."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.regions import models
from tests.util import contract_tol

_SEED = iter(range(100, 200))


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(next(_SEED)))


@contextmanager
def _python_runs(block: torch.nn.Module) -> Iterator[list[int]]:
    """Counts the calls of ``block``'s own Python ``forward`` while active."""
    code = type(block).forward.__code__
    runs = [0]

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code and frame.f_locals.get("self") is block:
            runs[0] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield runs
    finally:
        sys.setprofile(previous)


def _call(cm: Any, model: torch.nn.Module) -> None:
    x = _x()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        got = cm(x)
        expected = model(x)
    torch.testing.assert_close(got, expected, **contract_tol("model", torch.float32))


def _regions(cm: Any) -> dict[str, dict[str, Any]]:
    report = plait.explain(cm).regions
    assert report is not None
    return {r["module"]: r for r in report["regions"]}


def _calls(cm: Any, model: torch.nn.Module, n: int, block: torch.nn.Module) -> int:
    """``n`` calls of the compiled model; how many times ``block``'s Python ran in them."""
    with _python_runs(block) as runs:
        for _ in range(n):
            x = _x()
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", CaptureFallbackWarning)
                got = cm(x)
            with torch.no_grad():
                expected = model(x)
            torch.testing.assert_close(got, expected, **contract_tol("model", torch.float32))
        # NOTE: the eager reference runs the block's Python once per call
        return runs[0] - n


def test_a_hook_below_a_compiled_block_is_reported_as_running_it_split() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent().eval()
    block = model.blocks[1]
    cm = plait.compile(model, options={"cache": False})
    _call(cm, model)  # NOTE: captures, falls back, compiles the regions
    assert _calls(cm, model, 2, block) == 0  # NOTE: compiled: its Python does not run
    before = _regions(cm)
    assert before["blocks.1"]["status"] == "compiled"
    assert before["blocks.1"]["compiled_ops"] > 0

    seen: list[int] = []
    handle = block.fc1.register_forward_hook(lambda m, a, out: seen.append(out.shape[0]))
    assert _calls(cm, model, 3, block) == 3  # NOTE: split: its Python runs on every call
    assert len(seen) == 3 + 3  # NOTE: the hook ran on each call, compiled and eager alike
    after = _regions(cm)
    hooked = after["blocks.1"]
    assert hooked["status"] == "split"
    assert "fc1 has hooks" in hooked["reason"]
    assert hooked["calls"]["split"] == 3
    # NOTE: the ops were measured again on a call that ran it split: none of its own compiled
    report = plait.explain(cm).regions
    assert report is not None and report["ops"]["measured"]
    assert hooked["compiled_ops"] == 0 and hooked["eager_ops"] > 0
    graphs = {e.path: e.specializations[-1].graph for e in cm._plait.tree.order}
    for path in ("blocks.0", "blocks.2", "blocks.1.fc1", "blocks.1.fc2", "blocks.1.norm"):
        assert after[path]["status"] == "compiled", path
        assert after[path]["compiled_ops"] == len(graphs[path].nodes), path
    assert after["blocks.0"]["reason"] is None
    assert any(b["module"] == "blocks.1" and "fc1 has hooks" in b["reason"]
               for b in report["boundaries"])  # fmt: skip
    text = str(plait.explain(cm))
    assert "blocks.1 [Block]: split (its submodule fc1 has hooks" in text

    handle.remove()
    assert _calls(cm, model, 2, block) == 0  # NOTE: compiled again
    again = _regions(cm)
    assert again["blocks.1"]["status"] == "compiled" and again["blocks.1"]["reason"] is None
    assert again["blocks.1"]["compiled_ops"] == before["blocks.1"]["compiled_ops"]
    report = plait.explain(cm).regions
    assert report is not None
    assert not any(b["module"] == "blocks.1" for b in report["boundaries"])


def test_a_hook_on_the_block_itself_leaves_its_forward_compiled() -> None:
    """``nn.Module.__call__`` runs the block's own hooks eagerly around its forward, which
    stays the compiled region: reported as compiled, and its Python does not run."""
    torch.manual_seed(0)
    model = models.BranchyParent().eval()
    block = model.blocks[1]
    cm = plait.compile(model, options={"cache": False})
    _call(cm, model)
    seen: list[int] = []
    block.register_forward_pre_hook(lambda m, a: seen.append(1))
    assert _calls(cm, model, 2, block) == 0
    assert len(seen) == 2 + 2
    regions = _regions(cm)
    assert regions["blocks.1"]["status"] == "compiled"
    assert regions["blocks.1"]["reason"] is None
