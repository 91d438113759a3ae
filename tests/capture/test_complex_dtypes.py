"""complex64 and complex128 values in programs: every ``torch.fft`` function, ``view_as_real`` /
``view_as_complex``, ``polar``, ``complex``, abs/angle of complex tensors, complex inputs,
outputs, constants and scalars. Complex math runs only in PyTorch's kernels (``aten`` extern
nodes): every native op refuses complex operands and results in one registry check, so a call
that a capture rule would lower natively becomes an ``aten`` node. The nodes call the ATen
overloads eager calls, in eager's order, so results are compared bit for bit, on the capture
draw and on fresh ones."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.conformance
import plait.contract
from plait.cache.artifact import pack, unpack
from plait.errors import CaptureFallbackWarning
from plait.ir import GraphBuilder, TensorType, from_text, to_text
from plait.ir.identity import semantic_hash
from plait.ir.ops import TypeRuleError, all_ops, get_op
from plait.ir.ops.registry import COMPLEX_OPS
from tests.util import assert_bitwise


def _real(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _complex(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.complex64) -> Any:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _leaves(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _compile_and_compare(
    fn: Callable[..., Any], make: Callable[[int], tuple[Any, ...]], **options: Any
) -> Any:
    """Compile ``fn`` (default backend unless ``options`` name one), compare against eager on
    the capture draw and two fresh ones, bit for bit; the program must run whole (no fallback,
    no opaque node)."""
    compiled = plait.compile(fn, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a fallback warns
        for seed in (0, 11, 23):
            args = make(seed)
            got, want = _leaves(compiled(*args)), _leaves(fn(*args))
            assert len(got) == len(want)
            for i, (g, w) in enumerate(zip(got, want)):
                assert_bitwise(g, w, f"draw {seed}, result {i}")
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None
    assert spec.opaque_counts == {}
    assert spec.manifest.fallbacks == []
    return spec


def _native_complex_nodes(spec: Any) -> list[str]:
    """Nodes other than aten nodes that take or give a complex tensor (there must be none)."""
    found = []
    for node in spec.graph.nodes:
        types = [v.type for v in (*node.inputs, *node.outputs) if hasattr(v, "type")]
        complex_types = [t for t in types if isinstance(t, TensorType) and t.dtype.is_complex]
        if complex_types and node.op not in COMPLEX_OPS:
            found.append(node.op)
    return found


# name: (program, whether it takes a complex input)
FFT: dict[str, tuple[Callable[..., Any], bool]] = {
    "fft": (lambda x: torch.fft.fft(x), False),
    "fft_n_norm": (lambda x: torch.fft.fft(x, n=10, norm="ortho"), False),
    "ifft": (lambda z: torch.fft.ifft(z), True),
    "rfft": (lambda x: torch.fft.rfft(x), False),
    "irfft": (lambda z: torch.fft.irfft(z), True),
    "hfft": (lambda z: torch.fft.hfft(z), True),
    "ihfft": (lambda x: torch.fft.ihfft(x), False),
    "fft2": (lambda x: torch.fft.fft2(x), False),
    "ifft2": (lambda z: torch.fft.ifft2(z), True),
    "rfft2": (lambda x: torch.fft.rfft2(x), False),
    "irfft2": (lambda z: torch.fft.irfft2(z), True),
    "hfft2": (lambda z: torch.fft.hfft2(z), True),
    "ihfft2": (lambda x: torch.fft.ihfft2(x), False),
    "fftn": (lambda x: torch.fft.fftn(x, dim=(0, 2)), False),
    "ifftn": (lambda z: torch.fft.ifftn(z), True),
    "rfftn": (lambda x: torch.fft.rfftn(x, norm="forward"), False),
    "irfftn": (lambda z: torch.fft.irfftn(z, s=(4, 5, 8)), True),
    "hfftn": (lambda z: torch.fft.hfftn(z), True),
    "ihfftn": (lambda x: torch.fft.ihfftn(x), False),
    "fftshift": (lambda z: torch.fft.fftshift(torch.fft.fft(z)), True),
    "ifftshift": (lambda x: torch.fft.ifftshift(x, dim=1), False),
}


@pytest.mark.parametrize("name", sorted(FFT))
def test_fft_op_compiles_whole_and_equals_eager(name: str) -> None:
    fn, complex_input = FFT[name]
    shape = (4, 5, 6)

    def make(seed: int) -> tuple[Any, ...]:
        return (_complex(shape, seed) if complex_input else _real(shape, seed),)

    spec = _compile_and_compare(fn, make)
    assert _native_complex_nodes(spec) == []


VIEWS_AND_CONSTRUCTORS: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[Any, ...]]]] = {
    "view_as_complex": (torch.view_as_complex, lambda s: (_real((3, 4, 2), s),)),
    "view_as_real": (torch.view_as_real, lambda s: (_complex((3, 4), s),)),
    "view_as_real_of_computed": (
        lambda x: torch.view_as_real(torch.view_as_complex(x) * 2) + 1,
        lambda s: (_real((3, 4, 2), s),),
    ),
    "polar": (torch.polar, lambda s: (_real((3, 4), s).abs(), _real((3, 4), s + 1))),
    "complex": (torch.complex, lambda s: (_real((3, 4), s), _real((3, 4), s + 1))),
    "complex_f64": (
        torch.complex,
        lambda s: (_real((5,), s, torch.float64), _real((5,), s + 1, torch.float64)),
    ),
    "abs_angle": (lambda z: (z.abs(), z.angle()), lambda s: (_complex((3, 4), s),)),
    "real_imag_conj": (
        lambda z: (z.real * 2, z.imag + 1, torch.conj_physical(z)),
        lambda s: (_complex((3, 4), s),),
    ),
}


@pytest.mark.parametrize("name", sorted(VIEWS_AND_CONSTRUCTORS))
def test_complex_views_and_constructors_equal_eager(name: str) -> None:
    fn, make = VIEWS_AND_CONSTRUCTORS[name]
    spec = _compile_and_compare(fn, make)
    assert _native_complex_nodes(spec) == []


# name: (program, input maker)
REREAD_VIEWS: dict[str, tuple[Callable[..., Any], Callable[[int], torch.Tensor]]] = {
    "view_as_complex": (torch.view_as_complex, lambda s: _real((5, 4, 2), s)),
    "view_as_complex_of_slice": (
        lambda x: torch.view_as_complex(x[1:]),
        lambda s: _real((5, 4, 2), s),
    ),
    "view_as_real": (torch.view_as_real, lambda s: _complex((5, 4), s)),
    "view_as_real_of_transpose": (
        lambda z: torch.view_as_real(z.t()),
        lambda s: _complex((5, 4), s, torch.complex128),
    ),
}


@pytest.mark.parametrize("name", sorted(REREAD_VIEWS))
def test_output_view_of_an_input_as_another_dtype_shares_its_memory(name: str) -> None:
    """Eager returns a view of the input read as another dtype; so does the compiled program
    (its geometry counts elements of the view's dtype, not the input's)."""
    fn, make = REREAD_VIEWS[name]
    compiled = plait.compile(fn)
    for seed in (0, 1, 2):
        x = make(seed)
        got, want = compiled(x), fn(x)
        assert_bitwise(got, want, f"draw {seed}")
        assert got.data_ptr() == want.data_ptr() and got.stride() == want.stride()
        with torch.no_grad():
            x.mul_(2)  # NOTE: a write to the input shows in the view, as in eager
        assert_bitwise(got, want, f"draw {seed} after a write to the input")
    assert compiled.specializations[0].opaque_counts == {}


# NOTE: calls whose capture rules lower real tensors to native IR ops (pointwise, reductions,
# matmul, cat/views, pads); given complex tensors each must become an aten node, never a native
# kernel that would compute the real part alone or reinterpret the bytes.
NATIVE_RULES: dict[str, Callable[..., Any]] = {
    "mul": lambda z, w: z * w,
    "add_complex_scalar": lambda z, w: z + (1.5 - 2j),
    "mul_real_tensor": lambda z, w: z * w.real,
    "sum": lambda z, w: z.sum(dim=1),
    "mean": lambda z, w: z.mean(),
    "exp": lambda z, w: torch.exp(z),
    "sigmoid": lambda z, w: torch.sigmoid(z),
    "tanh": lambda z, w: torch.tanh(z),
    "matmul": lambda z, w: z @ w.T,
    "linear": lambda z, w: torch.nn.functional.linear(z, w),
    "cat": lambda z, w: torch.cat([z, w], dim=0),
    "stack_permute_reshape": lambda z, w: torch.stack([z, w]).permute(2, 0, 1).reshape(-1, 3),
    "pad": lambda z, w: torch.nn.functional.pad(z, (1, 2)),
    "where": lambda z, w: torch.where(z.real > 0, z, w),
    "to_real_dtype": lambda z, w: (z * w).abs().to(torch.float64),
    "clone_contiguous": lambda z, w: z.t().contiguous().clone(),
}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=["c64", "c128"])
@pytest.mark.parametrize("name", sorted(NATIVE_RULES))
def test_native_rule_with_complex_operand_becomes_aten_node(name: str, dtype: torch.dtype) -> None:
    fn = NATIVE_RULES[name]

    def make(seed: int) -> tuple[Any, ...]:
        return _complex((4, 3), seed, dtype), _complex((4, 3), seed + 1, dtype)

    spec = _compile_and_compare(fn, make)
    assert _native_complex_nodes(spec) == []
    assert any(n.op == "aten" for n in spec.graph.nodes)


def test_complex_result_computed_under_no_grad_is_detached() -> None:
    """Inside ``torch.no_grad()`` with inputs that require grad, a result is a ``detach`` of
    the computed value: that op takes complex values (it is the value itself)."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            z = torch.fft.fft(x)
        return z, torch.view_as_real(z) * x.unsqueeze(-1)

    compiled = plait.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)  # NOTE: the backward compiles
        for seed in (0, 1, 2):
            x = _real((8,), seed).requires_grad_()
            ref = x.detach().clone().requires_grad_()
            got, want = compiled(x), fn(ref)
            for g, w in zip(got, want):
                assert_bitwise(g, w, f"draw {seed}")
                assert g.requires_grad == w.requires_grad
            got[1].sum().backward()
            want[1].sum().backward()
            # NOTE: the gradient is the detached value itself, summed over its last dim
            tol = plait.contract.load().tolerance("pointwise", "float32")
            torch.testing.assert_close(x.grad, ref.grad, rtol=tol.rtol, atol=tol.atol)
    (spec,) = compiled.specializations
    assert spec.compiled.manifest.autograd["wrt"]
    assert spec.opaque_counts == {} and spec.fallback_reason is None
    assert "detach" in [n.op for n in spec.graph.nodes]


def test_complex_relu_and_softmax_raise_as_eager_does() -> None:
    z = _complex((3, 4), 0)
    for fn in (torch.relu, lambda t: torch.softmax(t, -1)):
        with pytest.raises(RuntimeError) as eager:
            fn(z)
        with pytest.raises(RuntimeError) as compiled:
            plait.compile(fn)(z)
        assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_program_with_complex_inputs_outputs_and_constant(backend: str) -> None:
    kernel = _complex((8,), 99, torch.complex128)

    def fn(z: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spectrum = torch.fft.fft(z) * kernel
        return torch.fft.ifft(spectrum), torch.fft.irfft(torch.fft.rfft(x) * 0.5j, n=8)

    def make(seed: int) -> tuple[Any, ...]:
        return _complex((2, 8), seed, torch.complex128), _real((2, 8), seed + 1)

    spec = _compile_and_compare(fn, make, backend=backend)
    assert [str(v.type) for v in spec.graph.inputs][:2] == ["c128[2, 8]", "f32[2, 8]"]


def test_input_dtype_is_guarded() -> None:
    compiled = plait.compile(lambda z: torch.fft.fft(z) * 2)
    for dtype in (torch.complex64, torch.complex128, torch.complex64):
        z = _complex((6,), 3, dtype)
        assert_bitwise(compiled(z), torch.fft.fft(z) * 2, str(dtype))
    assert sorted(str(s.graph.inputs[0].type) for s in compiled.specializations) == [
        "c128[6]",
        "c64[6]",
    ]


def test_complex_constant_survives_the_artifact_cache(tmp_path: Any) -> None:
    kernel = _complex((6,), 5, torch.complex128)
    small = _complex((6,), 6, torch.complex64)

    def fn(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return z * kernel, torch.view_as_real(z.to(torch.complex64) * small)

    statuses = []
    for seed in (1, 2):  # NOTE: a cold compile saves, a second compile loads the entry
        compiled = plait.compile(fn, options={"cache": str(tmp_path)})
        z = _complex((6,), seed, torch.complex128)
        for g, w in zip(compiled(z), fn(z)):
            assert_bitwise(g, w, f"compile {seed}")
        statuses.append(compiled.specializations[0].manifest.cache["status"])
    assert statuses[-1] == "hit", statuses


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=["c64", "c128"])
def test_artifact_payload_keeps_complex_tensors(dtype: torch.dtype) -> None:
    # NOTE: safetensors has no complex128: it is stored as float64 pairs and read back
    tensors = {"w": _complex((3, 5), 7, dtype), "b": _real((4,), 8), "c": _complex((2,), 9)}
    doc, back = unpack(pack({"graph": "g"}, tensors))
    assert doc == {"graph": "g"} and sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert_bitwise(back[name], t, name)


def test_gate_judges_complex_results() -> None:
    fn = lambda z: torch.fft.fft(z) * (1 + 1j)
    compiled = plait.compile(fn)
    z = _complex((4, 6), 0)
    report = plait.conformance.check(fn, compiled, (z,), bitwise=True)
    assert report.ok, str(report)
    wrong = lambda z: torch.fft.fft(z) * (1 - 1j)  # NOTE: the imaginary part negated
    bad = plait.conformance.check(fn, wrong, (z,))
    assert not bad.ok


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=["c64", "c128"])
def test_gate_judges_complex_by_the_row_of_its_parts(dtype: torch.dtype) -> None:
    """complex64 is float32 pairs: a result as accurate as float32 allows passes (computed in
    complex128, rounded once), one off by a hundred times the float32 (or float64) row fails."""
    rtol = plait.contract.load().tolerance("pointwise", dtype.to_real()).rtol
    fn = lambda z: torch.fft.fft(z)
    wider = lambda z: torch.fft.fft(z.to(torch.complex128)).to(z.dtype)
    off = lambda z: torch.fft.fft(z) * (1 + 100 * rtol)
    z = _complex((4, 64), 0, dtype)
    good = plait.conformance.check(fn, wider, (z,), op_class="pointwise")
    assert good.ok, str(good)
    assert not plait.conformance.check(fn, off, (z,), op_class="pointwise").ok


def test_ir_text_and_hash_carry_complex_dtypes() -> None:
    gb = GraphBuilder()
    z = gb.input("z", TensorType((4, 3), torch.complex64))
    w = gb.input("w", TensorType((3,), torch.complex128))
    (p,) = gb.call("aten", [z, w], name="mul", overload="Tensor")
    gb.output(p)
    graph = gb.build()
    text = to_text(graph)
    assert "c64[4, 3]" in text and "c128[3]" in text and ": c128[4, 3]" in text
    assert to_text(from_text(text)) == text
    assert semantic_hash(from_text(text)) == semantic_hash(graph)
    other = text.replace("c64[4, 3]", "c128[4, 3]")
    assert semantic_hash(from_text(other)) != semantic_hash(graph)


def _valid_call(name: str, x: Any) -> Any:
    """A one-operand call of a native op that its type rule accepts for a real tensor."""
    gb = GraphBuilder()
    v = gb.input("x", x)
    op = get_op(name)
    try:
        gb.call(name, *[v for _ in op.params])
    except (TypeRuleError, ValueError, TypeError):
        return None
    return gb


def test_every_native_op_refuses_complex_operands() -> None:
    real, cplx = TensorType((4, 4), torch.float32), TensorType((4, 4), torch.complex64)
    checked = []
    for name, op in sorted(all_ops().items()):
        if name in COMPLEX_OPS or not op.params or op.params[0].kind == "tensor*":
            continue
        if _valid_call(name, real) is None:
            continue  # NOTE: needs attributes or other operands; the registry check is shared
        gb = GraphBuilder()
        v = gb.input("x", cplx)
        with pytest.raises(TypeRuleError, match="complex"):
            gb.call(name, *[v for _ in op.params])
        checked.append(name)
    assert {"mul", "add", "relu", "exp", "sum", "matmul", "contiguous"} <= set(checked)
    gb = GraphBuilder()
    v = gb.input("x", cplx)
    with pytest.raises(TypeRuleError, match="complex"):
        gb.call("cat", [v, v])
    with pytest.raises(TypeRuleError, match="complex"):  # NOTE: a complex result is refused too
        gb.call("to_dtype", gb.input("y", real), dtype=torch.complex64)
