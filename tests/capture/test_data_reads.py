"""Reads of tensor data: GraphCaptureError under fullgraph=True naming the user's file, line and
operation; without fullgraph, the recorded eager fallback with one warning. (A data-dependent
shape is no data read until something reads its size: tests/capture/test_data_dependent_shapes.)"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# READ: {marker}"):
                return n
    raise AssertionError(marker)


def _bool(x: torch.Tensor) -> Any:
    if x.sum() > 0:  # READ: bool
        return x
    return -x


def _item(x: torch.Tensor) -> Any:
    return x * x.sum().item()  # READ: item


def _tolist(x: torch.Tensor) -> Any:
    return x.tolist()  # READ: tolist


def _int(x: torch.Tensor) -> Any:
    return x * int(x.sum())  # READ: int


def _float(x: torch.Tensor) -> Any:
    return x * float(x.sum())  # READ: float


def _index_scalar(x: torch.Tensor) -> Any:
    return x[x.argmax()] if False else x[x.sum().long().clamp(0, 2)]  # READ: index_scalar


def _python_index(x: torch.Tensor) -> Any:
    return [1, 2, 3][x.sum().long().clamp(0, 2)]  # READ: python_index


def _nonzero(x: torch.Tensor) -> Any:
    return torch.nonzero(x).reshape(-1)  # READ: nonzero


def _mask(x: torch.Tensor) -> Any:
    return x[x > 0].view(-1, 1)  # READ: mask


def _masked_select(x: torch.Tensor) -> Any:
    return x * len(x.masked_select(x > 0))  # READ: masked_select


def _unique(x: torch.Tensor) -> Any:
    return x[: torch.unique(x).shape[0]]  # READ: unique


def _where1(x: torch.Tensor) -> Any:
    return torch.where(x > 0)  # READ: where1


def _print(x: torch.Tensor) -> Any:
    print(x)  # READ: print
    return x


CASES: list[tuple[str, Callable[..., Any], str]] = [
    ("bool", _bool, "Tensor.__bool__"),
    ("item", _item, "Tensor.item"),
    ("tolist", _tolist, "Tensor.tolist"),
    ("int", _int, "Tensor.__int__"),
    ("float", _float, "Tensor.__float__"),
    ("index_scalar", _index_scalar, "Tensor.__getitem__"),
    ("python_index", _python_index, "Tensor.__index__"),
    ("nonzero", _nonzero, "Tensor.reshape"),
    ("mask", _mask, "Tensor.view"),
    ("masked_select", _masked_select, "Tensor.__len__"),
    ("unique", _unique, "Tensor.shape"),
    ("where1", _where1, "where"),
    ("print", _print, "Tensor.__repr__"),
]


@pytest.mark.parametrize(("marker", "fn", "operation"), CASES, ids=[c[0] for c in CASES])
def test_data_read_raises_with_location(
    marker: str, fn: Callable[..., Any], operation: str
) -> None:
    with pytest.raises(GraphCaptureError) as info:
        plait.capture(fn, (torch.randn(3),), fullgraph=True)
    err = info.value
    assert err.kind == "data-dependent"
    assert err.operation == operation
    assert err.filename == __file__
    assert err.lineno == _line_of(marker)
    assert f"{__file__}:{err.lineno}: {operation}" in str(err)
    assert err.code is not None and err.code.endswith(f"# READ: {marker}")


def test_compile_fullgraph_raises_on_first_call() -> None:
    f = plait.compile(_item, backend="eager", fullgraph=True)
    with pytest.raises(GraphCaptureError, match=r"Tensor\.item"):
        f(torch.randn(3))


def test_swallowed_capture_error_still_fails() -> None:
    def sneaky(x: torch.Tensor) -> torch.Tensor:
        with contextlib.suppress(Exception):
            x.item()
        return x + 1

    with pytest.raises(GraphCaptureError, match=r"Tensor\.item"):
        plait.capture(sneaky, (torch.randn(3),))


def test_fallback_runs_eagerly_warns_once_and_is_recorded() -> None:
    f = plait.compile(_bool, backend="eager")
    x = torch.randn(3)
    with pytest.warns(CaptureFallbackWarning, match="Tensor.__bool__") as record:
        assert torch.equal(f(x), _bool(x))
    assert len(record) == 1
    assert f"{__file__}:{_line_of('bool')}" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            y = torch.randn(3)
            assert torch.equal(f(y), _bool(y))
    assert len(f.specializations) == 1
    spec = f.specializations[0]
    assert spec.graph is None and spec.executor is None
    assert spec.fallback_reason is not None and "Tensor.__bool__" in spec.fallback_reason


def test_capture_without_fullgraph_returns_the_fallback() -> None:
    with pytest.warns(CaptureFallbackWarning):
        c = plait.capture(_item, (torch.randn(3),), fullgraph=False)
    assert c.graph is None and c.semantic_hash is None
    assert c.fallback_reason is not None and "Tensor.item" in c.fallback_reason


def test_fallback_keeps_guards_read_before_the_failure() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            return x * x.sum().item()
        return x.relu()

    cf = plait.compile(f, backend="eager")
    with pytest.warns(CaptureFallbackWarning):
        cf(torch.randn(4))
    x = torch.randn(1)
    assert torch.equal(cf(x), x.relu())
    assert cf.specializations[1].graph is not None
