"""Calls that used to make the whole program fall back now become graph nodes: opaque nodes
with tensor keyword arguments and literals of every kind PyTorch ops accept (dtypes, devices,
memory formats, layouts, slices, Ellipsis, tuples, complex numbers, floats by their bits),
argument combinations a rule's IR op cannot express, in-place calls with no rule
(functionalized through their out-of-place form), ``torch._assert`` on a guarded size. Each
is compared bitwise with eager on fresh inputs, twice, through ``plait.compile``, and its
specialization has no fallback."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.frontend import capture_program
from plait.ir import from_text, to_text
from tests.capture.helpers import assert_same, opaque_path  # noqa: F401  (fixture)

# NOTE: these tests exercise opaque nodes: the ATen trace, which comes first, is off
pytestmark = pytest.mark.usefixtures("opaque_path")


def _nan_with_payload(sign: int = 0) -> float:
    (value,) = struct.unpack("<d", struct.pack("<Q", (sign << 63) | 0x7FF8000000000123))
    return float(value)


def _index(x: torch.Tensor) -> torch.Tensor:
    return x.abs().argsort(1)


# name: (program on a 4x6 float tensor, targets of the opaque nodes its graph must hold)
CASES: dict[str, tuple[Any, list[str]]] = {
    "index_add_keywords": (
        lambda x: torch.index_add(x, 1, index=_index(x)[0], source=x * 2),
        ["torch.index_add"],
    ),
    "searchsorted_sorter_keyword": (
        lambda x: torch.searchsorted(x, x[:, :2].contiguous(), sorter=_index(x)),
        ["torch.searchsorted"],
    ),
    "tuple_of_tensors": (
        lambda x: torch.linalg.multi_dot((x, (x * 2).t())) + torch.cdist(x, x * 3, p=1.0)[0, 0],
        ["torch.linalg.multi_dot", "torch.functional.cdist"],
    ),
    "lerp_keyword_tensors": (lambda x: torch.lerp(x, end=x * 2, weight=0.5), ["torch.lerp"]),
    "dtype": (lambda x: x.cumprod(0, dtype=torch.float64), ["torch.Tensor.cumprod"]),
    "device": (
        lambda x: torch.cumprod(x, 0).new_ones((2, 3), device=torch.device("cpu")) * x[:2, :3],
        ["torch.cumprod"],
    ),
    "dtype_and_device_keywords": (
        lambda x: torch.asarray(x * 2, dtype=torch.float64, device=torch.device("cpu")),
        ["torch.asarray"],
    ),
    "tuple_to_python_function": (
        lambda x: F.fold(x[None], (3, 4), (2, 2)),
        ["torch.nn.functional.fold"],
    ),
    "unfold_tuple": (lambda x: F.unfold(x[None, None], (2, 3)), ["torch.nn.functional.unfold"]),
    "negative_nan_literal": (
        lambda x: torch.nan_to_num(x.log(), _nan_with_payload(sign=1)),
        ["torch.nan_to_num"],
    ),
    "nan_payload_literal": (
        lambda x: torch.nan_to_num(x.log(), _nan_with_payload()),
        ["torch.nan_to_num"],
    ),
    "two_index_tensors_slices_ellipsis": (
        lambda x: (
            # NOTE: None between the index tensors: not adjacent, so no native gather
            x[_index(x)[:, :2] % 4, None, ..., torch.tensor([[1, 3]])]
            + x[1:3, None][..., ::2].sum()
        ),
        ["torch.Tensor.__getitem__"],
    ),
    "max_with_indices": (lambda x: x.max(1), ["torch.Tensor.max"]),
    "max_pool_indices": (
        lambda x: F.max_pool2d(x[None], (2, 2), return_indices=True),
        ["torch.nn.functional.max_pool2d_with_indices"],
    ),
    "max_unpool_tuple": (
        lambda x: F.max_unpool2d(*F.max_pool2d(x[None], (2, 2), return_indices=True), (2, 2)),
        ["torch.nn.functional.max_pool2d_with_indices", "torch.nn.functional.max_unpool2d"],
    ),
    "inplace_rrelu_keyword": (
        lambda x: F.rrelu(x * 2, training=False, inplace=True) + 1,
        ["torch.nn.functional.rrelu"],
    ),
    "inplace_rrelu_positional": (
        lambda x: F.rrelu(x * 2, 0.125, 0.25, False, True) + 1,
        ["torch.nn.functional.rrelu"],
    ),
    "inplace_method_through_a_view": (
        lambda x: _write_view(x),
        ["torch.Tensor.cumprod"],
    ),
    "inplace_module": (
        torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.RReLU(inplace=True)).eval(),
        ["torch.nn.functional.rrelu"],
    ),
}


def _write_view(x: torch.Tensor) -> torch.Tensor:
    y = x * 3
    y[1:3].cumprod_(1)
    return y


def _opaque_targets(graph: Any) -> list[str]:
    return sorted(n.attrs["target"] for n in graph.nodes if n.op == "opaque")


def _fresh(i: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 + i)).abs() + 0.25


@pytest.mark.parametrize("name", sorted(CASES))
def test_call_becomes_a_node_not_a_fallback(name: str) -> None:
    fn, targets = CASES[name]
    compiled = plait.compile(fn, backend="eager")
    for i in range(3):
        x = _fresh(i)
        if i == 1:
            x = -x  # NOTE: negative values: the nan literals are used
        if i == 0:
            with pytest.warns(CaptureFallbackWarning, match="opaque PyTorch nodes"):
                got = compiled(x)
        else:
            got = compiled(x)
        assert_same(got, fn(x), f"call {i}")
    assert len(compiled.specializations) == 1
    spec = compiled.specializations[0]
    assert spec.fallback_reason is None, spec.fallback_reason
    assert set(targets) <= set(_opaque_targets(spec.graph)), _opaque_targets(spec.graph)
    # NOTE: the manifest records the opaque nodes, and no whole-program fallback
    records = spec.manifest.fallbacks
    assert records and all(r["what"].startswith("opaque ") for r in records), records
    back = from_text(to_text(spec.graph))  # NOTE: the literals survive the IR's text form
    assert to_text(back) == to_text(spec.graph)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_calls_are_errors_under_fullgraph(name: str) -> None:
    fn, _ = CASES[name]
    with pytest.raises(GraphCaptureError, match="capture rule") as info:
        plait.capture(fn, (_fresh(0),))
    assert info.value.kind == "unsupported"


def test_stax_runs_the_opaque_literals() -> None:
    fn = CASES["two_index_tensors_slices_ellipsis"][0]
    compiled = plait.compile(fn, options={"cache": False})
    with pytest.warns(CaptureFallbackWarning):
        compiled(_fresh(0))
    for i in (1, 2):
        assert_same(compiled(_fresh(i)), fn(_fresh(i)), f"call {i}")
    assert compiled.specializations[0].fallback_reason is None


def test_literals_decode_to_the_values_they_encode() -> None:
    from plait.frontend.call_encoding import _encode
    from plait.ir.ops.call_literals import decode_literal

    nan = _nan_with_payload(1)
    value = (
        torch.float16,
        torch.device("cpu"),
        torch.channels_last,
        torch.strided,
        slice(1, None, 2),
        ...,
        (1, [2, (3,)]),
        torch.Size([2, 3]),
        complex(1.5, -0.0),
        nan,
        {"a": (1,)},
        None,
        True,
        "s",
    )
    back = decode_literal(_encode(value, []), [])
    assert type(back) is tuple and len(back) == len(value)
    for a, b in zip(back, value):
        assert type(a) is type(b)
        if isinstance(b, float):
            assert struct.pack("<d", a) == struct.pack("<d", b)
        elif isinstance(b, complex):
            assert struct.pack("<dd", a.real, a.imag) == struct.pack("<dd", b.real, b.imag)
        else:
            assert a == b
    assert type(back[6][1]) is list and type(back[6][1][1]) is tuple


def test_assert_on_a_guarded_size_is_that_guard() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.shape[0] == 4, "needs 4 rows")
        return x * 2

    compiled = plait.compile(fn, backend="eager", fullgraph=True)
    for i in range(2):
        assert_same(compiled(_fresh(i)), fn(_fresh(i)))
    assert any(
        "x.shape[0] == 4" in g.text or "shape[0]" in g.text
        for g in compiled.specializations[0].guards
    )
    with pytest.raises(AssertionError, match="needs 4 rows"):
        compiled(torch.randn(3, 6))


def test_assert_on_a_tensor_is_a_data_read() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.sum() > 0, "positive")
        return x

    with pytest.raises(GraphCaptureError, match="_assert on a tensor") as info:
        plait.capture(fn, (_fresh(0),))
    assert info.value.kind == "data-dependent"


def test_a_device_made_inside_the_program_is_a_constant() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        dev = torch.device("cpu")
        return torch.arange(6, device=dev) * x

    compiled = plait.compile(fn, backend="eager", fullgraph=True)
    for i in range(2):
        assert_same(compiled(_fresh(i)), fn(_fresh(i)))


def test_an_inplace_call_without_an_out_of_place_form_keeps_the_fallback() -> None:
    prog = capture_program(lambda x: (x * 1).fill_diagonal_(2.0), (_fresh(0),), fullgraph=False)
    assert prog.graph is None
    assert "no out-of-place form" in str(prog.fallback_reason)


def test_an_inplace_random_call_is_not_functionalized() -> None:
    prog = capture_program(lambda x: (x * 1).exponential_(), (_fresh(0),), fullgraph=False)
    assert prog.graph is None
    assert "in place" in str(prog.fallback_reason)


_COUNTS = torch.zeros(4, 6)


def _writes_a_captured_tensor(x: torch.Tensor) -> torch.Tensor:
    _COUNTS.cumprod_(1)  # NOTE: no tracer among the arguments
    return x + _COUNTS


def test_an_inplace_call_on_a_captured_tensor_writes_it_back() -> None:
    compiled = plait.compile(_writes_a_captured_tensor, backend="eager")
    _COUNTS.copy_(torch.arange(24.0).reshape(4, 6))
    reference = _COUNTS.clone()
    for i in range(2):
        x = _fresh(i)
        with pytest.warns(CaptureFallbackWarning) if i == 0 else contextlib.nullcontext():
            got = compiled(x)
        reference.cumprod_(1)
        assert_same(got, x + reference, f"call {i}")
        assert_same(_COUNTS, reference, f"state {i}")
    assert compiled.specializations[0].fallback_reason is None
