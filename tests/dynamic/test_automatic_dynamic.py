"""Which dims are symbolic: automatic dynamic (the default), named dims, sizes 0 and 1, range
guards, what happens where Stax cannot compile symbolic sizes, and the warm start of a new
process at a new size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import plait
import plait.conformance
from plait.errors import CaptureFallbackWarning


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_static_first_then_the_changed_dim_is_symbolic() -> None:
    model = _mlp().eval()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        for n in (4, 6, 9, 33, 2):
            x = torch.randn(n, 8)
            compiled(x)  # NOTE: the gate judges the specialization this call ran
            report = plait.conformance.check(
                model, compiled, (x,), draws=1, candidate_module=model, seed=n, stress=None
            )
            assert report.ok, str(report)
    report = plait.explain(compiled)
    assert len(report.specializations) == 2
    first, second = report.specializations
    assert "input: f32[4, 8]" in first.guards
    assert "input: f32[s0, 8]" in second.guards and "input.shape[0] >= 2" in second.guards
    assert second.reason.endswith(
        "automatic dynamic: input.shape[0] is symbolic s0 (sizes seen: 4, 6)"
    )
    assert second.manifest.options["dynamic_dims"] == {
        "input.shape[0]": {"symbol": "s0", "sizes_seen": [4, 6]}
    }
    assert second.manifest.executor["backend"] == "stax"


def test_sizes_0_and_1_specialize() -> None:
    """A 1 broadcasts where a larger size does not and 0 empties every loop: each is a static
    specialization of its own, never the symbolic one (its guard says >= 2)."""
    compiled = plait.compile(lambda x: x.softmax(0) * 2, options={"cache": False})
    for n in (3, 5, 1, 0, 7, 1):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), x.softmax(0) * 2)
    shapes = [s.graph.inputs[0].type.shape[0] for s in compiled.specializations]
    assert [str(d) for d in shapes] == ["3", "s0", "1", "0"]


def test_named_dims_and_the_static_rest() -> None:
    compiled = plait.compile(
        lambda x, y: (x * y).sum(1), dynamic={"x": {0: "batch"}, "y": {0: "batch"}},
        options={"cache": False},
    )  # fmt: skip
    for n in (3, 5, 8):
        x, y = torch.randn(n, 6), torch.randn(n, 6)
        torch.testing.assert_close(compiled(x, y), (x * y).sum(1))
    assert len(compiled.specializations) == 1
    assert [str(v.type) for v in compiled.specializations[0].graph.inputs] == [
        "f32[batch, 6]", "f32[batch, 6]"
    ]  # fmt: skip
    compiled(torch.randn(4, 7), torch.randn(4, 7))
    assert len(compiled.specializations) == 2  # NOTE: dim 1 is not named: it specializes


def test_malformed_dynamic_fails_at_compile() -> None:
    with pytest.raises(ValueError, match="no symbol name"):
        plait.compile(lambda x: x, dynamic={"x": {0: "s3"}})
    with pytest.raises(TypeError, match="mapping of input paths"):
        plait.compile(lambda x: x, dynamic="batch")


def test_a_range_violation_recompiles_naming_the_constraint() -> None:
    """A slice bound that is a symbolic size is exact under a range guard (``mask[:t, :t]`` is
    t x t while ``t <= 16``, GPT-2's causal mask): a call outside the range recompiles, naming
    the constraint."""
    mask = torch.ones(16, 16).tril()

    def f(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        return x.sum(1) * mask[:t, :t].sum()

    compiled = plait.compile(f, dynamic=True, options={"cache": False})
    for t in (4, 9, 16):
        x = torch.randn(2, t)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(compiled.specializations) == 1
    assert "x.shape[1] <= 16" in compiled.specializations[0].guards.texts()
    x = torch.randn(2, 20)
    torch.testing.assert_close(compiled(x), f(x))
    assert compiled.recompile_reasons == [
        "x.shape[1] <= 16: expected True, got False (x.shape[1] = 20)"
    ]


def test_a_range_guard_failure_is_the_recompile_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x[:, :6] * 2 if x.shape[1] > 6 else x * 3

    compiled = plait.compile(f, dynamic=True, options={"cache": False})
    for t in (8, 10, 4):
        x = torch.randn(2, t)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(compiled.specializations) == 2
    assert compiled.recompile_reasons[0].startswith("x.shape[1] > 6: expected True, got False")


def _refused() -> object:
    return lambda x: torch.cat([x[:, 2:], x], 1).relu()


def test_stax_refusal_specializes_loudly_under_automatic_dynamic() -> None:
    compiled = plait.compile(_refused(), options={"cache": False})
    compiled(torch.randn(3, 5))
    with pytest.warns(CaptureFallbackWarning, match="every size specializes from now on.*cat"):
        compiled(torch.randn(3, 6))
    second = compiled.specializations[1]
    assert second.graph.inputs[0].type.is_static
    assert "may be 0 at run time" in second.manifest.options["dynamic_refused"]
    assert second.manifest.executor["backend"] == "stax"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(torch.randn(3, 7))  # NOTE: warned once; the new size is one more static one


def test_stax_refusal_runs_the_interpreter_loudly_under_explicit_dynamic() -> None:
    compiled = plait.compile(_refused(), dynamic=True, options={"cache": False})
    with pytest.warns(CaptureFallbackWarning, match="the reference interpreter runs it"):
        x = torch.randn(3, 5)
        torch.testing.assert_close(compiled(x), _refused()(x))  # type: ignore[operator]
    manifest = compiled.specializations[0].manifest
    assert manifest.executor["backend"] == "eager"
    assert manifest.options["backend_choice"].startswith("stax cannot compile these symbolic")


_PROGRAM = """
import json, sys, torch, plait

def block(x):
    return torch.nn.functional.layer_norm(x.relu() * 2.0, (8,)).softmax(-1)

f = plait.compile(block)
out = []
for n in map(int, sys.argv[1:]):
    x = torch.randn(n, 8)
    torch.testing.assert_close(f(x), block(x))
    s = f.specializations[-1]
    kind = str(s.graph.inputs[0].type)
    out.append([len(f.specializations), s.manifest.cache.get("status"), kind])
print(json.dumps(out))
"""


def test_a_new_process_at_a_new_size_starts_warm(tmp_path: Path) -> None:
    """Automatic dynamic is remembered with the artifact: a new process captures the dim
    symbolic from its first call and loads the compiled program; the compiler never runs."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(_PROGRAM))
    env = {**os.environ, "PLAIT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root)])

    def run(*sizes: int, **extra: str) -> list[list[object]]:
        done = subprocess.run(
            [sys.executable, str(script), *map(str, sizes)],
            env={**env, **extra}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    first = run(4, 6)
    assert first == [[1, "miss", "f32[4, 8]"], [2, "miss", "f32[s0, 8]"]]
    second = run(13, 40, PLAIT_STAX_NO_COMPILE="1")
    assert second == [[1, "hit", "f32[s0, 8]"], [1, "hit", "f32[s0, 8]"]]


_EDITED = """
import json, sys, torch, plait

def block(x):
    return BODY

f = plait.compile(block)
for n in map(int, sys.argv[1:]):
    x = torch.randn(n, 8)
    torch.testing.assert_close(f(x), block(x))
print(json.dumps(str(f.specializations[-1].graph.inputs[0].type)))
"""


def test_an_edited_function_does_not_inherit_its_old_sizes(tmp_path: Path) -> None:
    """The automatic dynamic record is kept per version of the callable's code: a function
    edited under its old name starts static, as a new function does."""
    env = {**os.environ, "PLAIT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root)])
    script = tmp_path / "prog.py"

    def run(body: str, *sizes: int) -> str:
        script.write_text(textwrap.dedent(_EDITED).replace("BODY", body))
        done = subprocess.run(
            [sys.executable, str(script), *map(str, sizes)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout.splitlines()[-1]))

    assert run("x.relu() * 2", 4, 6) == "f32[s0, 8]"
    assert run("x.relu() * 2", 9) == "f32[s0, 8]"  # NOTE: this version saw its dim change
    assert run("x.exp() - 1", 9) == "f32[9, 8]"  # NOTE: the edited one has seen one size


def test_a_training_program_whose_backward_refuses_symbols_specializes() -> None:
    """Training batch norm runs ATen's kernels, typed by their meta kernels for static shapes:
    the symbolic compile is refused, loudly, and sizes specialize; gradients stay eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    compiled = plait.compile(model, options={"cache": False})
    compiled(torch.randn(3, 3, 6, 6)).sum().backward()
    with pytest.warns(CaptureFallbackWarning, match="TypeRuleError: aten"):
        compiled(torch.randn(5, 3, 6, 6)).sum().backward()
    assert all(s.graph.inputs[0].type.is_static for s in compiled.specializations)
    assert "TypeRuleError" in compiled.specializations[1].manifest.options["dynamic_refused"]
