"""The gate judges what the user runs: the specializations of a compiled callable that the
user's own calls ran, under the settings of those calls, and fails rather than compile another.

The wrong specialization here is a mutant: the user's no_grad specialization with an executor
whose outputs are off by a little (as a fused post-op that miscomputes would be), while the
grad-mode specialization a check outside no_grad would otherwise make is right.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

import plait
import plait.conformance
from plait.errors import CaptureFallbackWarning


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).eval()


def _break(compiled: object, index: int) -> None:
    """Make specialization ``index`` return outputs off by 1e-3 (a miscompile)."""
    spec = compiled.specializations[index]  # type: ignore[attr-defined]
    good = spec.compiled.executor
    spec.compiled.executor = lambda values: [o + 1e-3 for o in good(values)]


def _x(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))


def test_a_wrong_no_grad_specialization_is_caught_outside_no_grad() -> None:
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(_x())
    _break(compiled, 0)
    # NOTE: outside no_grad, as in the README: the user's calls ran the no_grad specialization
    report = plait.conformance.check(model, compiled, (_x(seed=2),), candidate_module=model)
    assert not report.ok
    assert report.caught("output", "tolerance"), report
    [judged] = report.judged
    use = compiled.specialization_uses()[0]
    assert (judged.index, judged.key) == (0, use.key)
    assert judged.settings["torch.is_grad_enabled()"] is False
    assert judged.semantic_hash == use.manifest.source_hash
    assert f"judged: specialization #0 (key {use.key[:16]}, no_grad" in str(report)
    assert len(compiled.specializations) == 1  # NOTE: the gate compiled nothing
    assert compiled.specialization_uses()[0].calls == 1  # nor counted its calls as the user's


def test_the_user_specialization_passes_when_right() -> None:
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(_x())
    report = plait.conformance.check(model, compiled, (_x(seed=3),), candidate_module=model)
    assert report.ok, report
    assert [j.key for j in report.judged] == [compiled.specialization_uses()[0].key]
    assert len(compiled.specializations) == 1


def test_judging_another_specialization_fails_and_compiles_nothing() -> None:
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(_x(batch=2))
    report = plait.conformance.check(model, compiled, (_x(batch=3),), candidate_module=model)
    assert report.caught("candidate", "specialization"), report
    failure = next(f for f in report.errors if f.check == "specialization")
    assert "needs a specialization the user's calls have not run" in failure.message
    assert "input: f32[2, 8]" in failure.message  # NOTE: the guard that refused the call
    assert len(compiled.specializations) == 1


def test_gradients_of_no_grad_calls_fail_clearly() -> None:
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(_x())
    report = plait.conformance.check(model, compiled, (_x(seed=4),), grads=True)
    assert report.caught("gradients", "specialization"), report
    assert len(compiled.specializations) == 1


def test_no_call_yet_judges_the_first_call_under_the_stated_settings() -> None:
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        report = plait.conformance.check(model, compiled, (_x(seed=5),), candidate_module=model)
    assert report.ok, report
    [judged] = report.judged
    assert "made by this check" in judged.how
    assert judged.settings["torch.is_grad_enabled()"] is False
    assert any("had no call yet" in n and "torch.is_grad_enabled() = False" in n for n in
               report.notes)  # fmt: skip
    # NOTE: the user's first call under the same settings runs the specialization judged
    with torch.no_grad():
        compiled(_x(seed=6))
    assert [u.calls for u in compiled.specialization_uses()] == [1]
    assert compiled.specialization_uses()[0].key == judged.key


def test_every_setting_of_the_user_calls_is_applied() -> None:
    """Calls made with deterministic algorithms on and one thread: the gate judges that
    specialization (its guards pin both) and leaves the settings as it found them."""
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            compiled(_x())
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
    _break(compiled, 0)
    report = plait.conformance.check(model, compiled, (_x(seed=7),), candidate_module=model)
    assert report.caught("output", "tolerance"), report
    assert not report.caught(check="specialization"), report
    [judged] = report.judged
    assert judged.settings["torch.are_deterministic_algorithms_enabled()"] is True
    assert judged.settings["torch.get_num_threads()"] == 1
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert torch.is_grad_enabled()


def test_each_settings_group_of_the_user_calls_is_judged() -> None:
    """Calls with and without gradients: both specializations are judged, the wrong one is
    caught, and the other passes its gradient checks."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh())
    compiled = plait.compile(model, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: Stax has no backward
        compiled(_x()).sum().backward()
    with torch.no_grad():
        compiled(_x())
    grad_mode = [u.settings["torch.is_grad_enabled()"] for u in compiled.specialization_uses()]
    assert grad_mode == [True, False]
    _break(compiled, 1)
    report = plait.conformance.check(model, compiled, (_x(seed=8),), grads=True)
    assert [j.index for j in report.judged] == [0, 1]
    wrong = [f for f in report.errors if "#1" in f.case]
    assert wrong and not [f for f in report.errors if "#0" in f.case], report
    assert report.checks_run["tolerance"] > 0
    assert len(compiled.specializations) == 2


def test_a_specialization_no_case_reaches_is_never_reported_judged() -> None:
    """The user's calls ran batch 2 and batch 5 (two specializations of one settings group); a
    check on batch 2 runs only the first: the wrong second one is not named judged, and a
    warning says it was not judged."""
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(_x(2))
        compiled(_x(5))
    _break(compiled, 1)
    report = plait.conformance.check(model, compiled, (_x(2, seed=3),))
    assert [j.index for j in report.judged] == [0], report
    assert any(f.check == "specialization" and f.where == "#1" for f in report.warnings), report
    both = plait.conformance.check(model, compiled, lambda s: (_x(2 + 3 * (s % 2), seed=s),))
    assert [j.index for j in both.judged] == [0, 1] and not both.ok, both
    assert not [f for f in both.warnings if f.check == "specialization"], both


def test_a_symbolic_specialization_judged_at_one_size_is_warned() -> None:
    """The user's calls ran batch 2, then 4 (one symbolic specialization from the second); a
    check at batch 4 alone judges it at that size: a warning names the sizes it was made from.
    A check whose cases run two sizes says nothing of it."""
    model = _model()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(_x(2))
        compiled(_x(4))
    one = plait.conformance.check(model, compiled, (_x(4, seed=3),))
    sized = [f for f in one.warnings if f.check == "sizes"]
    assert one.ok and len(sized) == 1 and "2, 4" in sized[0].message, one
    two = plait.conformance.check(model, compiled, lambda s: (_x(4 + (s % 2), seed=s),))
    assert not [f for f in two.warnings if f.check == "sizes"], two


def test_a_plain_candidate_is_called_as_it_is() -> None:
    model = _model()
    report = plait.conformance.check(model, lambda x: model(x), (_x(),), candidate_module=model)
    assert report.ok and report.judged == [], report


@pytest.mark.slow
def test_the_readme_usage_example_runs_and_passes() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = re.search(r"## Using it\n\n```python\n(.*?)```", readme, re.S)
    assert block is not None, "README.md: no python block under '## Using it'"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        scope: dict[str, object] = {}
        exec(compile(block.group(1), "README.md", "exec"), scope)
    report = scope["report"]
    assert report.ok and report.judged, report  # type: ignore[attr-defined]
    assert "ran 1 user call(s)" in report.judged[0].how  # type: ignore[attr-defined]


def test_a_first_call_that_cannot_be_made_is_a_finding() -> None:
    def reads_data(x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum())  # NOTE: a data read: fullgraph capture refuses it

    compiled = plait.compile(reads_data, fullgraph=True, options={"cache": False})
    report = plait.conformance.check(reads_data, compiled, (_x(),))
    assert report.caught("candidate", "exception"), report
    assert "GraphCaptureError" in str(report)
