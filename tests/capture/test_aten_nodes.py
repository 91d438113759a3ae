"""Calls with no capture rule become typed ATen nodes (no opaque node, no fallback) when their
functional ATen graph is a faithful program, and stay opaque, counted and warned about, when it
is not. Each program is compiled with ``plait.compile`` (Stax) and compared with eager on fresh
draws (never only the capture sample), within the numerical contract."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.frontend import capture_program
from plait.ir import from_text, to_text

TOL = plait.contract.load()


def _draw(shape: tuple[int, ...], seed: int, positive: bool = False) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x.abs() + 0.25 if positive else x


def _close(got: Any, want: Any, op_class: str, what: str) -> None:
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert type(g) is torch.Tensor and g.shape == w.shape and g.dtype == w.dtype, what
        tol = TOL.tolerance(op_class, w.dtype)
        scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
        bound = tol.atol * scale + tol.rtol * w.abs()
        assert bool(((g - w).abs() <= bound).all()), f"{what}: {(g - w).abs().max()} over budget"


def _svd(x: torch.Tensor) -> Any:
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    # NOTE: singular vectors are unique up to sign: compare the reconstruction and the values
    return u @ torch.diag_embed(s) @ vh, s


# name: (program, argument shapes, op class of the contract, aten overloads it runs)
SINGLE: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], str, set[str]]] = {
    "lgamma": (lambda x: torch.lgamma(x.abs() + 0.5), [(4, 5)], "pointwise", {"aten.lgamma"}),
    "linalg_svd": (_svd, [(5, 3)], "matmul", {"aten._linalg_svd"}),
    "cdist": (lambda x, y: torch.cdist(x, y), [(4, 3), (6, 3)], "matmul", {"aten._cdist_forward"}),
    "huber_loss": (F.huber_loss, [(4, 5), (4, 5)], "reduction", {"aten.huber_loss"}),
}


def _check_no_fallback(compiled: Any, aten_ops: set[str]) -> Any:
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None
    assert spec.opaque_counts == {}
    m = spec.manifest
    assert m.fallbacks == []
    assert set(m.graph["aten_externs"]) == aten_ops
    externs = [n for n in m.executor["evidence"]["nodes"] if n["op"] in ("aten", "aten_factory")]
    assert {n["executor"] for n in externs} == {"extern"}
    assert {n["detail"].split(" ")[0] for n in externs} == aten_ops
    return spec


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_single_aten_op_call_is_an_extern_node(name: str) -> None:
    fn, shapes, op_class, aten_ops = SINGLE[name]
    compiled = plait.compile(fn)
    for seed in (0, 10, 20):  # NOTE: the capture draw, then two fresh ones
        args = [_draw(s, seed + i) for i, s in enumerate(shapes)]
        with torch.no_grad():
            _close(compiled(*args), fn(*args), op_class, f"{name} draw {seed}")
    _check_no_fallback(compiled, aten_ops)


def test_multi_output_svd_results_are_the_overload_results() -> None:
    fn = torch.linalg.svd
    compiled = plait.compile(fn)
    for seed in (0, 1):
        x = _draw((4, 6), seed)
        with torch.no_grad():
            got, want = compiled(x), fn(x)
        # NOTE: the same LAPACK call on the same values: the same signs
        _close(tuple(got), tuple(want), "matmul", f"draw {seed}")
        assert type(got) is type(want)  # NOTE: the structseq, as eager returns it
    _check_no_fallback(compiled, {"aten._linalg_svd"})


def _poisson_kl(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    kl = F.kl_div(x, t.softmax(-1), reduction="batchmean")
    return F.poisson_nll_loss(x, t) + kl + F.huber_loss(x, t)


def test_python_composite_decomposes_into_native_and_aten_nodes() -> None:
    compiled = plait.compile(_poisson_kl)
    for seed in (0, 5, 9):
        x, t = _draw((4, 6), seed), _draw((4, 6), seed + 1, positive=True)
        with torch.no_grad():
            _close(compiled(x, t), _poisson_kl(x, t), "reduction", f"draw {seed}")
    spec = _check_no_fallback(compiled, {"aten.huber_loss"})
    ops = [n.op for n in spec.graph.nodes]
    assert {"exp", "mul", "sub", "mean"} <= set(ops)  # NOTE: native IR ops from the table


def test_in_place_op_inside_a_composite_on_a_fresh_tensor() -> None:
    """poisson_nll_loss(full=True) adds the Stirling term in place (``add_`` on a tensor the
    composite made, left in the functionalized graph): its out-of-place form, no fallback."""

    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.poisson_nll_loss(x, t, log_input=False, full=True, reduction="sum")

    compiled = plait.compile(fn)
    for seed in (0, 4, 8):
        x, t = _draw((4, 6), seed, positive=True), 3 * _draw((4, 6), seed + 1, positive=True)
        with torch.no_grad():
            _close(compiled(x, t), fn(x, t), "reduction", f"draw {seed}")
    _check_no_fallback(compiled, {"aten.masked_fill.Scalar"})


def test_aten_extern_that_refuses_placeholder_values_compiles() -> None:
    """lu_solve refuses zero pivots: the planner's layout dry run (taken because the LU factor
    is column-major) cannot run it on placeholder values, and conforms its result instead of
    failing the compile."""

    def fn(b: torch.Tensor, lu: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
        return torch.linalg.lu_solve(lu, pivots, b)

    compiled = plait.compile(fn)
    for seed in (0, 6):
        lu, pivots = torch.linalg.lu_factor(_draw((4, 4), seed) + 4 * torch.eye(4))
        b = _draw((4, 3), seed + 1)
        with torch.no_grad():
            _close(compiled(b, lu, pivots), fn(b, lu, pivots), "matmul", f"draw {seed}")
    _check_no_fallback(compiled, {"aten.linalg_lu_solve"})


def test_call_returning_its_argument_returns_the_same_tensor() -> None:
    """atleast_2d of a 2-D tensor is the tensor itself (its ATen graph returns its input): the
    program's write through the result writes the argument, as eager's does."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.atleast_2d(x)
        y.mul_(3)
        return y + x

    compiled = plait.compile(fn)
    for seed in (0, 2):
        x = _draw((3, 4), seed)
        mine, theirs = x.clone(), x.clone()
        with torch.no_grad():
            got, want = compiled(mine), fn(theirs)
        assert torch.equal(got, want) and torch.equal(mine, theirs)
    (spec,) = compiled.specializations
    assert spec.opaque_counts == {} and spec.manifest.fallbacks == []


def test_factory_inside_a_call_is_an_aten_factory_node() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.linspace(0, 1, 6, dtype=torch.float64) * x

    compiled = plait.compile(fn)
    for seed in (0, 3):
        x = _draw((2, 6), seed).double()
        with torch.no_grad():
            assert torch.equal(compiled(x), fn(x))
    _check_no_fallback(compiled, {"aten.linspace"})


def _opaque(fn: Callable[..., Any], args: list[torch.Tensor]) -> Any:
    compiled = plait.compile(fn)
    with pytest.warns(CaptureFallbackWarning, match="opaque PyTorch nodes"), torch.no_grad():
        compiled(*args)
    (spec,) = compiled.specializations
    assert spec.opaque_counts, "the call should have stayed an opaque node"
    assert spec.manifest.graph["aten_externs"] == {}
    assert any(f["what"].startswith("opaque ") for f in spec.manifest.fallbacks)
    return compiled


def test_data_dependent_check_inside_stays_opaque() -> None:
    """gaussian_nll_loss raises when ``var`` has a negative entry (``torch.any(var < 0)``, a
    read of tensor data): no ATen graph can keep that check, so the call stays opaque and the
    compiled program still raises."""
    fn = F.gaussian_nll_loss
    args = [_draw((4, 3), 0), _draw((4, 3), 1), _draw((4, 3), 2, positive=True)]
    compiled = _opaque(fn, args)
    fresh = [_draw((4, 3), 7), _draw((4, 3), 8), _draw((4, 3), 9, positive=True)]
    with torch.no_grad():
        _close(compiled(*fresh), fn(*fresh), "reduction", "fresh draw")
    fresh[2][0, 0] = -1.0
    with pytest.raises(ValueError, match="negative"), torch.no_grad():
        compiled(*fresh)


def test_random_aten_op_is_a_random_aten_node() -> None:
    """poisson draws from torch's generator: a random ``aten`` node (no opaque node), run in
    program order, drawing eager's numbers and leaving the generator where eager leaves it."""
    fn = torch.poisson
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (3, 4):
        fresh = _draw((3, 4), seed, positive=True) * 2
        torch.manual_seed(seed)
        with torch.no_grad():
            got = compiled(fresh)
        after = torch.rand(4)
        torch.manual_seed(seed)
        assert torch.equal(got, fn(fresh))
        assert torch.equal(after, torch.rand(4))
    (spec,) = compiled.specializations
    assert [(n.op, n.attrs["name"]) for n in spec.graph.nodes] == [("aten", "poisson")]
    assert spec.opaque_counts == {}


def test_in_place_write_of_an_input_is_refused() -> None:
    """instance_norm with running stats writes them in place (a ``copy_`` in its ATen graph):
    no ATen program, no opaque node; the program runs eagerly, warned about and recorded, and
    the running stats are updated as eager updates them."""
    stats = (torch.zeros(3), torch.ones(3))
    eager_stats = (torch.zeros(3), torch.ones(3))

    def fn(x: torch.Tensor, running: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.instance_norm(x, running[0], running[1], use_input_stats=True)

    with pytest.raises(GraphCaptureError, match="writes its arguments"):
        plait.capture(lambda x: fn(x, stats), (_draw((2, 3, 4), 0),))
    compiled = plait.compile(lambda x: fn(x, stats))
    for seed in (1, 2):
        x = _draw((2, 3, 4), seed)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            got = compiled(x)
        if seed == 1:  # NOTE: warned once
            assert any(issubclass(w.category, CaptureFallbackWarning) for w in caught)
        assert torch.equal(got, fn(x, eager_stats))
        assert all(torch.equal(a, b) for a, b in zip(stats, eager_stats))
    (spec,) = compiled.specializations
    assert "in place" in str(spec.fallback_reason)


def test_data_dependent_shape_is_refused_loudly() -> None:
    # NOTE: nonzero itself is an aten_datadep node; a call with no capture rule reading its
    # data-dependent size is never ATen-traced on the sample's size
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x).cumprod(0)

    with pytest.raises(GraphCaptureError, match="data-dependent"):
        plait.capture(fn, (_draw((3, 4), 0),))
    compiled = plait.compile(fn)
    x = _draw((3, 4), 1)
    with pytest.warns(CaptureFallbackWarning):
        got = compiled(x)
    assert torch.equal(got, fn(x))
    assert compiled.specializations[0].manifest.fallbacks


def test_aten_node_text_round_trip() -> None:
    prog = capture_program(lambda x: torch.linalg.svd(x), (_draw((4, 3), 0),))
    text = to_text(prog.graph)
    assert "aten(" in text and '"_linalg_svd"' in text
    back = from_text(text)
    assert to_text(back) == text
    (node,) = back.nodes
    assert [str(v.type) for v in node.outputs] == ["f32[4, 4]", "f32[3]", "f32[3, 3]"]


def test_type_rule_follows_new_shapes() -> None:
    """A new shape recompiles; the aten node's types come from the meta kernel, never from the
    first sample."""
    fn = torch.cdist
    compiled = plait.compile(fn)
    for shapes in [((4, 3), (6, 3)), ((2, 5, 3), (2, 7, 3))]:
        x, y = _draw(shapes[0], 1), _draw(shapes[1], 2)
        with torch.no_grad():
            _close(compiled(x, y), fn(x, y), "matmul", str(shapes))
    second = compiled.specializations[-1]
    (node,) = [n for n in second.graph.nodes if n.op == "aten"]
    assert str(node.outputs[0].type) == "f32[2, 5, 7]"


def test_aten_type_rule_rejects_symbolic_and_bad_operands() -> None:
    from plait.ir import GraphBuilder, TensorType
    from plait.ir.ops import TypeRuleError

    gb = GraphBuilder()
    x = gb.input("x", TensorType((3, 4), torch.float32))
    with pytest.raises(TypeRuleError, match="meta kernel"):
        gb.call("aten", [x, x], name="mm", overload="default")
    with pytest.raises(TypeRuleError, match="not an ATen overload name"):
        gb.call("aten", [x], name="os.system", overload="default")
    with pytest.raises(TypeRuleError, match="writes or aliases"):
        gb.call("aten", [x], name="add_", overload="Scalar", literals='[{"t": 0}, 1]')
    with pytest.raises(TypeRuleError, match="returns nothing"):
        gb.call("aten", [x], name="_assert_async", overload="default")
    with pytest.raises(TypeRuleError, match="no runtime check"):
        gb.call("aten_check", [x], name="mm", overload="default")


def test_aten_nodes_warm_start_from_the_cache(tmp_path: Any) -> None:
    fn = _poisson_kl
    x, t = _draw((4, 6), 0), _draw((4, 6), 1, positive=True)
    cold = plait.compile(fn, options={"cache": str(tmp_path)})
    with torch.no_grad():
        want = cold(x, t)
    warm = plait.compile(fn, options={"cache": str(tmp_path)})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        got = warm(x, t)
    (spec,) = warm.specializations
    assert spec.manifest.cache["status"] == "hit"
    assert spec.manifest.graph["aten_externs"] == {"aten.huber_loss": 1}
    assert torch.equal(got, want)
