"""Every Python value capture reads is guarded: a module attribute (of any submodule, float,
int, bool, str, enum, tuple), a module-level global (read by name or through its module), a
closure cell, a default argument, a config object's field (dataclass, SimpleNamespace, Hugging
Face ``PretrainedConfig``) and a class attribute. Changing one after the first call gives a new
specialization whose reason names the value, and the result equals eager's on fresh inputs;
calling again without a change compiles nothing."""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.guards import native
from tests.capture import pystate_helpers
from tests.util import assert_bitwise

NO_CACHE = {"cache": False}
SCALE = 2.0
MODE = "mul"


def _x() -> torch.Tensor:
    return torch.randn(3, 4)


def _same_as_eager(compiled: Any, eager: Callable[..., Any], *args: Any) -> None:
    """Bitwise where plait's reference interpreter runs (it keeps eager's arithmetic); within
    the contract's matmul tolerance where Stax's kernels run."""
    with torch.no_grad():
        got, want = compiled(*args), eager(*args)
    spec = compiled.specializations[-1]
    if spec.manifest.options.get("backend") == "stax" and spec.fallback_reason is None:
        tol = plait.contract.load().tolerance("matmul", want.dtype)
        torch.testing.assert_close(got, want, rtol=tol.rtol, atol=tol.atol)
    else:
        assert_bitwise(got, want)


def _changed_once(compiled: Any, eager: Callable[..., Any], change: Callable[[], None], what: str):
    """First call, an unchanged second call (no recompile), the change, a call (one recompile
    naming ``what``), and the result against eager on fresh inputs each time."""
    x = _x()
    _same_as_eager(compiled, eager, x)
    _same_as_eager(compiled, eager, _x())
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    change()
    _same_as_eager(compiled, eager, _x())
    assert len(compiled.specializations) == 2, compiled.recompile_reasons
    assert what in compiled.recompile_reasons[0], compiled.recompile_reasons
    _same_as_eager(compiled, eager, _x())
    assert len(compiled.specializations) == 2


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alpha = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.alpha


class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.beta = 3
        self.use_tanh = False
        self.kind = "a"
        self.act = Act.RELU
        self.window = (1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.beta
        y = y.tanh() if self.use_tanh else y
        y = y + 1.0 if self.kind == "b" else y
        y = y.relu() if self.act is Act.RELU else y.sigmoid()
        return y * self.window[1]


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) - x


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_float_attribute_of_a_module(evaluator: str, backend: str) -> None:
    m = Scaled()
    cm = plait.compile(m, backend=backend, options=NO_CACHE)

    def change() -> None:
        m.alpha = 5.0

    _changed_once(cm, m, change, "self.alpha: was 0.5, now 5.0")


@pytest.mark.parametrize(
    ("attr", "value"),
    [("beta", 4), ("use_tanh", True), ("kind", "b"), ("act", Act.TANH), ("window", (1, 3))],
)
def test_attributes_of_a_submodule(evaluator: str, attr: str, value: Any) -> None:
    m = Outer()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _changed_once(cm, m, lambda: setattr(m.inner, attr, value), f"self.inner.{attr}")


def test_class_attribute_shadowed_and_changed(evaluator: str) -> None:
    class WithConstant(nn.Module):
        GAIN = 2.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.GAIN

    m = WithConstant()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _changed_once(cm, m, lambda: setattr(m, "GAIN", 7.0), "self.GAIN")
    _changed_once_more(cm, m, lambda: setattr(WithConstant, "GAIN", 9.0), "GAIN")


def _changed_once_more(compiled: Any, eager: Any, change: Callable[[], None], what: str) -> None:
    n = len(compiled.specializations)
    change()
    _same_as_eager(compiled, eager, _x())
    assert len(compiled.specializations) == n + 1, compiled.recompile_reasons
    assert what in compiled.recompile_reasons[-1], compiled.recompile_reasons


def _uses_globals(x: torch.Tensor) -> torch.Tensor:
    y = x * SCALE
    return y + 1.0 if MODE == "add" else y


def test_module_level_float_global(evaluator: str) -> None:
    cf = plait.compile(_uses_globals, options=NO_CACHE)

    def change() -> None:
        global SCALE
        SCALE = -3.0

    try:
        _changed_once(cf, _uses_globals, change, "SCALE: was 2.0, now -3.0")
    finally:
        globals()["SCALE"] = 2.0


def test_module_level_string_global(evaluator: str) -> None:
    cf = plait.compile(_uses_globals, backend="eager", options=NO_CACHE)
    try:
        _changed_once(cf, _uses_globals, lambda: globals().update(MODE="add"), "MODE")
    finally:
        globals()["MODE"] = "mul"


def _through_other_module(x: torch.Tensor) -> torch.Tensor:
    y = pystate_helpers.shifted(x)
    return y * 2 if pystate_helpers.FLAGS["double"] else y


def test_global_of_another_module_and_a_mutated_dict(evaluator: str) -> None:
    cf = plait.compile(_through_other_module, backend="eager", options=NO_CACHE)
    try:
        _changed_once(
            cf, _through_other_module, lambda: setattr(pystate_helpers, "SHIFT", 0.75), "SHIFT"
        )
        # NOTE: a dict changed in place, not reassigned
        _changed_once_more(
            cf,
            _through_other_module,
            lambda: pystate_helpers.FLAGS.__setitem__("double", True),
            "FLAGS",
        )
    finally:
        pystate_helpers.SHIFT = 0.25
        pystate_helpers.FLAGS["double"] = False


def test_closure_cell(evaluator: str) -> None:
    factor = 1.5

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * factor

    cf = plait.compile(f, backend="eager", options=NO_CACHE)

    def change() -> None:
        nonlocal factor
        factor = -2.5

    _changed_once(cf, f, change, "closure variable factor")


def _scaler(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * k

    return scale


@pytest.mark.parametrize("changed", [0, 1])
def test_closure_cells_of_functions_sharing_one_code(evaluator: str, changed: int) -> None:
    """Two functions made by one factory share a code object, each with its own cells: a
    change to either one's cell is seen (the second one to run was once not guarded)."""
    scalers = [_scaler(3.0), _scaler(5.0)]

    def f(x: torch.Tensor) -> torch.Tensor:
        return scalers[0](x) + scalers[1](x)

    cf = plait.compile(f, backend="eager", options=NO_CACHE)
    closure = scalers[changed].__closure__
    assert closure is not None

    def change() -> None:
        closure[0].cell_contents = -2.5

    _changed_once(cf, f, change, "closure variable k")


def _scales(k: float) -> Callable[[], Iterator[float]]:
    def scales() -> Iterator[float]:
        while True:
            yield k

    return scales


def test_closure_cells_of_generators_left_suspended(evaluator: str) -> None:
    """Generators the program resumes are still suspended when the capture ends: their
    functions are found by reference, and a change to either one's cell is seen."""
    makers = [_scales(3.0), _scales(5.0)]
    running = [m() for m in makers]
    for r in running:  # NOTE: suspended at the yield, where each call leaves it (not refused)
        next(r)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * next(running[0]) + x * next(running[1])

    cf = plait.compile(f, backend="eager", options=NO_CACHE)
    closure = makers[1].__closure__
    assert closure is not None

    def change() -> None:
        closure[0].cell_contents = -2.5

    _changed_once(cf, f, change, "closure variable k")


def test_a_closure_value_changed_while_the_program_runs_is_refused() -> None:
    def counter() -> Callable[[torch.Tensor], torch.Tensor]:
        n = 1.0

        def step(x: torch.Tensor) -> torch.Tensor:
            nonlocal n
            y = x * n
            n = n + 1.0
            return y

        return step

    with pytest.raises(plait.GraphCaptureError, match="closure variable n"):
        plait.compile(counter(), backend="eager", fullgraph=True, options=NO_CACHE)(_x())


def test_default_argument(evaluator: str) -> None:
    def g(x: torch.Tensor, k: float = 2.0) -> torch.Tensor:
        return x * k

    def f(x: torch.Tensor) -> torch.Tensor:
        return g(x)  # NOTE: the default of a function the program calls

    cf = plait.compile(f, backend="eager", options=NO_CACHE)
    _changed_once(cf, f, lambda: setattr(g, "__defaults__", (4.0,)), "(code, defaults)")


@dataclasses.dataclass
class Config:
    scale: float = 2.0
    act: str = "relu"
    dims: list[int] = dataclasses.field(default_factory=lambda: [4, 4])


class Configured(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.config.scale
        return y.relu() if self.config.act == "relu" else y.tanh()


@pytest.mark.parametrize(
    "make", [lambda: Config(), lambda: types.SimpleNamespace(scale=2.0, act="relu")]
)
def test_config_object_fields(evaluator: str, make: Callable[[], Any]) -> None:
    m = Configured(make())
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _changed_once(cm, m, lambda: setattr(m.config, "scale", 0.5), "self.config")
    _changed_once_more(cm, m, lambda: setattr(m.config, "act", "tanh"), "self.config")


def test_pretrained_config_field(evaluator: str) -> None:
    import transformers

    config = transformers.GPT2Config(n_embd=4, n_layer=1, n_head=1)
    config.scale_attn_weights = True

    class UsesConfig(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * self.config.layer_norm_epsilon
            # NOTE: hidden_size is attribute_map'ed to n_embd
            return y / self.config.hidden_size if self.config.scale_attn_weights else y

    m = UsesConfig()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _changed_once(cm, m, lambda: setattr(config, "n_embd", 8), "self.config")
    _changed_once_more(cm, m, lambda: setattr(config, "scale_attn_weights", False), "self.config")


def test_a_hook_registered_after_the_first_call(evaluator: str) -> None:
    m = Scaled()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _changed_once(
        cm,
        m,
        lambda: m.lin.register_forward_hook(lambda mod, args, out: out * 2),
        "self.lin._forward_hooks",
    )


def test_unchanged_state_keeps_the_native_fast_path() -> None:
    m = Outer()
    cm = plait.compile(m, options=NO_CACHE)
    with torch.no_grad():
        for _ in range(3):
            x = _x()
            assert_bitwise(cm(x), m(x))
    guards = cm.specializations[0].guards
    if native.status().available:
        assert guards.evaluator == "native"
        assert guards.holds.python_reads == 0  # type: ignore[attr-defined]
    assert any(g.kind == "python" for g in guards)


def test_rebinding_to_an_equal_value_keeps_the_specialization(evaluator: str) -> None:
    m = Scaled()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _same_as_eager(cm, m, _x())
    m.alpha = float("0.5")  # NOTE: another float object of the same bits
    _same_as_eager(cm, m, _x())
    m.alpha = -0.0 + 0.5
    _same_as_eager(cm, m, _x())
    assert len(cm.specializations) == 1, cm.recompile_reasons


def test_a_program_that_changes_what_it_reads_falls_back_loudly() -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * self.calls
            self.calls += 1
            return y

    m = Counter()
    cm = plait.compile(m, options=NO_CACHE)
    with pytest.warns(plait.errors.CaptureFallbackWarning, match="self.calls"):
        out = cm(_x())
    assert cm.specializations[0].fallback_reason is not None
    assert out.shape == (3, 4)


def test_a_warm_start_guards_the_values_it_loaded(tmp_path: Any) -> None:
    """A specialization loaded from a snapshot (no capture ran in this callable) is guarded
    as a captured one: its guard is rebuilt from the saved descriptions of what was read."""
    m = Configured(Config())
    options = {"warm_start": "fingerprint", "cache": str(tmp_path)}
    cold = plait.compile(m, backend="eager", options=options)
    _same_as_eager(cold, m, _x())
    warm = plait.compile(m, backend="eager", options=options)
    _same_as_eager(warm, m, _x())
    assert str(warm.specializations[0].manifest.cache["capture"]).startswith("snapshot")
    assert any(g.kind == "python" for g in warm.specializations[0].guards)
    m.config.scale = -1.5
    _same_as_eager(warm, m, _x())
    assert len(warm.specializations) == 2
    assert "self.config.scale: was 2.0, now -1.5" in warm.recompile_reasons[0]


def test_a_buffer_slot_that_was_none(evaluator: str) -> None:
    class Optional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("shift", None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if self.shift is None else x * 2 + self.shift

    m = Optional()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    _changed_once(cm, m, lambda: setattr(m, "shift", torch.randn(4)), "self.shift")


_FLAGS = {2}


class ReadsASet(nn.Module):
    """Reads module attributes (checked natively) and a global set of numbers (checked by a
    Python read: a set of classes or strings is checked natively,
    tests/guards/test_python_values_native.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alpha = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.alpha * (2.0 if 2 in _FLAGS else 1.0)


def test_a_value_read_in_python_is_guarded_apart_from_the_native_ones() -> None:
    """A value the native evaluator cannot check (a set) costs its own Python read on each
    call, not a read of every value the program read; a change to it still recompiles."""
    m = ReadsASet()
    cm = plait.compile(m, backend="eager", options=NO_CACHE)
    python = [g for g in _guards_after_a_call(cm, m) if g.kind == "python"]
    assert len(python) == 2, [g.text for g in python]
    assert sorted("(1)" in g.text for g in python) == [False, True], [g.text for g in python]
    try:
        _changed_once(cm, m, lambda: _FLAGS.discard(2), "_FLAGS")
    finally:
        _FLAGS.add(2)


def _guards_after_a_call(compiled: Any, eager: Callable[..., Any]) -> Any:
    _same_as_eager(compiled, eager, _x())
    return compiled.specializations[0].guards
