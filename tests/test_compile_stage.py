"""The compile stage: pass pipelines, freezing guarded by identity and version, manifests that
are deterministic and complete, plait.explain, and recorded (never silent) fallbacks."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import plait
import plait.conformance
import plait.contract
from plait.errors import CaptureFallbackWarning

pytestmark = pytest.mark.filterwarnings("ignore::plait.errors.CaptureFallbackWarning")


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean((2, 3)))


def convbn(seed: int = 0) -> ConvBN:
    torch.manual_seed(seed)
    m = ConvBN()
    with torch.no_grad():  # non-trivial running statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def factory(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed)),)


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_frozen_weight_changed_in_place_recompiles_and_matches_eager(backend: str) -> None:
    model = convbn()
    compiled = plait.compile(model, backend=backend, options={"passes": "inference"})
    with torch.no_grad():
        compiled(*factory(1))
        manifest = compiled.specializations[0].manifest
        assert "conv.weight" in manifest.graph["frozen"]
        assert any(r["rule"] == "fold-bn.conv" for p in manifest.passes for r in p["rewrites"])
        model.conv.weight.mul_(1.5)  # in place: same tensor, new version
        x = factory(2)[0]
        got = compiled(x)
        expected = model(x)
    assert len(compiled.specializations) == 2
    reason = compiled.recompile_reasons[0]
    assert "conv.weight is the frozen tensor" in reason and "version" in reason
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda t: compiled(t), factory, candidate_module=model
        )
    assert report.ok, str(report)
    assert got.shape == expected.shape


def test_unchanged_weights_never_recompile() -> None:
    model = convbn()
    compiled = plait.compile(model, backend="stax")
    with torch.no_grad():
        for seed in range(3):
            compiled(*factory(seed))
    assert len(compiled.specializations) == 1 and not compiled.recompile_reasons


def _manifest_json(seed: int) -> dict:
    model = convbn(seed)
    compiled = plait.compile(model, backend="stax")
    with torch.no_grad():
        compiled(*factory(0))
    return compiled.specializations[0].manifest.deterministic()


def test_manifest_is_deterministic_in_process_and_across_processes() -> None:
    first = _manifest_json(0)
    assert json.dumps(first, sort_keys=True, default=str) == json.dumps(
        _manifest_json(0), sort_keys=True, default=str
    )
    code = (
        "import json, warnings; warnings.simplefilter('ignore');"
        "from tests.test_compile_stage import _manifest_json;"
        "print(json.dumps(_manifest_json(0), sort_keys=True, default=str))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == json.dumps(first, sort_keys=True, default=str)
    # weights are not part of the program's identity: another seed, the same manifest
    assert _manifest_json(1)["source_hash"] == first["source_hash"]


def test_manifest_is_complete() -> None:
    m = _manifest_json(0)
    assert len(m["source_hash"]) == 64
    assert {"python", "torch", "plait", "cpu", "cxx"} <= set(m["toolchain"])
    assert [p["name"] for p in m["passes"]][:2] == ["canonicalize", "simplify"]
    assert m["guards"] and m["executor"]["evidence"]["counts"]["native"] > 0
    assert m["kernels"]["kernels"], "kernel choices are recorded"
    assert "timings" not in m


def test_explain_reports_specializations() -> None:
    f = plait.compile(lambda x: x.relu() if x.shape[0] > 2 else x.sigmoid(), backend="eager")
    f(torch.randn(4, 3))
    f(torch.randn(1, 3))
    report = plait.explain(f)
    assert [s.reason is None for s in report.specializations] == [True, False]
    text = str(report)
    assert "2 specialization(s)" in text and "x.shape[0] > 2" in text
    json.dumps(report.to_json(), default=str)
    with pytest.raises(TypeError, match=r"expects what plait\.compile returned"):
        plait.explain(lambda x: x)


def test_stax_with_gradients_compiles_the_backward() -> None:
    model = convbn().train()
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, backend="stax")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)  # NOTE: nothing falls back
        out = compiled(*factory(0))
    out.sum().backward()
    reference(*factory(0)).sum().backward()
    tol = plait.contract.load().tolerance("model", "float32")
    torch.testing.assert_close(
        model.conv.weight.grad, reference.conv.weight.grad, rtol=tol.rtol, atol=tol.atol
    )
    m = compiled.specializations[0].manifest
    assert m.executor["backend"] == "stax" and m.executor["backward"]["evidence"]
    assert m.autograd["wrt"] and not m.fallbacks
    assert m.graph["frozen"] == []


def test_a_backward_that_cannot_compile_is_a_recorded_fallback() -> None:
    def noisy(x: torch.Tensor) -> torch.Tensor:
        # NOTE: rrelu draws its slopes: a derivative would need the numbers drawn
        return torch.nn.functional.rrelu(x, training=True).sum()

    compiled = plait.compile(noisy, backend="stax")
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
    assert any(
        issubclass(w.category, CaptureFallbackWarning) and "backward" in str(w.message)
        for w in caught
    )
    out.backward()
    assert x.grad is not None
    m = compiled.specializations[0].manifest
    assert m.executor["backend"] == "eager" and m.executor["requested"] == "stax"
    assert any("could not be compiled" in f["reason"] for f in m.fallbacks)


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown options"):
        plait.compile(convbn(), options={"fuse_harder": True})
    compiled = plait.compile(convbn(), backend="eager", options={"freeze": True})
    with pytest.raises(ValueError, match="freeze=True needs"):
        compiled(*factory(0))


def test_default_backend_is_stax_for_static_cpu_programs() -> None:
    model = convbn()
    compiled = plait.compile(model)
    with torch.no_grad():
        compiled(*factory(0))
    m = compiled.specializations[0].manifest
    assert (
        m.options["backend"] == "stax" and m.options["backend_choice"] == "default for CPU tensors"
    )
    assert m.executor["evidence"]["counts"]["native"] > 0


def test_default_backend_records_its_choice_for_symbolic_shapes() -> None:
    f = plait.compile(lambda x: x.relu() * 2, dynamic=True)
    f(torch.randn(5, 3))
    m = f.specializations[0].manifest
    assert m.options["backend"] == "stax"  # NOTE: Stax compiles symbolic shapes on the CPU
    assert m.options["backend_choice"] == "default for CPU tensors (symbolic shapes)"
