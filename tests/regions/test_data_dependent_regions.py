"""Regional compilation of modules whose call reads tensor data (``fullgraph=False``): the module's
Python runs eagerly and its largest capturable submodules run compiled, checked against eager on
fresh random inputs under the numerical contract."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.regions import models
from tests.regions.models import line_of

TOL = plait.contract.load().tolerance("model", torch.float32)
MODELS = models.__file__


def _close(got: Any, want: Any) -> None:
    torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


def _x(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _regions(cm: Any) -> dict[str, dict[str, Any]]:
    report = plait.explain(cm).regions
    assert report is not None
    return {r["module"]: r for r in report["regions"]}


def _slots_clear(model: torch.nn.Module) -> None:
    """Nothing of the dispatch stays on the user's modules once a call returned."""
    for name, m in model.named_modules():
        assert "_compiled_call_impl" not in m.__dict__, name
        assert "forward" not in m.__dict__, name


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_branch_in_the_parent_compiles_the_children(backend: str) -> None:
    torch.manual_seed(0)
    model = models.BranchyParent().eval()
    cm = plait.compile(model, backend=backend, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning, match="Tensor.__bool__"):
            _close(cm(_x(5, 8, seed=1)), model(_x(5, 8, seed=1)))
        # NOTE: the refused call went on eagerly: explain names the boundary and says the
        # regions come on the next call
        first = plait.explain(cm).regions
        assert first is not None and first["pending"] == [""] and first["regions"] == []
        assert [(b["module"], b["line"]) for b in first["boundaries"]] == [
            ("", line_of(MODELS, "parent"))
        ]
        for seed in range(2, 6):  # NOTE: both sides of the branch, no new warning
            x = _x(5, 8, seed=seed) + (seed % 2) * 3
            _close(cm(x), model(x))
    regions = _regions(cm)
    assert list(regions) == ["inp", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert not plait.explain(cm).regions["pending"]
    assert all(r["status"] == "compiled" for r in regions.values())
    assert all(r["backends"] == [backend] for r in regions.values())
    _slots_clear(model)
    # NOTE: the root itself: one specialization, run split; each region one of its own
    assert len(cm.specializations) == 1 and cm.specializations[0].executor is None
    assert cm.specializations[0].manifest.executor["backend"] == "regional"


def test_branch_in_a_child_compiles_the_grandchildren() -> None:
    torch.manual_seed(0)
    model = models.ChildBranchModel().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning) as record:
            _close(cm(_x(4, 6, seed=1)), model(_x(4, 6, seed=1)))
        for seed in range(2, 6):
            x = _x(4, 6, seed=seed) * seed
            _close(cm(x), model(x))
    branch = f"{MODELS}:{line_of(MODELS, 'child')}"
    assert any(branch in str(w.message) for w in record)
    regions = _regions(cm)
    assert regions["pre"]["status"] == "compiled"
    assert regions["mid"]["status"] == "split"
    assert regions["mid.up"]["status"] == regions["mid.down"]["status"] == "compiled"
    assert regions["post"]["status"] == "compiled"
    assert "pre.0" not in regions  # NOTE: the largest region: pre's children are inside it
    boundaries = plait.explain(cm).regions["boundaries"]
    assert [(b["module"], b["line"]) for b in boundaries] == [
        ("", line_of(MODELS, "child")),  # NOTE: the root's capture fails in the child's line
        ("mid", line_of(MODELS, "child")),
    ]
    _slots_clear(model)


def test_region_that_falls_back_on_a_later_call_is_split() -> None:
    torch.manual_seed(0)
    model = models.LateModel().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            _close(cm(_x(3, 8, seed=1)), model(_x(3, 8, seed=1)))
        # NOTE: the refused call went on eagerly: the regions compile from the next call on
        assert _regions(cm) == {}
        _close(cm(_x(3, 8, seed=2)), model(_x(3, 8, seed=2)))
        assert _regions(cm)["body"]["status"] == "compiled"
        with pytest.warns(CaptureFallbackWarning, match="Tensor.__bool__"):
            _close(cm(_x(6, 8, seed=2)), model(_x(6, 8, seed=2)))
        for seed in range(3, 7):
            for rows in (3, 6):
                x = _x(rows, 8, seed=seed)
                _close(cm(x), model(x))
    regions = _regions(cm)
    body = regions["body"]
    assert body["specializations"] == 2
    assert body["status"] == "compiled"  # NOTE: compiled for 3 rows, split for 6
    assert regions["body.a"]["status"] == regions["body.b"]["status"] == "compiled"
    lines = {b["line"] for b in plait.explain(cm).regions["boundaries"] if b["module"] == "body"}
    assert lines == {line_of(MODELS, "late")}


def test_keywords_python_values_and_a_submodule_called_several_times() -> None:
    torch.manual_seed(0)
    model = models.SharedUse().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            out = cm(_x(2, 8, seed=1))
        want = model(_x(2, 8, seed=1))
        assert out["steps"] == want["steps"] == 3
        _close(out["out"], want["out"])
        for seed in range(2, 5):
            x = _x(2, 8, seed=seed)
            _close(cm(x, steps=4)["out"], model(x, steps=4)["out"])
    shared = plait.explain(cm).regions
    regions = {r["module"]: r for r in shared["regions"]}
    # NOTE: one engine for the shared submodule, a specialization per (scale, act) it saw
    assert regions["shared"]["status"] == "compiled"
    assert regions["shared"]["specializations"] == 4
    _slots_clear(model)


def test_hooks_the_user_registered_still_run() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=2).eval()
    model.blocks[1].register_forward_hook(lambda mod, args, out: out * 3)
    model.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            cm(_x(3, 8, seed=1))
        for seed in range(2, 5):
            x = _x(3, 8, seed=seed)
            _close(cm(x), model(x))
    assert _regions(cm)["blocks.1"]["status"] == "compiled"


def test_concurrent_calls_get_eager_answers() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning):
        cm(_x(5, 8, seed=0))
    inputs = [_x(5, 8, seed=i) for i in range(1, 9)]
    results: list[Any] = [None] * len(inputs)
    barrier = threading.Barrier(len(inputs))

    def work(i: int) -> None:
        barrier.wait()
        with torch.no_grad():
            for _ in range(5):
                results[i] = cm(inputs[i])
                model.blocks[0](inputs[i][:, :0].new_zeros(5, 16))  # NOTE: a direct call

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with torch.no_grad():
        for x, got in zip(inputs, results):
            _close(got, model(x))
    _slots_clear(model)


def test_the_gate_judges_the_regional_program() -> None:
    torch.manual_seed(0)
    model = models.ChildBranchModel().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning) as record:
        # NOTE: each refused call goes on eagerly: the root's regions compile on the second
        # call (mid's capture refused in turn), mid's own on the third
        for _ in range(3):
            cm(_x(4, 6, seed=1))
    assert [w.message.args[0].split(":")[0] for w in record] == [
        "plait runs this program eagerly (fallback)",
        "plait runs region mid (BranchyChild) eagerly (fallback)",
    ]
    assert not plait.explain(cm).regions["pending"]
    with torch.no_grad():
        report = plait.conformance.check(model, cm, (_x(4, 6, seed=2),), candidate_module=model)
    assert report.ok, report


def test_fullgraph_still_raises_naming_the_line() -> None:
    model = models.ChildBranchModel().eval()
    cm = plait.compile(model, fullgraph=True, options={"cache": False})
    with torch.no_grad(), pytest.raises(GraphCaptureError) as info:
        cm(_x(4, 6, seed=1))
    assert info.value.filename == MODELS
    assert info.value.lineno == line_of(MODELS, "child")


def test_a_program_captured_whole_is_unchanged() -> None:
    model = models.Block(8).eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        _close(cm(_x(2, 8, seed=1)), model(_x(2, 8, seed=1)))
    assert plait.explain(cm).regions is None
    assert cm.specializations[0].executor is not None
