"""The failure taxonomy: four distinct types, a stable code on every plait error, each code in
docs/errors.md, and the old error names keep the bases they always had."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch

import plait
from plait import errors
from plait.errors import (
    CATEGORIES,
    CODES,
    NumericsError,
    PerformanceRegressionError,
    PlaitCompileError,
    PlaitError,
    SemanticDriftError,
    code_of,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
FOUR = (PlaitCompileError, SemanticDriftError, NumericsError, PerformanceRegressionError)


def _plait_errors() -> list[type[PlaitError]]:
    found = set()
    for m in pkgutil.walk_packages(plait.__path__, "plait."):
        if m.name.startswith(("plait.diagnose", "plait.dynamo_backend")):
            continue
        try:
            module = importlib.import_module(m.name)
        except ImportError:  # NOTE: an optional dependency (triton) that is not installed
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, PlaitError) and obj is not PlaitError:
                found.add(obj)
    return sorted(found, key=lambda c: c.__qualname__)


def test_four_distinct_types_one_per_category() -> None:
    assert [t.category for t in FOUR] == list(CATEGORIES)
    for a in FOUR:
        for b in FOUR:
            assert a is b or not issubclass(a, b)


def test_every_plait_error_has_a_code_in_the_table() -> None:
    """A subclass may share its parent's code (a refinement of the same cause); a code of its
    own is never another type's."""
    seen: dict[str, type] = {}
    for cls in _plait_errors():
        code = cls.error_code
        assert code in CODES, f"{cls.__module__}.{cls.__qualname__}: no code in the table"
        assert CODES[code].category == cls.category, cls
        own = cls.__dict__.get("error_code")
        if own:
            assert own not in seen, f"{own}: {cls} and {seen[own]}"
            seen[own] = cls
    assert len(seen) >= 18


def test_every_code_is_documented() -> None:
    text = DOCS.read_text()
    for code, entry in CODES.items():
        assert f"`{code}`" in text and entry.title in text, code
        assert entry.category in CATEGORIES


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.GraphCaptureError("Tensor.item", "reads tensor data"), "PLAIT-C101"),
        (errors.CompiledInputError("x"), "PLAIT-C103"),
        (SemanticDriftError("cse", "defined twice", 3), "PLAIT-D200"),
        (NumericsError("outside"), "PLAIT-N300"),
        (PerformanceRegressionError("slow"), "PLAIT-P400"),
    ],
)
def test_codes_of_plait_errors(error: Exception, code: str) -> None:
    found = code_of(error)
    assert found is not None and found.code == code


def test_errors_plait_errors_cannot_subclass_are_classified_by_name() -> None:
    from plait.conformance import ConformanceError, Report
    from plait.ir import GraphBuilder, TensorType, VerificationError, interpret

    assert code_of(ConformanceError(Report())).code == "PLAIT-N301"  # type: ignore[union-attr]
    gb = GraphBuilder()
    x = gb.input("x", TensorType((2,), torch.float32))
    gb.output(gb.call("exp", x))
    with pytest.raises(Exception) as raised:
        interpret(gb.build(), [torch.ones(3)])
    assert code_of(raised.value).code == "PLAIT-C153"  # type: ignore[union-attr]
    assert code_of(VerificationError("ssa", "defined twice")).category == "semantic-drift"  # type: ignore[union-attr]
    assert code_of(KeyError("x")) is None


def test_old_names_keep_their_bases() -> None:
    from plait.autograd import JointGraphError, PartitionError
    from plait.codegen import CodegenError
    from plait.runtime import StaxInputError

    assert issubclass(errors.GraphCaptureError, RuntimeError)
    assert issubclass(errors.CompiledInputError, TypeError)
    assert issubclass(StaxInputError, TypeError)
    assert issubclass(JointGraphError, ValueError) and issubclass(PartitionError, ValueError)
    assert issubclass(CodegenError, RuntimeError) and issubclass(CodegenError, PlaitCompileError)
    assert issubclass(errors.ArtifactError, ValueError)
