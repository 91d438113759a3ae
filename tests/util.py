"""Test helpers shared across the suite."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import plait
import plait.contract
from plait.codegen import packed

# NOTE: probed, never assumed: CI's CPU build of PyTorch has both, so these tests run there
needs_packs = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or packed.unavailable() is not None,
    reason=f"no oneDNN weight serialization here: {packed.unavailable()}",
)
needs_bf16 = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="no oneDNN bfloat16 here",
)

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def contract_tol(op_class: str, dtype: object) -> dict[str, float]:
    """The numerical contract's ``rtol`` and ``atol`` for ``op_class`` at ``dtype``, as keyword
    arguments of ``torch.testing.assert_close`` (tests take tolerances from the contract only)."""
    tol = plait.contract.load().tolerance(op_class, dtype)
    return {"rtol": tol.rtol, "atol": tol.atol}


def assert_bitwise(a: Any, b: Any, what: str = "") -> None:
    """Equal bits, shape, dtype and device (NaNs compare by their bits, signed zeros differ)."""
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), what
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.device == b.device, f"{what}: device {a.device} != {b.device}"
    if a.dtype == torch.bool:
        assert torch.equal(a, b), what
        return
    if a.dtype.is_complex:  # NOTE: real and imaginary parts, each by its bits
        assert_bitwise(
            torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj()), what
        )
        return
    as_int = _SAME_SIZE_INT[a.element_size()]
    ia = a.detach().contiguous().view(as_int)
    ib = b.detach().contiguous().view(as_int)
    if not torch.equal(ia, ib):
        diff = (ia != ib).nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: differs first at {diff}: {a[tuple(diff)]} vs {b[tuple(diff)]}"
        )


def assert_grads_match_and_clear(
    model: torch.nn.Module, reference: torch.nn.Module, tol: dict[str, float]
) -> None:
    """Each parameter's gradient of ``model`` close to ``reference``'s (both present), then
    both cleared for the next step."""
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, **tol)
        p.grad, q.grad = None, None


def set_backend_flag(module: Any, name: str, value: Any) -> None:
    """Set a ``torch.backends`` flag (``cudnn.deterministic``) through its property's setter:
    assigning it raises once PyTorch's test utilities froze the flags (``disable_global_flags``,
    which importing ``torch.testing._internal.common_utils`` calls in that process)."""
    prop = inspect.getattr_static(type(module), name, None)
    if prop is None:  # NOTE: not a module's property (``mkldnn.matmul``'s own setattr)
        setattr(module, name, value)
    else:
        prop.setter(value)


def linear_called_at_high_precision(x: torch.Tensor) -> tuple[torch.nn.Module, Any]:
    """An ``nn.Linear`` and its compiled form, called once on ``x`` under float32 matmul
    precision "high" (a setting the gate refuses to judge), the precision restored after."""
    model = torch.nn.Linear(x.shape[-1], 4).eval()
    compiled = plait.compile(model, options={"cache": False})
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with torch.no_grad():
            compiled(x)
    finally:
        torch.set_float32_matmul_precision(before)
    return model, compiled


def ieee_sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of ``x`` (IEEE 754), independent of eager's kernel.

    Eager's CPU ``sqrt`` runs MKL's vector math where PyTorch links MKL; on some CPUs that is
    within 1 ulp but not correctly rounded (float32: ~14% of draws 1 ulp off on an AMD EPYC), so
    a kernel that must compute the IEEE root is checked against this. numpy's float64 root is
    the hardware's; a narrower float's root taken in float64 and rounded once is correctly rounded
    (53 >= 2p + 2 bits for p <= 24), so no double rounding can bite.

    >>> ieee_sqrt(torch.tensor([4.0, 2.0])).tolist() == [2.0, 2.0 ** 0.5]
    True
    """
    import numpy as np

    with np.errstate(invalid="ignore"):  # NOTE: negative arguments give NaN, as IEEE says
        root = torch.from_numpy(np.sqrt(x.detach().cpu().double().numpy()))
    return root.to(x.dtype)


def graph_structure(g: Any) -> list[object]:
    """Everything a parse decides, compared by value: inputs, each node's op, operands, attrs
    (with their Python types) and results, and the outputs."""
    rows: list[object] = [(v.name, v.kind, v.type) for v in g.inputs]
    for n in g.nodes:
        ops = [(type(o).__name__, o.name if hasattr(o, "name") else repr(o)) for o in n.inputs]
        attrs = sorted((k, type(v).__name__, repr(v)) for k, v in n.attrs.items())
        rows.append((n.op, ops, attrs, [(o.name, o.type) for o in n.outputs]))
    rows.append([getattr(o, "name", repr(o)) for o in g.outputs])
    return rows


def float_inputs(shape: tuple[int, ...], dtype: torch.dtype) -> Callable[[int], Any]:
    """A gate input factory: one fresh random float tensor per seed."""

    def make(seed: int) -> tuple[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=g).to(dtype),)

    return make


def token_inputs(shape: tuple[int, ...], vocab: int) -> Callable[[int], Any]:
    """A gate input factory: one fresh random token-id tensor per seed."""

    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)),)

    return make


def check_native(
    model: Any,
    factory: Callable[[int], Any],
    layouts: tuple[str, ...] = ("contiguous",),
    backend: str = "stax",
) -> Any:
    """``model`` compiled whole by ``backend`` passes the conformance gate (the "model" row,
    fresh draws) with no node falling back to PyTorch; returns the compiled model."""
    import plait
    import plait.conformance

    model.eval()
    compiled = plait.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda *xs: compiled(*xs), factory, candidate_module=model, op_class="model",
            layouts=layouts, draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    for spec in compiled.specializations:
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0 and counts["native"] > 0, counts
    return compiled


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` for the block, the caller's restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
