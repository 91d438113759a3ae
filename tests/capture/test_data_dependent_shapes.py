"""Calls whose output shape depends on tensor values (nonzero, masked_select, x[mask], unique,
unique_consecutive, bincount, repeat_interleave with tensor repeats) compile as aten_datadep
nodes with unbacked sizes: one specialization serves every size, results equal eager's (shape
included) on fresh draws, and a reader that cannot take such a size is refused loudly."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import plait
import plait.conformance
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.ir.parser import from_text
from plait.ir.text import to_text
from plait.ir.verify import verify
from tests.util import assert_bitwise


def _draw(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _counts(x: torch.Tensor) -> torch.Tensor:
    return (x.abs() * 3).long().flatten()


# NOTE: each runs PyTorch's own kernels on the data-dependent part (bitwise equal to eager);
# the static parts around them are native kernels that keep eager's order of arithmetic.
PROGRAMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "mask_sum": lambda x: x[x > 0].sum(),
    "mask_output": lambda x: x[x > 0.5] * 2,
    "nonzero_t": lambda x: torch.nonzero(x > 0).t(),
    "nonzero_as_tuple": lambda x: torch.nonzero(x > 0, as_tuple=True),
    "argwhere": lambda x: torch.argwhere(x < 0),
    "masked_select_mean": lambda x: x.masked_select(x > 0).mean(),
    "unique_float_mean": lambda x: torch.unique((x * 3).round()).float().mean(),
    "unique_all": lambda x: torch.unique((x * 2).round(), return_inverse=True, return_counts=True),
    "unique_dim": lambda x: torch.unique((x > 0).long(), dim=0),
    "unique_consecutive": lambda x: torch.unique_consecutive((x * 2).round(), return_counts=True),
    "bincount": lambda x: torch.bincount(_counts(x)),
    "bincount_weights": lambda x: torch.bincount(_counts(x), weights=x.flatten().double()),
    "repeat_interleave": lambda x: torch.repeat_interleave(_counts(x)),
    "repeat_interleave_self": lambda x: x.flatten().repeat_interleave(_counts(x)),
    "static_after": lambda x: (x + x[x > 0].amax(0, keepdim=True).sum()).relu(),
    # NOTE: passes make these reshapes to a size of dd0: run with the size the call made
    "unsqueeze": lambda x: x[x > 0].unsqueeze(0).abs(),
    "flatten_mean": lambda x: torch.nonzero(x > 0).flatten().float().mean(),
    "column": lambda x: torch.nonzero(x > 0)[:, 0],
}


# NOTE: reduced to a static shape (torch.combinations has a capture rule of static size:
# tests/capture/test_statistics_rules.py)
SAME_SIZE_EVERY_DRAW = {
    "static_after", "mask_sum", "masked_select_mean", "unique_float_mean", "flatten_mean",
}  # fmt: skip


def _leaves(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_one_specialization_serves_every_size(name: str) -> None:
    fn = PROGRAMS[name]
    compiled = plait.compile(fn, fullgraph=True)
    sizes = set()
    with torch.no_grad():
        for seed in range(4):
            x = _draw((5, 4), seed)
            got, expected = _leaves(compiled(x)), _leaves(fn(x))
            assert len(got) == len(expected)
            for k, (g, e) in enumerate(zip(got, expected)):
                assert_bitwise(g, e, f"{name} draw {seed} result {k}")
            sizes.add(tuple(tuple(e.shape) for e in expected))
    assert len(compiled.specializations) == 1
    (spec,) = compiled.specializations
    assert spec.opaque_counts == {}
    assert spec.fallback_reason is None
    assert any(n.op == "aten_datadep" for n in spec.graph.nodes)
    if name not in SAME_SIZE_EVERY_DRAW:
        assert len(sizes) > 1, f"{name}: the draws should give different output sizes"
    made = spec.manifest.graph["data_dependent_sizes"]
    assert made and all(size.startswith("dd") for size in made), made
    assert set(spec.manifest.graph["aten_externs"]) == {v.split(" ")[0] for v in made.values()}
    nodes = spec.manifest.executor["evidence"]["nodes"]
    datadep = [n for n in nodes if n["op"] == "aten_datadep"]
    assert datadep and all(n["executor"] == "extern" for n in datadep)
    assert not spec.manifest.fallbacks


def test_data_dependent_dims_are_unbacked_sizes_in_the_ir() -> None:
    prog = plait.capture(lambda x: torch.nonzero(x > 0).t(), (_draw((3, 4), 0),), fullgraph=True)
    (nz,) = [n for n in prog.graph.nodes if n.op == "aten_datadep"]
    assert str(nz.outputs[0].type) == "i64[dd0, 2]"
    assert str(prog.graph.outputs[0].type) == "i64[2, dd0]"
    text = to_text(prog.graph)
    parsed = from_text(text)
    verify(parsed)
    assert to_text(parsed) == text


def test_memory_plan_never_sizes_a_data_dependent_buffer() -> None:
    compiled = plait.compile(lambda x: (x[x > 0] * 3, x.relu() + 1), fullgraph=True)
    with torch.no_grad():
        compiled(_draw((6, 5), 0))
    (spec,) = compiled.specializations
    buffers = spec.manifest.executor["memory_plan"]["buffers"]
    unsized = [b for b in buffers if b["bytes"] == "data-dependent"]
    assert unsized and all(b["home"] == "torch" for b in unsized)
    assert all(b["home"] != "arena" for b in unsized)


def test_gate_judges_shapes_known_only_at_run_time() -> None:
    fn = PROGRAMS["unique_all"]
    compiled = plait.compile(fn, fullgraph=True)
    report = plait.conformance.check(fn, compiled, (_draw((5, 4), 0),), draws=3, bitwise=True)
    assert report.ok, report


def test_gate_catches_a_wrong_size() -> None:
    """The gate can fail here: a candidate that keeps one element too many is caught."""

    def wrong(x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        return torch.cat([kept, kept[:1]])

    report = plait.conformance.check(
        PROGRAMS["mask_output"], lambda x: wrong(x) * 2, (_draw((5, 4), 0),), draws=3
    )
    assert not report.ok


def test_gradients_flow_through_masked_select() -> None:
    # NOTE: Stax kernels have no backward yet: with gradients the interpreter runs the graph
    fn = PROGRAMS["masked_select_mean"]
    compiled = plait.compile(fn, fullgraph=True, backend="eager")
    report = plait.conformance.check(fn, compiled, (_draw((5, 4), 0).requires_grad_(),), grads=True)
    assert report.ok, report


def test_warm_cache_runs_the_saved_program(tmp_path: Path) -> None:
    fn = PROGRAMS["nonzero_t"]
    options = {"cache": str(tmp_path)}
    with torch.no_grad():
        first = plait.compile(fn, fullgraph=True, options=options)
        first(_draw((5, 4), 0))
        again = plait.compile(fn, fullgraph=True, options=options)
        for seed in range(1, 4):
            x = _draw((5, 4), seed)
            assert_bitwise(again(x), fn(x), f"draw {seed}")
    (spec,) = again.specializations
    assert spec.manifest.cache["status"] == "hit", spec.manifest.cache


def _refused_broadcast(x: torch.Tensor) -> Any:
    return x[x > 0] + x[x > 0]  # REFUSED: broadcast


def _refused_reshape(x: torch.Tensor) -> Any:
    return torch.nonzero(x).reshape(-1)  # REFUSED: reshape


def _refused_len(x: torch.Tensor) -> Any:
    return x * len(x[x > 0])  # REFUSED: len


def _refused_unruled(x: torch.Tensor) -> Any:
    return x.masked_select(x > 0).cumprod(0)  # REFUSED: unruled


def _refused_nested(x: torch.Tensor) -> Any:
    return torch.unique(x[x > 0])  # REFUSED: nested


REFUSALS = {
    "broadcast": (_refused_broadcast, "add"),
    "reshape": (_refused_reshape, "reshape"),
    "len": (_refused_len, "reading the shape"),
    "unruled": (_refused_unruled, "no capture rule"),
    "nested": (_refused_nested, "aten._unique2"),
}


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# REFUSED: {marker}"):
                return n
    raise AssertionError(marker)


@pytest.mark.parametrize("marker", list(REFUSALS))
def test_a_reader_that_cannot_take_the_size_is_refused(marker: str) -> None:
    fn, says = REFUSALS[marker]
    with pytest.raises(GraphCaptureError) as info:
        plait.capture(fn, (_draw((4, 3), 0),), fullgraph=True)
    err = info.value
    assert err.kind == "data-dependent"
    assert says in str(err) and "unbacked size" in str(err)
    assert err.filename == __file__ and err.lineno == _line_of(marker)


@pytest.mark.parametrize("marker", list(REFUSALS))
def test_a_refused_reader_falls_back_loudly(marker: str) -> None:
    fn, _ = REFUSALS[marker]
    compiled = plait.compile(fn)
    with pytest.warns(CaptureFallbackWarning, match="data-dependent|unbacked"):
        got = compiled(_draw((4, 3), 1))
    assert_bitwise(got, fn(_draw((4, 3), 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in (2, 3):
            assert_bitwise(compiled(_draw((4, 3), seed)), fn(_draw((4, 3), seed)))
    (spec,) = compiled.specializations
    assert spec.fallback_reason is not None and "unbacked size" in spec.fallback_reason


_FRESH_PROCESS = """
import sys, torch, plait
assert "torch._dynamo" not in sys.modules
plait.capture(lambda x: torch.nonzero(x), (torch.randn(3),), fullgraph=True)
assert "torch._dynamo" in sys.modules  # NOTE: imported inside the capture, by the type rule
import torch._dynamo.utils as utils
import torch._dynamo.variables.user_defined as defined
real = torch.nn.Module.__getattr__
print(utils.unpatched_nn_module_getattr is real, defined.unpatched_nn_module_getattr is real)
"""


@pytest.mark.slow
def test_a_module_first_imported_inside_a_capture_keeps_the_real_module_getattr() -> None:
    """Dynamo, first imported by the type rule inside a capture, copied capture's recording
    nn.Module.__getattr__ and then took a module's parameters for inputs."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], done.stdout


def test_dynamic_shapes_make_the_operands_of_a_data_dependent_op_static() -> None:
    fn = PROGRAMS["mask_sum"]
    compiled = plait.compile(fn, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for seed, rows in enumerate((5, 7, 5)):
            x = _draw((rows, 3), seed)
            assert_bitwise(compiled(x), fn(x), f"{rows} rows")
    assert len(compiled.specializations) == 2  # NOTE: one per input size, none per mask
    for spec in compiled.specializations:
        assert spec.fallback_reason is None and spec.graph is not None
        assert all(isinstance(d, int) for d in spec.graph.inputs[0].type.shape)


STATIC_SIZE = {
    "nonzero_static": (lambda x: torch.nonzero_static(x > 0, size=6, fill_value=-2), (4, 3)),
    "nonzero_of_empty": (lambda x: torch.nonzero(x[:, :0]), (5, 4)),
    "argwhere_of_empty": (lambda x: torch.argwhere(x[:0]), (5, 4)),
    "repeat_interleave_output_size": (
        lambda x: x.repeat_interleave(torch.tensor([1, 2, 0, 3, 1]), dim=0, output_size=7),
        (5, 4),
    ),
}


@pytest.mark.parametrize("name", list(STATIC_SIZE))
def test_a_size_the_meta_kernel_knows_is_static(name: str) -> None:
    fn, shape = STATIC_SIZE[name]
    compiled = plait.compile(fn, fullgraph=True)
    with torch.no_grad():
        for seed in range(3):
            x = _draw(shape, seed)
            assert_bitwise(compiled(x), fn(x), f"{name} draw {seed}")
    (spec,) = compiled.specializations
    (node,) = [n for n in spec.graph.nodes if n.op == "aten_datadep"]
    assert node.attrs.get("sizes", "") == "" and node.outputs[0].type.is_static
    assert spec.opaque_counts == {}


def test_a_negative_dim_of_unique_consecutive_is_counted_from_the_front() -> None:
    def fn(x: torch.Tensor) -> Any:
        return torch.unique_consecutive((x * 2).round(), return_counts=True, dim=-1)

    compiled = plait.compile(fn, fullgraph=True)
    with torch.no_grad():
        for seed in range(3):
            x = _draw((4, 6), seed)
            for k, (g, e) in enumerate(zip(compiled(x), fn(x))):
                assert_bitwise(g, e, f"draw {seed} result {k}")


@pytest.mark.parametrize("dim", [0, -1])
def test_unique_consecutive_of_a_vector_along_its_dim(dim: int) -> None:
    """The kernel runs dim=None there; the node does too (the meta kernel of dim=0 types its
    empty inverse as i64[5])."""

    def fn(x: torch.Tensor) -> Any:
        return torch.unique_consecutive((x * 2).round(), dim=dim)

    compiled = plait.compile(fn, fullgraph=True)
    with torch.no_grad():
        for seed in range(3):
            x = _draw((7,), seed)
            assert_bitwise(compiled(x), fn(x), f"draw {seed}")


def test_a_meta_kernel_that_mistypes_a_result_is_refused(monkeypatch: Any) -> None:
    """A meta kernel whose type disagrees with what the kernel returns on the sample (the
    dim=0 case above, before it ran as dim=None) is refused: no node may declare a type its
    result does not have, even for a result the program drops."""
    import plait.ir.ops.datadep as node

    real = node._meta_types

    def mistyped(*key: Any) -> Any:
        first, *rest = real(*key)
        return (first, *(t.with_shape((5,)) for t in rest))

    monkeypatch.setattr(node, "_meta_types", mistyped)

    def fn(x: torch.Tensor) -> Any:
        return torch.unique((x * 2).round())

    with pytest.raises(GraphCaptureError, match=r"meta kernel of aten\._unique2 types"):
        plait.capture(fn, (_draw((6,), 0),), fullgraph=True)
