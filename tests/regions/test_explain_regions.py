"""What ``plait.explain`` and the manifest say of a module compiled in regions: every region,
every boundary with its capture error and source line, and the share of ops run compiled."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning
from plait.manifest import Manifest
from tests.regions import models
from tests.regions.models import line_of

TOL = plait.contract.load().tolerance("model", torch.float32)
MODELS = models.__file__


def _x(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _compiled(model: nn.Module, x: torch.Tensor, **options: Any) -> Any:
    """``model`` compiled and called three times on ``x``: a refused call goes on eagerly, so
    the root's regions compile on the second call (mid's capture is refused in turn) and mid's
    own regions on the third."""
    cm = plait.compile(model, options={"cache": False, **options})
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning):
        for _ in range(3):
            cm(x)
    return cm


def test_explain_says_when_the_regions_are_still_to_compile() -> None:
    torch.manual_seed(0)
    model = models.ChildBranchModel().eval()
    cm = plait.compile(model, options={"cache": False})
    x = _x(4, 6, seed=1)
    pending = []
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning):
        for _ in range(3):
            torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
            report = plait.explain(cm).regions
            assert report is not None
            statuses = {r["module"]: r["status"] for r in report["regions"]}
            pending.append((report["pending"], statuses))
    split = {"pre": "compiled", "mid": "split", "post": "compiled"}
    assert pending == [
        ([""], {}),  # NOTE: the refused call went on eagerly: its regions come next call
        (["mid"], split),  # NOTE: so did mid's, its capture refused on the second
        ([], split | {"mid.up": "compiled", "mid.down": "compiled"}),
    ]
    text = str(plait.explain(cm))
    assert "regions of" not in text and "mid.up [Linear]: compiled (stax)" in text
    fresh = plait.compile(model, options={"cache": False})
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning):
        fresh(x)
    text = str(plait.explain(fresh))
    assert "regions of <root>: captured and compiled from its next call" in text
    boundaries = plait.explain(fresh).regions["boundaries"]
    assert [(b["module"], b["line"]) for b in boundaries] == [("", line_of(MODELS, "child"))]


def test_explain_lists_regions_boundaries_and_the_compiled_share() -> None:
    torch.manual_seed(0)
    model = models.ChildBranchModel().eval()
    cm = _compiled(model, _x(4, 6, seed=1))
    explanation = plait.explain(cm)
    report = explanation.regions
    assert report is not None
    regions = {r["module"]: r for r in report["regions"]}
    assert {m: r["status"] for m, r in regions.items()} == {
        "pre": "compiled",
        "mid": "split",
        "mid.up": "compiled",
        "mid.down": "compiled",
        "post": "compiled",
    }
    assert regions["pre"]["backends"] == ["stax"] and regions["mid"]["backends"] == []
    # NOTE: IR nodes of each compiled region (as captured), ATen ops of the eager parts
    graphs = {e.path: e.specializations[0].graph for e in cm._plait.tree.order}
    for path in ("pre", "mid.up", "mid.down", "post"):
        assert regions[path]["compiled_ops"] == len(graphs[path].nodes)
    assert regions["mid"]["eager_ops"] > 0  # NOTE: mid's max, gt, the bool read and tanh
    ops = report["ops"]
    assert ops["measured"]
    assert ops["compiled"] == sum(r["compiled_ops"] for r in regions.values())
    assert ops["eager"] == regions["mid"]["eager_ops"] + ops["eager_in_root"]
    total = ops["compiled"] + ops["opaque"] + ops["eager"]
    assert ops["compiled_share"] == pytest.approx(ops["compiled"] / total)
    line = line_of(MODELS, "child")
    for b in report["boundaries"]:
        assert (b["file"], b["line"], b["operation"]) == (MODELS, line, "Tensor.__bool__")
        assert f"{MODELS}:{line}" in b["reason"]
    text = str(explanation)
    assert "regional compilation" in text and "ops run compiled" in text
    assert f"mid [BranchyChild]: {MODELS}:{line}: Tensor.__bool__" in text
    assert "mid.up [Linear]: compiled (stax)" in text
    json.dumps(explanation.to_json())  # NOTE: JSON values only


def test_the_manifest_says_regional_and_lists_the_regions() -> None:
    torch.manual_seed(0)
    model = models.ChildBranchModel().eval()
    cm = _compiled(model, _x(4, 6, seed=1))
    manifest = cm.specializations[0].manifest
    assert manifest.executor["backend"] == "regional"
    listed = [(r["module"], r["status"]) for r in manifest.executor["regions"]]
    assert listed == [
        ("pre", "compiled"),
        ("mid", "split"),
        ("mid.up", "compiled"),
        ("mid.down", "compiled"),
        ("post", "compiled"),
    ]
    assert [b["module"] for b in manifest.executor["boundaries"]] == ["", "mid"]
    again = Manifest.from_json(json.loads(manifest.dumps()))
    assert again.executor == manifest.executor
    assert "region mid.up [Linear]: compiled (stax)" in manifest.report()
    # NOTE: the split child's own fallback specialization lists its regions only
    mid = next(e for e in cm._plait.tree.order if e.path == "mid")
    sub = mid.specializations[0].manifest.executor
    assert [r["module"] for r in sub["regions"]] == ["mid.up", "mid.down"]


class _Holder:
    """An argument compared by identity (an object holding a tensor, as a key-value cache)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _TakesObject(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, holder: _Holder) -> torch.Tensor:
        out = self.inner(holder.t) * 2
        holder.t = out  # NOTE: a Python side effect on the argument, as cache.update makes
        return out


class _PassesObject(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = _TakesObject()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        holder = _Holder(x)
        y = self.child(holder)
        y = y + holder.t  # NOTE: reads what the child wrote
        return y if y.sum() > 0 else -y


def test_a_region_called_with_an_object_runs_split() -> None:
    torch.manual_seed(0)
    model = _PassesObject().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning) as record:
            for seed in range(2):  # NOTE: the regions compile from the call after the refusal
                x = _x(3, 4, seed=seed)
                torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
        assert any("a _Holder object" in str(w.message) for w in record)
        for seed in range(2, 5):
            x = _x(3, 4, seed=seed)
            torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
    report = plait.explain(cm).regions
    regions = {r["module"]: r for r in report["regions"]}
    assert regions["child"]["status"] == "split" and regions["child"]["specializations"] == 0
    assert regions["child.inner"]["status"] == "compiled"


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return self.inner(x) * scale


class _PassesNewValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = _Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(x, float(x.sum()))  # NOTE: a new Python value on each call


def test_a_region_past_its_recompile_limit_runs_eagerly_and_splits() -> None:
    torch.manual_seed(0)
    model = _PassesNewValues().eval()
    cm = plait.compile(model, options={"cache": False, "recompile_limit": 2})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            cm(_x(3, 4, seed=0))  # NOTE: refused, it goes on eagerly: the child compiles next
            cm(_x(3, 4, seed=1))
            cm(_x(3, 4, seed=2))
        with pytest.warns(CaptureFallbackWarning, match="region child .* recompile limit"):
            cm(_x(3, 4, seed=3))
        for seed in range(4, 7):
            x = _x(3, 4, seed=seed)
            torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
    report = plait.explain(cm).regions
    regions = {r["module"]: r for r in report["regions"]}
    assert regions["child"]["specializations"] == 2
    assert regions["child.inner"]["status"] == "compiled"
    (limit,) = [b for b in report["boundaries"] if b["module"] == "child"]
    assert "recompile limit" in limit["reason"]


class _NeedsMask(nn.Module):
    """Its forward pre-hook supplies an argument the call does not pass."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.register_forward_pre_hook(lambda mod, args: (args[0], torch.full((4,), 0.5)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * mask


def _fills_in_scale(fn: Any) -> Any:
    """A decorator that fills in a keyword itself (as Hugging Face's do with ``use_cache``)."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("scale", 2.0)
        return fn(self, *args, **kwargs)

    return wrapper


class _Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    @_fills_in_scale
    def forward(self, x: torch.Tensor, bias: float = 0.0, scale: float = 1.0) -> torch.Tensor:
        return self.inner(x) * scale + bias


class _CallsAsItPleases(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.masked = _NeedsMask()
        self.decorated = _Decorated()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.decorated(self.masked(x), bias=0.5)  # NOTE: the decorator adds scale=2.0
        y = self.decorated(y, 0.25, scale=3.0)
        return y if y.sum() > 0 else -y


def test_regions_are_called_exactly_as_their_parent_calls_them() -> None:
    torch.manual_seed(0)
    model = _CallsAsItPleases().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            cm(_x(3, 4, seed=0))
        for seed in range(1, 4):
            x = _x(3, 4, seed=seed)
            torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
    report = plait.explain(cm).regions
    regions = {r["module"]: r for r in report["regions"]}
    assert regions["masked"]["status"] == regions["decorated"]["status"] == "compiled"
    assert regions["decorated"]["specializations"] == 2  # NOTE: two ways of calling it
    assert [b["module"] for b in report["boundaries"]] == [""]


def test_regions_go_through_the_artifact_cache(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=2).eval()
    for run in ("cold", "warm"):
        cm = plait.compile(model, options={"cache": str(tmp_path)})
        with torch.no_grad(), pytest.warns(CaptureFallbackWarning):
            cm(_x(5, 8, seed=1))
        with torch.no_grad():
            cm(_x(5, 8, seed=1))  # NOTE: the regions compile from the call after the refusal
        engines = {e.path: e for e in cm._plait.tree.order}
        statuses = {
            p: e.specializations[0].manifest.cache.get("status") for p, e in engines.items()
        }
        expected = "miss" if run == "cold" else "hit"
        assert statuses == dict.fromkeys(["inp", "blocks.0", "blocks.1", "head"], expected)
        # NOTE: blocks.1 takes blocks.0's artifact in memory (its manifest with it)
        first, second = (engines[f"blocks.{k}"].specializations[0] for k in range(2))
        assert second.compiled is first.compiled


class _PlainTensorsOnly(nn.Module):
    """Refuses tensor subclasses (capture's tracer tensors): its capture raises, eager runs."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is not torch.Tensor:
            raise ValueError("plain tensors only")
        return self.inner(x)


class _CallsPicky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = _PlainTensorsOnly()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: the root's capture stops here, before the child's capture would raise
        x = x if x.sum() > 0 else -x
        return self.child(x)


def test_a_region_whose_capture_raises_runs_eagerly_and_splits() -> None:
    torch.manual_seed(0)
    model = _CallsPicky().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning) as record:
            for seed in range(2):  # NOTE: the child's capture runs on the second call
                x = _x(3, 4, seed=seed)
                torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
        assert any("ValueError: plain tensors only" in str(w.message) for w in record)
        for seed in range(2, 5):
            x = _x(3, 4, seed=seed)
            torch.testing.assert_close(cm(x), model(x), rtol=TOL.rtol, atol=TOL.atol)
    report = plait.explain(cm).regions
    assert {r["module"]: r["status"] for r in report["regions"]} == {
        "child": "split",
        "child.inner": "compiled",
    }
    (refused,) = [b for b in report["boundaries"] if b["module"] == "child"]
    assert "its capture or compile failed: ValueError" in refused["reason"]
