"""The compile report in the cases beside a cold compile: an artifact from the cache, a saved
manifest, a module compiled in regions (identical blocks shown once), the reference
interpreter, a whole-program fallback, text from a manifest that must stay text; and
``plait report`` on the command line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import plait
from plait.cli import main
from plait.compile_report import from_compiled, render_html
from plait.manifest import Manifest
from tests.regions.models import BranchyParent
from tests.report.html_check import Document


def _valid(text: str) -> Document:
    doc = Document(text)
    doc.check()
    return doc


def _fn(x: torch.Tensor) -> torch.Tensor:
    return (x.relu() * 2 + 1).sum(1)


def test_an_artifact_from_the_cache_says_its_pass_graphs_are_not_known(tmp_path: Path) -> None:
    cold = plait.compile(_fn, options={"cache": str(tmp_path)})
    cold(torch.randn(4, 8))
    warm = plait.compile(_fn, options={"cache": str(tmp_path)})
    warm(torch.randn(4, 8))
    assert warm.specializations[0].manifest.cache["status"] == "hit"
    text = render_html(warm)
    _valid(text)
    (s,) = from_compiled(warm).specializations
    assert s.passes and all(step.text is None for step in s.passes)
    assert "came from the artifact cache" in text
    assert "hit" in text


def test_regions_and_identical_blocks(recwarn: Any) -> None:
    torch.manual_seed(0)
    model = BranchyParent().eval()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(torch.randn(4, 8))  # NOTE: refused, it goes on eagerly: regions come next
        assert "captured and compiled from its next call" in render_html(compiled)
        compiled(torch.randn(4, 8))
    text = render_html(compiled)
    doc = _valid(text)
    view = from_compiled(compiled)
    titles = [s.title for s in view.specializations]
    assert "regions" in doc.ids and "boundaries" in text
    blocks = [s for s in view.specializations if s.title.startswith("region blocks.")]
    assert len(blocks) == 3
    # NOTE: identical blocks share one artifact: its passes and programs are shown once
    assert [s.shared_with is None for s in blocks] == [True, False, False]
    assert "shares its compiled artifact with region blocks.0" in text, titles


def test_the_reference_interpreter_and_a_fallback() -> None:
    eager = plait.compile(_fn, backend="eager", options={"cache": False})
    eager(torch.randn(4, 8))
    text = render_html(eager)
    _valid(text)
    assert "interpreted" in text and "<svg" in text

    def branchy(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x

    fallback = plait.compile(branchy, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback(torch.ones(3))
    text = render_html(fallback)
    _valid(text)
    assert "1 fallback(s)" in text and "whole program" in text and "test_report_cases.py" in text


def test_text_from_a_manifest_stays_text() -> None:
    m = Manifest(source_hash="ab" * 32)
    m.fallbacks.append({"what": "<script>alert(1)</script>", "reason": '"><img src=x>'})
    m.passes.append({"name": "</pre><script>", "changed": False, "rewrites": [], "details": {}})
    doc = _valid(render_html(m))
    assert doc.counts["script"] == 1 and "img" not in doc.counts


def test_verdicts_go_with_the_specializations_they_judged() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    verdict = plait.conformance.check(model, compiled, (torch.randn(2, 8),), draws=1)
    unjudged = plait.conformance.Report()
    doc = _valid(render_html(compiled, [verdict, unjudged]))
    assert "s0-verdicts" in doc.ids and "verdicts" in doc.ids


def test_cli_report_of_a_saved_manifest(tmp_path: Path) -> None:
    f = plait.compile(_fn, options={"cache": False})
    f(torch.randn(4, 8))
    saved = tmp_path / "fn.json"
    f.specializations[0].manifest.save(saved)
    result = CliRunner().invoke(main, ["report", str(saved), "-o", str(tmp_path / "fn.html")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "fn.html").read_text()
    _valid(text)
    assert "pass 0: canonicalize" in text and "a saved manifest keeps none" in text
    broken = tmp_path / "broken.json"
    doc = json.loads(saved.read_text())
    doc["passes"] = [["not", "a", "record"]]
    broken.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["report", str(broken), "-o", str(tmp_path / "b.html")])
    assert result.exit_code == 1 and "malformed content" in result.output


def test_cli_report_compiles_a_target_and_runs_the_gate(tmp_path: Path) -> None:
    target = tmp_path / "target.py"
    target.write_text(
        "import torch\n\n"
        "def mlp():\n"
        "    torch.manual_seed(0)\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU())\n"
        "    return model, (torch.randn(4, 8),)\n"
    )
    out = tmp_path / "mlp.html"
    args = ["report", f"{target}:mlp", "-o", str(out), "--gate", "--options", '{"cache": false}']
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    text = out.read_text()
    _valid(text)
    assert "conformance PASSED" in text and "Sequential" in text
    bad = CliRunner().invoke(main, ["report", f"{target}:mlp", "--options", "[1]"])
    assert bad.exit_code != 0


@pytest.mark.parametrize("text", ["<div><p></div>", '<a href="#nowhere">x</a>',
                                  '<script src="https://example.org/x.js"></script>'])  # fmt: skip
def test_the_html_check_finds_defects(text: str) -> None:
    page = f"<!DOCTYPE html><html><head><title>t</title></head><body>{text}</body></html>"
    with pytest.raises(AssertionError):
        Document(page).check()


def test_a_symbolic_program_is_explained_and_reported() -> None:
    """Automatic dynamic: the second size makes the batch dim symbolic; its memory plan is
    sized per call (explain printed it as bytes and raised TypeError)."""
    f = plait.compile(lambda x: (x.exp() * 2).sum(1), options={"cache": False})
    f(torch.randn(2, 8))
    f(torch.randn(5, 8))
    (_, symbolic) = f.specializations
    assert symbolic.manifest.executor["memory_plan"]["peak_live_bytes"] == "per call"
    assert "peak live per call" in str(plait.explain(f))
    text = render_html(f)
    _valid(text)
    assert "automatic dynamic" in text and "per call" in text


def test_a_loaded_artifact_is_reported_from_its_manifests(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    path = tmp_path / "mlp.plait"
    plait.export(model, (torch.randn(2, 4),), native=False, references=1).save(path)
    loaded = plait.load(path)
    with torch.no_grad():
        loaded(torch.randn(2, 4))
    text = render_html(loaded)
    _valid(text)
    assert "loaded artifact" in text and "specialization 0" in text
    with pytest.raises(TypeError, match=r"plait\.report expects"):
        render_html(object())
