"""Every guard kind: change what it pins and get exactly one recompile whose reason names the guard
with its expected and actual value; change nothing and get none."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import plait
from tests.util import assert_bitwise

NO_CACHE = {"cache": False}


def _compiled(fn: Any, **kwargs: Any) -> Any:
    options = {**NO_CACHE, **kwargs.pop("options", {})}
    return plait.compile(fn, options=options, **kwargs)


def _one_recompile(compiled: Any, *needles: str) -> str:
    assert len(compiled.specializations) == 2, compiled.recompile_reasons
    assert len(compiled.recompile_reasons) == 1
    reason = compiled.recompile_reasons[0]
    for needle in needles:
        assert needle in reason, reason
    return reason


def scale(x: torch.Tensor, n: int = 2) -> torch.Tensor:
    return x * n + 1


@pytest.mark.parametrize(
    ("first", "second", "needles"),
    [
        (torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64), ["x: f32[4, 8]", "got f64"]),
        (torch.randn(4, 8), torch.randn(4, 8, 1), ["expected f32[4, 8]", "got f32[4, 8, 1]"]),
        (torch.randn(4, 8), torch.randn(5, 8), ["expected f32[4, 8] on cpu, got f32[5, 8]"]),
        (
            torch.randn(4, 8),
            torch.randn(4, 8, requires_grad=True),
            ["x.requires_grad == False: expected False, got True"],
        ),
    ],
    ids=["dtype", "rank", "static-dim", "requires_grad"],
)
def test_input_type_guards(first: Any, second: Any, needles: list[str]) -> None:
    f = _compiled(scale, backend="eager")
    for _ in range(2):
        f(first)
    assert len(f.specializations) == 1 and not f.recompile_reasons
    out = f(second)
    assert_bitwise(out, scale(second))
    _one_recompile(f, *needles)
    f(second)
    f(first)
    assert len(f.specializations) == 2


@pytest.mark.gpu
def test_device_guard() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    f = _compiled(scale, backend="eager")
    f(torch.randn(4))
    f(torch.randn(4, device="cuda"))
    _one_recompile(f, "x: f32[4]", "on cuda")


def test_value_read_guard() -> None:
    f = _compiled(scale, backend="eager")
    x = torch.randn(3)
    f(x, 2)
    f(x, 2)
    assert torch.equal(f(x, 3), scale(x, 3))
    _one_recompile(f, "n == 2: expected 2 (int), got 3 (int)")


def branchy(x: torch.Tensor) -> torch.Tensor:
    return x.relu() if x.shape[0] > 2 else x.sigmoid()


def test_dim_read_guard_under_dynamic_shapes() -> None:
    f = _compiled(branchy, backend="eager", dynamic=True)
    f(torch.randn(4, 8))
    f(torch.randn(6, 8))  # NOTE: symbolic dims: another size, the same specialization
    assert len(f.specializations) == 1
    x = torch.randn(2, 8)
    assert torch.equal(f(x), x.sigmoid())
    _one_recompile(f, "x.shape[0] > 2: expected True, got False")


def layout_reader(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if x.is_contiguous() else x * 3


def test_layout_read_guard() -> None:
    f = _compiled(layout_reader, backend="eager")
    x = torch.randn(4, 6)
    f(x)
    f(torch.randn(4, 6))
    strided = torch.randn(6, 4).t()
    assert torch.equal(f(strided), strided * 3)
    _one_recompile(f, "keep their strides", "expected strides [(6, 1)], got strides [(1, 4)]")


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_layout_not_read_is_not_guarded(backend: str) -> None:
    """Codegen does not depend on input strides (Stax makes inputs contiguous per call), so a
    program that reads no layout keeps one specialization across layouts."""
    f = _compiled(scale, backend=backend)
    f(torch.randn(4, 6))
    strided = torch.randn(6, 4).t()
    assert_bitwise(f(strided), scale(strided))
    nhwc = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    g = _compiled(scale, backend=backend)
    g(torch.randn(2, 3, 4, 5))
    assert_bitwise(g(nhwc), scale(nhwc))
    assert len(f.specializations) == len(g.specializations) == 1


def test_grad_mode_guard() -> None:
    f = _compiled(scale, backend="eager")
    x = torch.randn(3)
    with torch.no_grad():
        f(x)
        f(x)
    f(x)
    _one_recompile(f, "torch.is_grad_enabled() == False: expected False, got True")


def test_autocast_is_guarded_and_captured() -> None:
    f = _compiled(scale, backend="eager")
    x = torch.randn(3)
    f(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(x)
        expected = scale(x)
    assert torch.equal(out, expected)
    _one_recompile(f, "autocast is off: expected (), got ('cpu:bfloat16',)")
    assert f.specializations[1].fallback_reason is None  # NOTE: captured under autocast
    f(x)
    assert len(f.specializations) == 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.conv(x)).relu())


def _net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def test_train_eval_guard() -> None:
    model = _net()
    f = _compiled(model, backend="eager")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        f(x)
        f(x)
        model.train()
        f(x)
    _one_recompile(f, "self.training == False", "expected False, got True")


@pytest.mark.parametrize("backend", ["eager", "stax"])
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda m: m.conv.weight.mul_(1.5), "version 1"),  # in place: an optimizer step
        (lambda m: setattr(m.conv, "weight", nn.Parameter(m.conv.weight * 2)), "got version 0"),
        (lambda m: setattr(m.conv.weight, "data", m.conv.weight.data * 2), "storage"),
        (lambda m: m.load_state_dict(_net().state_dict()), "version"),
    ],
    ids=["in-place", "replaced", "data-swap", "load_state_dict"],
)
def test_frozen_parameter_guards(backend: str, change: Callable[[Net], Any], needle: str) -> None:
    model = _net()
    f = _compiled(model, backend=backend, options={"passes": "inference"})
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        f(x)
        f(x)
        assert "conv.weight" in f.specializations[0].manifest.graph["frozen"]
        change(model)
        out = f(x)
        expected = model(x)
    torch.testing.assert_close(out, expected)
    reason = _one_recompile(
        f, "is the frozen tensor, unchanged (identity, version, storage, sampled values)"
    )
    assert needle in reason, reason


def test_non_frozen_parameter_change_is_no_recompile() -> None:
    model = _net()
    f = _compiled(model, backend="eager", options={"freeze": False})
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        f(x)
        model.conv.weight.mul_(1.5)
        assert_bitwise(f(x), model(x))
    assert len(f.specializations) == 1


def test_unchanged_calls_never_recompile() -> None:
    model = _net()
    f = _compiled(model)
    with torch.no_grad():
        for _ in range(4):
            f(torch.randn(2, 3, 8, 8))
    g = _compiled(scale)
    for _ in range(4):
        g(torch.randn(4), 2)
    assert len(f.specializations) == len(g.specializations) == 1
    assert not f.recompile_reasons and not g.recompile_reasons


# --- ambient settings ----------------------------------------------------------------------
def _flip_precision() -> Callable[[], None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if before == "highest" else "highest")
    return lambda: torch.set_float32_matmul_precision(before)


def _flip_flag(obj: Any, attr: str, setter: Callable[[bool], None]) -> Callable[[], None]:
    # NOTE: through torch._C, as torch.backends' own flags() does: the module attribute raises
    # once torch.backends.disable_global_flags() ran (torch.testing._internal calls it on import).
    before = getattr(obj, attr)
    setter(not before)
    return lambda: setter(before)


def _flip_threads() -> Callable[[], None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2 if before == 1 else 1)
    return lambda: torch.set_num_threads(before)


def _flip_deterministic(warn_only: bool) -> Callable[[], None]:
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if warn_only:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(not before[0])
    return lambda: torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _flip_flush_denormal() -> Callable[[], None]:
    from plait.guards.ambient import call_settings

    before = call_settings()["torch.set_flush_denormal"]
    torch.set_flush_denormal(not before)

    def undo() -> None:
        torch.set_flush_denormal(before)

    return undo


def _flip_default_dtype() -> Callable[[], None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if before == torch.float32 else torch.float32)
    return lambda: torch.set_default_dtype(before)


def _flip_fp32(backend: str, op: str) -> Callable[[], None]:
    section = getattr(getattr(torch.backends, backend), op)
    before = section.fp32_precision
    section.fp32_precision = "tf32" if before in ("ieee", "none") else "ieee"
    return lambda: setattr(section, "fp32_precision", before)


def _flip_reduced(attr: str) -> Callable[[], None]:
    matmul = torch.backends.cuda.matmul
    before = getattr(matmul, attr)
    setattr(matmul, attr, not (before[0] if isinstance(before, tuple) else before))
    return lambda: setattr(matmul, attr, before[0] if isinstance(before, tuple) else before)


def _flip_sdp(kind: str) -> Callable[[], None]:
    cuda = torch.backends.cuda
    before = getattr(cuda, f"{kind}_sdp_enabled")()
    getattr(cuda, f"enable_{kind}_sdp")(not before)
    return lambda: getattr(cuda, f"enable_{kind}_sdp")(before)


# NOTE: one entry per ambient setting plait guards; test_every_setting_has_a_case holds the
# table to plait.guards.ambient.CALL_SETTINGS.
AMBIENT_CASES: dict[str, Callable[[], Callable[[], None]]] = {
    "torch.get_num_threads()": _flip_threads,
    "torch.get_float32_matmul_precision()": _flip_precision,
    "torch.backends.cuda.matmul.allow_tf32": lambda: _flip_flag(
        torch.backends.cuda.matmul, "allow_tf32", torch._C._set_cublas_allow_tf32
    ),
    "torch.backends.cudnn.allow_tf32": lambda: _flip_flag(
        torch.backends.cudnn, "allow_tf32", torch._C._set_cudnn_allow_tf32
    ),
    "torch.backends.mkldnn.matmul.fp32_precision": lambda: _flip_fp32("mkldnn", "matmul"),
    "torch.backends.mkldnn.conv.fp32_precision": lambda: _flip_fp32("mkldnn", "conv"),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": lambda: _flip_reduced(
        "allow_fp16_reduced_precision_reduction"
    ),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": lambda: _flip_reduced(
        "allow_bf16_reduced_precision_reduction"
    ),
    "torch.are_deterministic_algorithms_enabled()": lambda: _flip_deterministic(False),
    "torch.is_deterministic_algorithms_warn_only_enabled()": lambda: _flip_deterministic(True),
    "torch.backends.mkldnn.enabled": lambda: _flip_flag(
        torch.backends.mkldnn, "enabled", torch._C._set_mkldnn_enabled
    ),
    "torch.backends.cudnn.enabled": lambda: _flip_flag(
        torch.backends.cudnn, "enabled", torch._C._set_cudnn_enabled
    ),
    "torch.get_default_dtype()": _flip_default_dtype,
    "torch.set_flush_denormal": _flip_flush_denormal,
    "torch.backends.cuda.flash_sdp_enabled()": lambda: _flip_sdp("flash"),
    "torch.backends.cuda.mem_efficient_sdp_enabled()": lambda: _flip_sdp("mem_efficient"),
    "torch.backends.cuda.math_sdp_enabled()": lambda: _flip_sdp("math"),
    "torch.backends.cuda.cudnn_sdp_enabled()": lambda: _flip_sdp("cudnn"),
}


@pytest.fixture
def restore() -> Iterator[list[Callable[[], None]]]:
    undo: list[Callable[[], None]] = []
    yield undo
    for fn in reversed(undo):
        fn()


def test_every_setting_has_a_case() -> None:
    from plait.guards.ambient import CALL_SETTINGS

    assert {s.name for s in CALL_SETTINGS} <= set(AMBIENT_CASES)


@pytest.mark.parametrize("name", sorted(AMBIENT_CASES))
@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_ambient_setting_guard(name: str, backend: str, restore: list[Callable[[], None]]) -> None:
    f = _compiled(scale, backend=backend)
    x = torch.randn(3)
    f(x)
    f(x)
    undo = AMBIENT_CASES[name]()
    restore.append(undo)
    out = f(x)
    assert_bitwise(out, scale(x))
    reason = _one_recompile(f, name)
    # NOTE: PyTorch couples some settings (allow_tf32 sets the matmul precision): the reason
    # then names both; the one changed here is among them, with its expected and actual value.
    (mine,) = [part for part in reason.split("; ") if part.startswith(name)]
    assert ": expected " in mine and ", got " in mine, mine
    undo()
    restore.remove(undo)
    f(x)  # back to the first specialization: no third compile
    assert len(f.specializations) == 2
