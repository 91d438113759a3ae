"""Training through Stax: compiled forward and backward judged against eager by the gate."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
import plait.contract
from plait.autograd import DoubleBackwardError
from plait.errors import CaptureFallbackWarning
from tests.conformance.models import MLP, randn, seeded


class Pointwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.sin(x * self.w) + self.b) * torch.exp(self.b)


def _compiled(model: nn.Module, **options: object) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a backward that fell back to eager warns
        return plait.compile(copy.deepcopy(model), backend="stax", **options)


def _manifest(compiled: nn.Module) -> plait.Manifest:
    return compiled.specializations[-1].compiled.manifest


def _assert_backward_compiled(compiled: nn.Module) -> None:
    m = _manifest(compiled)
    assert m.autograd, "no compiled backward recorded"
    assert not m.fallbacks, m.fallbacks
    assert m.executor["backward"]["evidence"]["counts"]["fallback"] == 0


MODELS = {
    "pointwise": (lambda: seeded(3, Pointwise), lambda s: randn(4, 8, 16, seed=s)),
    "mlp": (lambda: seeded(1, MLP), lambda s: randn(8, 16, seed=s)),
}


@pytest.mark.parametrize("partitioner", ["min-cut", "save-all"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_pass_the_gate(name: str, partitioner: str) -> None:
    make, draw = MODELS[name]
    model = make()
    compiled = _compiled(model, options={"partitioner": partitioner})
    report = plait.conformance.check(model, compiled, draw, grads=True, draws=3)
    report.raise_if_failed()
    _assert_backward_compiled(compiled)
    assert _manifest(compiled).autograd["partitioner"] == partitioner


def test_min_cut_saves_no_more_than_save_all() -> None:
    make, draw = MODELS["pointwise"]
    model = make()
    saved = {}
    for p in ("min-cut", "save-all"):
        c = _compiled(model, options={"partitioner": p})
        c(draw(5)).sum().backward()
        saved[p] = _manifest(c).autograd["saved_bytes"]
    assert saved["min-cut"] <= saved["save-all"]


def test_grad_accumulates_over_calls_and_frozen_parameters_get_none() -> None:
    make, draw = MODELS["pointwise"]
    model = make()
    model.b.requires_grad_(False)
    compiled = _compiled(model)
    x1, x2 = draw(1), draw(2)
    # NOTE: two forwards, then both backwards: each call's saved values are its own
    y1, y2 = compiled(x1), compiled(x2)
    g1, g2 = torch.randn_like(y1), torch.randn_like(y2)
    y2.backward(g2)
    y1.backward(g1)
    model(x1).backward(g1)
    model(x2).backward(g2)
    torch.testing.assert_close(compiled.w.grad, model.w.grad)
    assert compiled.b.grad is None and model.b.grad is None
    _assert_backward_compiled(compiled)


def test_hooks_on_inputs_see_the_gradient() -> None:
    make, draw = MODELS["pointwise"]
    model = make()
    compiled = _compiled(model)
    seen: list[torch.Tensor] = []
    x = draw(3).requires_grad_(True)
    x.register_hook(lambda g: seen.append(g.clone()))
    compiled(x).sum().backward()
    ref = x.detach().clone().requires_grad_(True)
    model(ref).sum().backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], ref.grad)


def test_double_backward_names_the_problem() -> None:
    make, draw = MODELS["pointwise"]
    compiled = _compiled(make())
    x = draw(4).requires_grad_(True)
    with pytest.raises(DoubleBackwardError, match=r"Pointwise.*second-order gradient"):
        torch.autograd.grad(compiled(x).sum(), x, create_graph=True)


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adamw"])
def test_optimizer_steps_match_eager_without_recompiling(optimizer: str) -> None:
    make, draw = MODELS["pointwise"]
    model = make()
    compiled = _compiled(model)

    def opt(m: nn.Module) -> torch.optim.Optimizer:
        if optimizer == "adamw":
            return torch.optim.AdamW(m.parameters(), lr=1e-2)
        return torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)

    opt_ref, opt_c = opt(model), opt(compiled)
    for step in range(5):
        x = draw(10 + step)
        for m, o in ((model, opt_ref), (compiled, opt_c)):
            o.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
    tol = plait.contract.load().tolerance("model", "float32")
    for (name, p), q in zip(model.named_parameters(), compiled.parameters()):
        what = f"parameter {name} after 5 {optimizer} steps"
        torch.testing.assert_close(
            q, p, rtol=tol.rtol, atol=tol.atol, msg=lambda m, what=what: f"{what}: {m}"
        )
    # NOTE: parameters written in place by the optimizer are not frozen: one specialization
    assert len(compiled.specializations) == 1


def _grads_as_eager(fn: Any, compiled: Any, inputs: list[torch.Tensor], g: torch.Tensor) -> Any:
    """Backward through ``compiled`` and through ``fn`` from copies of ``inputs``; asserts the
    input gradients are eager's, bit for bit; returns the compiled result."""
    ours = [t.clone().requires_grad_(True) for t in inputs]
    theirs = [t.clone().requires_grad_(True) for t in inputs]
    y = compiled(*ours)
    y.backward(g)
    fn(*theirs).backward(g)
    for a, b in zip(ours, theirs):
        assert a.grad is not None and torch.equal(a.grad, b.grad)
    return y


def seeded_grads_as_eager(
    fn: Any,
    compiled: Any,
    inputs: list[torch.Tensor],
    g: torch.Tensor,
    seed: int,
    tol: dict[str, float],
) -> None:
    """``compiled`` and ``fn`` from copies of ``inputs``, each run after ``manual_seed(seed)``
    (the same random draws): eager's result has no NaN, and the results and the inputs'
    gradients from ``g`` match within ``tol``."""
    ours = [t.clone().requires_grad_(True) for t in inputs]
    theirs = [t.clone().requires_grad_(True) for t in inputs]
    torch.manual_seed(seed)
    got = compiled(*ours)
    torch.manual_seed(seed)
    want = fn(*theirs)
    assert not want.isnan().any()
    torch.testing.assert_close(got, want, **tol)
    got.backward(g)
    want.backward(g)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, **tol)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_trains_through_aten_flash_kernels_with_eagers_gradients(causal: bool) -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    compiled = plait.compile(attend, backend="stax")
    gen = torch.Generator().manual_seed(5)
    qkv = [torch.randn(2, 4, 16, 8, generator=gen) for _ in range(3)]
    ours = [t.clone().requires_grad_(True) for t in qkv]
    theirs = [t.clone().requires_grad_(True) for t in qkv]
    g = torch.randn(2, 4, 16, 8, generator=gen)
    compiled(*ours).backward(g)
    attend(*theirs).backward(g)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)  # NOTE: eager's own flash kernels: bitwise
    m = compiled.specializations[-1].compiled.manifest
    details = [n["detail"] for n in m.executor["backward"]["evidence"]["nodes"]]
    assert any(
        d.startswith("aten._scaled_dot_product_flash_attention_for_cpu_backward") for d in details
    )


def test_attention_with_flash_turned_off_trains_with_eagers_math_gradients() -> None:
    """With the flash backend off, eager runs attention's math path: so does the compiled
    gradient (autograd over the call), not ATen's CPU flash kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    gen = torch.Generator().manual_seed(7)
    qkv = [torch.randn(2, 4, 16, 8, generator=gen) for _ in range(3)]
    g = torch.randn(2, 4, 16, 8, generator=gen)
    with sdpa_kernel(SDPBackend.MATH):
        compiled = plait.compile(attend, backend="stax")
        _grads_as_eager(attend, compiled, qkv, g)  # NOTE: eager's own math path: bitwise
    m = compiled.specializations[-1].compiled.manifest
    details = [n["detail"] for n in m.executor["backward"]["evidence"]["nodes"]]
    assert not any("flash" in d for d in details)
    assert any("torch autograd of scaled_dot_product_attention" in d for d in details)


@pytest.mark.parametrize("shape", [(2, 2, 0, 8), (2, 3, 5, 3)])
def test_attention_trains_where_eager_does_not_pick_flash(shape: tuple[int, ...]) -> None:
    """An empty sequence is eager's math path (ATen's CPU flash kernel divides by zero on it,
    killing the process): the compiled gradient follows ATen's own backend choice."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    gen = torch.Generator().manual_seed(8)
    qkv = [torch.randn(*shape, generator=gen) for _ in range(3)]
    g = torch.randn(*shape, generator=gen)
    _grads_as_eager(attend, plait.compile(attend, backend="stax"), qkv, g)


def test_attention_dropout_draws_eagers_masks_and_trains() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=0.25, is_causal=True
        )

    compiled = plait.compile(attend, backend="stax")
    gen = torch.Generator().manual_seed(6)
    qkv = [torch.randn(2, 4, 16, 8, generator=gen) for _ in range(3)]
    g = torch.randn(2, 4, 16, 8, generator=gen)
    tol = plait.contract.load().tolerance("attention", "float32")
    for seed in (1, 2):
        seeded_grads_as_eager(attend, compiled, qkv, g, seed, {"rtol": tol.rtol, "atol": tol.atol})
    assert not compiled.specializations[-1].compiled.manifest.fallbacks


def test_dropout_trains_on_an_empty_batch() -> None:
    """ATen's CPU ``native_dropout`` returns an empty input's mask in the input's dtype, not
    bool as its meta kernel says: the program is typed as the kernel runs."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Dropout(0.5)).train()
    compiled = plait.compile(model, backend="stax")
    x = torch.randn(0, 8, generator=torch.Generator().manual_seed(9), requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    assert y.shape == (0, 4) and x.grad is not None and x.grad.shape == (0, 8)
    weight = model[0].weight
    assert weight.grad is not None and torch.equal(weight.grad, torch.zeros_like(weight))


def test_conv_batch_norm_and_pooling_train_on_an_empty_batch() -> None:
    """A batch with no element trains as in eager: ATen's functional batch norm and
    ``max_pool2d_with_indices`` refuse an empty input (so they are not used there), and the
    batch-norm gradients are eager's zeros, where the formula divides by the element count."""
    layers = [torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.MaxPool2d(2)).train()
    gen = torch.Generator().manual_seed(10)
    with torch.no_grad():
        model[1].running_mean.copy_(torch.randn(4, generator=gen))
        model[1].running_var.copy_(torch.rand(4, generator=gen) + 0.5)
    eager = copy.deepcopy(model)
    compiled = plait.compile(model, backend="stax")
    x = torch.randn(0, 3, 8, 8, generator=gen)
    compiled(x.clone().requires_grad_(True)).sum().backward()
    eager(x.clone().requires_grad_(True)).sum().backward()
    for ours, theirs in zip(model.parameters(), eager.parameters()):
        assert ours.grad is not None and torch.equal(ours.grad, theirs.grad)
    for ours, theirs in zip(model.buffers(), eager.buffers()):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("make", [lambda: nn.ReLU6(), lambda: nn.Hardtanh(-0.5, 2.0)])
def test_hardtanh_gradient_is_zero_at_its_bounds(make: Any) -> None:
    """Eager's hardtanh (and ReLU6) passes no gradient at either bound, where clamp's does:
    the values are clamp's, the gradient eager's (inputs on the bounds planted among random
    ones; a ReLU before a ReLU6 makes exact zeros common)."""
    module = make()
    lo, hi = float(module.min_val), float(module.max_val)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, generator=gen) * 4
    x[::7] = lo
    x[3::7] = hi
    x[5::7] = -0.0
    ours, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    g = torch.randn(64, generator=gen)
    y = plait.compile(module, backend="stax")(ours)
    y.backward(g)
    module(theirs).backward(g)
    assert torch.equal(y, module(x)) and torch.equal(torch.signbit(y), torch.signbit(module(x)))
    assert ours.grad is not None and torch.equal(ours.grad, theirs.grad)


def test_clamp_with_tensor_bounds_gives_eagers_gradients_at_ties() -> None:
    """clamp with tensor bounds sends all of the gradient to ``x`` where it equals a bound
    (maximum and minimum would split it), to a bound where ``x`` passes it, none at NaN."""

    def clip(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return x.clamp(lo, hi) * 2 + x.clamp(min=lo) + x.clamp(max=hi)

    gen = torch.Generator().manual_seed(12)
    x = torch.randn(32, generator=gen)
    lo, hi = torch.randn(32, generator=gen) - 1, torch.randn(32, generator=gen) + 1
    x[::5] = lo[::5]
    x[1::5] = hi[1::5]
    x[2] = float("nan")
    g = torch.randn(32, generator=gen)
    y = _grads_as_eager(clip, plait.compile(clip, backend="stax"), [x, lo, hi], g)
    assert torch.equal(y.nan_to_num(), clip(x, lo, hi).nan_to_num())


def test_a_backward_through_a_data_dependent_size_falls_back_to_eager_autograd() -> None:
    """Boolean-mask indexing makes the backward read a value of data-dependent size, which a
    Stax program cannot take: the compile says so, eager autograd runs the backward (eager's
    gradients), and under fullgraph the compile fails naming the value."""
    from plait.errors import CaptureFallbackWarning, PlaitCompileError

    def positives(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 3

    gen = torch.Generator().manual_seed(13)
    x = torch.randn(9, generator=gen)
    ours, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled = plait.compile(positives, backend="stax")
    with pytest.warns(CaptureFallbackWarning, match="data-dependent size"):
        y = compiled(ours)
    g = torch.randn(y.shape, generator=gen)
    y.backward(g)
    positives(theirs).backward(g)
    assert torch.equal(y, positives(x)) and ours.grad is not None
    assert torch.equal(ours.grad, theirs.grad)
    strict = plait.compile(positives, backend="stax", fullgraph=True)
    with pytest.raises(PlaitCompileError, match="data-dependent size"):
        strict(x.clone().requires_grad_(True))


def test_hard_gumbel_softmax_trains_with_eagers_straight_through_gradient() -> None:
    """``F.gumbel_softmax(hard=True)`` is ``y_hard - y_soft.detach() + y_soft``, traced to ATen
    (``detach_copy``, which PyTorch's autograd does not differentiate): its detach is plait's,
    so the gradient is the soft sample's, eager's, under the same seed."""

    def sample(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gumbel_softmax(x * w, tau=0.5, hard=True)

    compiled = plait.compile(sample, backend="stax")
    gen = torch.Generator().manual_seed(14)
    tol = plait.contract.load().tolerance("reduction", "float32")
    for seed in (1, 2):
        x, w, g = (torch.randn(4, 5, generator=gen) for _ in range(3))
        ours, theirs = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
        torch.manual_seed(seed)
        got = compiled(x, ours)
        torch.manual_seed(seed)
        want = sample(x, theirs)
        assert torch.equal(got, want)
        got.backward(g)
        want.backward(g)
        assert ours.grad is not None and theirs.grad is not None
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("transform", ["grad", "vjp", "jacrev", "vmap"])
def test_torch_func_transforms_run_the_call_eagerly_and_say_so(transform: str) -> None:
    """A compiled program has no functorch rules: under ``torch.func`` the call runs as written
    (a CaptureFallbackWarning), with eager's values, instead of failing inside PyTorch."""
    model = seeded(3, Pointwise)
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    for seed in (1, 2):
        x = randn(4, 8, 16, seed=seed)
        compiled(x)  # NOTE: a compiled specialization exists; the transform must not use it
        results = []
        for m in (compiled, model):
            params = {k: v.detach() for k, v in m.named_parameters()}

            def loss(p: dict[str, torch.Tensor], x: torch.Tensor, m: nn.Module = m) -> Any:
                return torch.func.functional_call(m, p, (x,)).square().sum()

            if transform == "grad":
                results.append(torch.func.grad(loss)(params, x)["w"])
            elif transform == "vjp":
                _, pull = torch.func.vjp(lambda w, m=m, x=x: m(x) * w, params["w"])
                results.append(pull(torch.ones(4, 8, 16))[0])
            elif transform == "jacrev":
                results.append(torch.func.jacrev(lambda b, m=m, x=x: m(x[0, 0] * b))(params["b"]))
            else:
                results.append(torch.func.vmap(lambda xi, m=m: m(xi))(x))
        if seed == 1:
            with pytest.warns(CaptureFallbackWarning, match="torch.func transform"):
                _ = torch.func.vmap(lambda xi: compiled(xi))(x)
        tol = plait.contract.load().tolerance("pointwise", "float32")
        torch.testing.assert_close(results[0], results[1], rtol=tol.rtol, atol=tol.atol)


def test_a_batched_gradient_through_a_compiled_backward_names_the_problem() -> None:
    make, draw = MODELS["pointwise"]
    compiled = _compiled(make())
    x = draw(4).requires_grad_(True)
    y = compiled(x)
    with pytest.raises(DoubleBackwardError, match="is_grads_batched"):
        torch.autograd.grad(y, x, torch.ones(2, *y.shape), is_grads_batched=True)
