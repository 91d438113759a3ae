"""The compile report of the benchmark models (ResNet-18 and a small GPT-2, inference and
training): valid HTML with nothing outside the document, every pass of every specialization
with its rules and diff, every kernel linked to its source, every node of each program's
picture linked to its line, the gate's verdict beside the specialization it judged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

import plait
import plait.conformance
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.resnet import resnet18
from plait.compile_report import from_compiled, render_html
from tests.report.html_check import Document


@pytest.fixture(scope="module")
def resnet() -> Any:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(torch.randn(2, 3, 32, 32))
    return compiled


@pytest.fixture(scope="module")
def gpt2() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = GPT2(GPT2Config())
    compiled = plait.compile(model, options={"cache": False})
    idx = torch.randint(0, 256, (2, 16))
    compiled(idx).sum().backward()  # NOTE: a training specialization: forward and backward
    with torch.no_grad():
        compiled(idx)
        verdict = plait.conformance.check(model, compiled, (idx,), draws=1, stress=None,
                                          candidate_module=model)  # fmt: skip
    return compiled, verdict


def _check_report(compiled: Any, verdicts: Sequence[Any] = ()) -> tuple[str, Document]:
    text = render_html(compiled, verdicts)
    doc = Document(text)
    doc.check()
    view = from_compiled(compiled)
    assert view.specializations, "nothing compiled"
    for s in view.specializations:
        m = s.manifest
        # every pass, in order, with its name, rules and (where it changed) its diff
        assert len(s.passes) == len(m.passes) > 0
        for i, record in enumerate(m.passes):
            assert f"{s.anchor}-pass-{i}" in doc.ids
            assert f"pass {i}: {record['name']}" in "".join(doc.text_by_tag.get("h4", []))
            for rule in {r["rule"] for r in record["rewrites"]}:
                assert rule in text
        assert all(step.text is not None for step in s.passes), "per-pass graphs not kept"
        changed = [step for step in s.passes if step.diff]
        assert changed and all(step.changed for step in changed)
        # every kernel: an anchor, a link to it, its source (once per symbol)
        assert s.programs
        for p, prog in enumerate(s.programs):
            assert prog.graph is not None
            section = f"{s.anchor}-p{p}"
            assert section in doc.ids
            for k in prog.kernels:
                anchor = f"{section}-kernel-{k.name}"
                assert anchor in doc.ids, anchor
                assert f"#{anchor}" in doc.hrefs, f"kernel {k.name} is not linked"
                assert k.source, f"kernel {k.name} has no source"
                assert k.record["symbol"] in text
            for n in prog.graph.nodes:
                assert f"#{section}-node-{n.id}" in doc.hrefs, f"node {n.id} not in the picture"
    assert doc.counts.get("svg", 0) == sum(len(s.programs) for s in view.specializations)
    return text, doc


def test_resnet_report(resnet: Any, tmp_path: Any) -> None:
    text, doc = _check_report(resnet)
    view = from_compiled(resnet)
    (s,) = view.specializations
    assert [step.name for step in s.passes][:3] == ["canonicalize", "simplify", "freeze"]
    assert "fold-bn.conv" in text and "the first call" in text
    (prog,) = s.programs
    assert len(prog.kernels) > 0 and "memory plan of the program" in text
    assert f"{s.anchor}-timings" in doc.ids and f"{s.anchor}-captured" in doc.ids
    # the file plait.report writes is the same document
    path = plait.report(resnet, tmp_path / "resnet.html")
    assert path.read_text() == text


def test_gpt2_report_training_and_inference(gpt2: tuple[Any, Any]) -> None:
    compiled, verdict = gpt2
    assert verdict.ok, verdict
    text, doc = _check_report(compiled, [verdict])
    view = from_compiled(compiled)
    training, inference = view.specializations
    assert [p.title for p in training.programs] == ["forward", "backward"]
    # NOTE: each half's own passes after the partition: in the manifest and the report
    halves = training.manifest.autograd["passes"]
    for p, half in enumerate(training.programs):
        assert [step.name for step in half.passes] == [r["name"] for r in halves[half.title]]
        assert half.passes and all(step.text is not None for step in half.passes)
        for step in half.passes:
            assert f"{training.anchor}-p{p}-pass-{step.index}" in doc.ids
    assert [p.title for p in inference.programs] == ["program"]
    assert inference.reason is not None and "torch.is_grad_enabled()" in inference.reason
    assert "recompiled: torch.is_grad_enabled()" in text
    # the verdict is shown with the specialization it judged
    assert f"{inference.anchor}-verdicts" in doc.ids
    assert "conformance PASSED" in text
