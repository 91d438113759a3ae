"""A loaded program checks its guards on every call and says what does not match; it is built
again (and says so) when the call settings change; what cannot be exported is refused."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import plait
from plait.errors import CompiledInputError, ExportError, ExportWarning, PlaitCompileError
from tests.export import crafting
from tests.export.models import MLP, scaled, seeded
from tests.util import contract_tol


@pytest.fixture(scope="module")
def function_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    gen = seeded(3)
    fn = scaled(torch.randn(8, 8, generator=gen))
    args = (torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen))
    artifact = plait.export(fn, args, {"scale": 0.25})
    return artifact.save(tmp_path_factory.mktemp("calls") / "f.plait"), fn


def test_a_matching_call_runs_and_keeps_the_result_structure(function_artifact: Any) -> None:
    path, fn = function_artifact
    loaded = plait.load(path)
    gen = seeded(4)
    x, y = torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)
    got = loaded(x, y, scale=0.25)
    with torch.no_grad():
        want = plait.compile(fn)(x, y, scale=0.25)
    assert sorted(got) == ["h", "pair", "rows"] and got["rows"] == 2
    assert isinstance(got["pair"], tuple)
    assert torch.equal(got["h"], want["h"]) and torch.equal(got["pair"][1], want["pair"][1])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda x, y: ((x.double(), y), {"scale": 0.25}),
            "x: f32[3, 8]: expected f32[3, 8] on cpu",
        ),
        (lambda x, y: ((x[:2], y), {"scale": 0.25}), "got f32[2, 8] on cpu"),
        (lambda x, y: ((x.to("meta"), y), {"scale": 0.25}), "got f32[3, 8] on meta"),
        (lambda x, y: ((x, y), {"scale": 0.5}), "scale == 0.25: expected 0.25 (float), got 0.5"),
        (lambda x, y: ((x, [y]), {"scale": 0.25}), "inputs: (x: tensor, y: tensor"),
        (lambda x, y: ((x,), {"scale": 0.25}), "missing a required argument: 'y'"),
        (
            lambda x, y: ((x.requires_grad_(), y), {"scale": 0.25}),
            "x.requires_grad == False: expected False, got True",
        ),
    ],
    ids=["dtype", "shape", "device", "scalar", "structure", "missing", "requires_grad"],
)
def test_a_call_that_does_not_match_is_refused_clearly(
    function_artifact: Any, call: Any, message: str
) -> None:
    loaded = plait.load(function_artifact[0])
    gen = seeded(5)
    args, kwargs = call(torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen))
    with pytest.raises(CompiledInputError) as info:
        loaded(*args, **kwargs)
    assert message in str(info.value)
    assert str(info.value).startswith("scaled.<locals>.f")


def test_changed_settings_build_the_program_again_and_say_why(function_artifact: Any) -> None:
    loaded = plait.load(function_artifact[0])
    gen = seeded(6)
    x, y = torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)
    first = loaded(x, y, scale=0.25)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        again = loaded(x, y, scale=0.25)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first["h"], again["h"])
    report = loaded.explain()
    assert len(report.specializations) == 2
    assert f"torch.get_num_threads() == {threads}" in str(report.specializations[1].reason)
    assert "native kernels rebuilt" in str(report) and "trusted" in str(report)


def test_a_dynamic_export_keeps_its_symbolic_sizes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP(16, 32, 8).eval()
    artifact = plait.export(model, (torch.randn(4, 16, generator=seeded(7)),), dynamic=True)
    assert "f32[s0, 16]" in artifact.members["program.ir"].decode()
    loaded = plait.load(artifact.save(tmp_path / "dynamic.plait"))
    compiled = plait.compile(model, dynamic=True)
    for rows in (3, 9):
        x = torch.randn(rows, 16, generator=seeded(rows))
        with torch.no_grad():
            assert torch.equal(loaded(x), compiled(x))
    with pytest.raises(CompiledInputError, match=r"x.shape\[0\] >= 2"):
        loaded(torch.randn(1, 16))


def test_a_program_stax_does_not_compile_runs_on_the_interpreter_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``plait.compile`` runs a program on the reference interpreter (CUDA tensors without
    Triton, say; here its backend choice is made so), the export does too, warns, records why,
    and every load warns again."""
    import plait.api

    reason = "default for ['cuda:0']: Triton is not installed (pip install triton)"
    monkeypatch.setattr(plait.api, "default_backend", lambda prog, state: ("eager", reason))
    torch.manual_seed(0)
    model = MLP(16, 32, 8).eval()
    with pytest.warns(ExportWarning, match="reference interpreter, not native kernels"):
        artifact = plait.export(model, (torch.randn(4, 16, generator=seeded(7)),), dynamic=True)
    assert artifact.header["executor"] == "interpreter" and not artifact.native
    assert artifact.header["executor_note"] == reason
    path = artifact.save(tmp_path / "interpreted.plait")
    with pytest.warns(ExportWarning, match="Triton is not installed"):
        loaded = plait.load(path)
    compiled = plait.compile(model, dynamic=True)
    x = torch.randn(6, 16, generator=seeded(6))
    with torch.no_grad():
        assert torch.equal(loaded(x), compiled(x))
    assert "interpreter" in str(plait.explain(loaded))


def test_an_export_is_reproducible(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP(8, 16, 4).eval()
    x = torch.randn(2, 8, generator=seeded(8))
    first, second = plait.export(model, (x,)), plait.export(model, (x,))
    assert first.digest == second.digest
    a, b = first.save(tmp_path / "a.plait"), second.save(tmp_path / "b.plait")
    assert a.read_bytes() == b.read_bytes()


def _with_a_loss(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    return {"scaled": (x * y).tanh(), "loss": (x - y).pow(2).mean()}


def test_a_program_with_a_0d_output_exports_and_verifies(tmp_path: Path) -> None:
    """A 0-d output gives the gate one error sample per reference case: the export stores as
    many cases as the gate needs, so export and verify judge it on fresh inputs (never the same
    stored case twice)."""
    gen = seeded(11)
    example = (torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen))
    path = plait.export(_with_a_loss, example, native=False).save(tmp_path / "loss.plait")
    assert plait.verify(path).ok
    loaded = plait.load(path)
    for _ in range(3):
        x, y = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
        torch.testing.assert_close(
            loaded(x, y), _with_a_loss(x, y), **contract_tol("model", torch.float32)
        )


def _shifted(x: torch.Tensor, shift: tuple[float, float] = (0.5, 2.0)) -> torch.Tensor:
    return x * shift[1] + shift[0]


def test_a_default_the_artifact_cannot_record_is_passed_by_the_loaded_call(
    tmp_path: Path,
) -> None:
    """A default that is no plain value (a tuple) is not recorded: the export's reference cases
    pass it, as a loaded call must (the export raised CompiledInputError on its own cases)."""
    gen = seeded(12)
    path = plait.export(_shifted, (torch.randn(4, generator=gen),), native=False).save(
        tmp_path / "shifted.plait"
    )
    assert plait.verify(path).ok
    loaded = plait.load(path)
    x = torch.randn(4, generator=gen)
    torch.testing.assert_close(
        loaded(x, (0.5, 2.0)), _shifted(x), **contract_tol("model", torch.float32)
    )
    with pytest.raises(CompiledInputError, match="missing a required argument: 'shift'"):
        loaded(x)
    with pytest.raises(CompiledInputError, match=r"shift\[1\] == 2.0"):
        loaded(x, (0.5, 3.0))


def _writes_its_input(x: torch.Tensor) -> torch.Tensor:
    return x.add_(1.0) * 2


Pair = collections.namedtuple("Pair", "a b")


def _returns_its_own_type(x: torch.Tensor) -> Pair:
    return Pair(x + 1, x * 2)


class _Config:
    scale = 2.0


def _takes_an_object(x: torch.Tensor, cfg: _Config) -> torch.Tensor:
    return x * cfg.scale


def _draws(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def _views_its_input(x: torch.Tensor) -> torch.Tensor:
    return x.t()


@pytest.mark.parametrize(
    ("fn", "args", "message"),
    [
        (_writes_its_input, (torch.randn(3),), "writes its inputs"),
        (_returns_its_own_type, (torch.randn(3),), "the result is a Pair"),
        (_takes_an_object, (torch.randn(3), _Config()), "cfg is a _Config"),
        (_draws, (torch.randn(3),), "the program draws random numbers"),
        # NOTE: the result views a transposed example: its strides are guarded, and no case
        # an artifact stores (contiguous or channels-last) has them
        (_views_its_input, (torch.randn(4, 3).t(),), "the program's guards refuse its reference"),
    ],
    ids=["in-place", "result-type", "argument-type", "random", "strides-of-the-example"],
)
def test_what_cannot_be_exported_is_refused(fn: Any, args: tuple, message: str) -> None:
    with pytest.raises(ExportError, match=message), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plait.export(fn, args)


def test_a_cuda_artifact_is_refused_where_there_is_no_cuda(
    function_artifact: Any, tmp_path: Path
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    members = crafting.reindexed(crafting.members_of(function_artifact[0]), device="cuda:0")
    path = crafting.write(tmp_path / "cuda.plait", members)
    with pytest.raises(PlaitCompileError, match="runs on cuda:0, and this machine has no CUDA"):
        plait.load(path)
