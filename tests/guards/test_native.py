"""The native guard evaluator (plait.guards.native): it holds exactly when the guards' Python
reads do, catches every guarded change with exactly one recompile and the same reason, and is
never a silent fallback (where it cannot run, ``GuardSet.evaluator`` says why)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.codegen import build
from plait.codegen.errors import BuildError
from plait.frontend import ModuleState
from plait.guards import GuardEnv, GuardSet, native
from plait.guards.guard import Guard, ReadCall, ReadLeaf
from plait.guards.native import status as native_status
from plait.guards.state import StateFetcher

NO_CACHE = {"cache": False}


def _has_compiler() -> bool:
    try:
        build.toolchain()
    except BuildError:
        return False
    return True


needs_native = pytest.mark.skipif(not _has_compiler(), reason="no C++ compiler")


@needs_native
def test_the_native_evaluator_is_available() -> None:
    status = native_status()
    assert status.available, status.reason
    assert status.reason == "native" and Path(status.path).exists()


class Act(nn.ReLU):
    """A module class of this test's own: the test modifies it."""


class OtherAct(nn.ReLU):
    pass


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.body = nn.Sequential(Act(), nn.Conv2d(4, 4, 1), nn.Sequential(Act()))
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(self.bn(self.conv(x)))
        return self.head(y.mean((2, 3)))


def _net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


class Sub(torch.Tensor):
    """A tensor subclass: the native evaluator leaves it to the guard's Python read."""


def _freeze(freeze: bool) -> dict[str, Any]:
    """Options: every parameter and buffer frozen, or none."""
    return {"passes": "inference"} if freeze else {"freeze": False}


def _env(f: Any, *args: Any, **kwargs: Any) -> GuardEnv:
    engine = f._plait
    spec, leaves, _ = engine.adapter.flatten(args, kwargs)
    return GuardEnv(spec, leaves, engine.fn, engine.fetch())


def _agree(guards: GuardSet, env: GuardEnv) -> bool:
    """The native and the Python evaluator agree; a miss is explained."""
    fast, slow = guards.holds(env), guards.holds_python(env)
    assert fast == slow, (fast, guards.explain(env))
    if not fast:
        assert guards.explain(env), "a miss with no failed guard"
    return fast


# --- module state: every change, native == Python ------------------------------------------
def _set(obj: Any, attr: str, value: Any) -> Callable[[], None]:
    before = obj.__dict__.get(attr, getattr(obj, attr, None))
    setattr(obj, attr, value)
    return lambda: setattr(obj, attr, before)


def _param_swap(m: Net) -> Callable[[], None]:
    return _set(m.conv, "weight", nn.Parameter(m.conv.weight.detach().clone()))


def _data_swap(m: Net) -> Callable[[], None]:
    before = m.conv.weight.data
    m.conv.weight.data = before.clone()
    return lambda: setattr(m.conv.weight, "data", before)


def _in_place(m: Net) -> Callable[[], None]:
    with torch.no_grad():
        m.bn.running_mean.add_(1)
    return lambda: None  # NOTE: the version stays bumped: the guard keeps failing


def _buffer_subclass(m: Net) -> Callable[[], None]:
    return _set_buffer(m.bn, "running_mean", m.bn.running_mean.clone().as_subclass(Sub))


def _buffer_inference(m: Net) -> Callable[[], None]:
    with torch.inference_mode():
        t = m.bn.running_mean.clone()
    return _set_buffer(m.bn, "running_mean", t)


def _set_buffer(mod: nn.Module, name: str, value: Any) -> Callable[[], None]:
    before = mod._buffers[name]
    mod._buffers[name] = value
    return lambda: mod._buffers.__setitem__(name, before)


def _requires_grad(m: Net) -> Callable[[], None]:
    m.head.weight.requires_grad_(False)
    return lambda: m.head.weight.requires_grad_(True)


def _bias_shape(m: Net) -> Callable[[], None]:
    return _set(m.head, "bias", nn.Parameter(torch.zeros(1)))


def _bias_none(m: Net) -> Callable[[], None]:
    before = m.head._parameters["bias"]
    m.head._parameters["bias"] = None
    return lambda: m.head._parameters.__setitem__("bias", before)


def _to_double(m: Net) -> Callable[[], None]:
    m.double()
    return lambda: m.float()


def _train_sub(m: Net) -> Callable[[], None]:
    m.body[2].train()
    return lambda: m.body[2].eval()


def _training_int(m: Net) -> Callable[[], None]:
    return _set(m.body[0], "training", 0)  # NOTE: 0 == False: both hold


def _class_property(m: Net) -> Callable[[], None]:
    Act.training = property(lambda self: True)  # type: ignore[assignment]
    return lambda: delattr(Act, "training")


def _class_reassigned(m: Net) -> Callable[[], None]:
    m.body[0].__class__ = OtherAct
    return lambda: setattr(m.body[0], "__class__", Act)


def _submodule(m: Net) -> Callable[[], None]:
    before = m.body[1]
    m.body[1] = nn.Conv2d(4, 4, 1)
    return lambda: m.body.__setitem__(1, before)


def _submodule_deleted(m: Net) -> Callable[[], None]:
    before = m.body._modules.pop("2")
    return lambda: m.body._modules.__setitem__("2", before)


MODULE_CHANGES: dict[str, tuple[Callable[[Net], Callable[[], None]], bool, bool]] = {
    # name: (change, fails when frozen, fails when not frozen)
    "param-replaced": (_param_swap, True, False),
    "data-swap": (_data_swap, True, False),
    "buffer-in-place": (_in_place, True, False),
    "buffer-subclass": (_buffer_subclass, True, False),
    "buffer-inference-tensor": (_buffer_inference, True, False),
    "requires_grad": (_requires_grad, False, True),
    "bias-shape": (_bias_shape, True, True),
    "bias-none": (_bias_none, True, True),
    "double": (_to_double, True, True),
    "submodule-train": (_train_sub, True, True),
    "training-int": (_training_int, False, False),
    "class-property": (_class_property, True, True),
    # NOTE: the class of a module is a Python value the program reads (its forward, its
    # class attributes): reassigned, it is a new specialization
    "class-reassigned": (_class_reassigned, True, True),
    "submodule-replaced": (_submodule, True, True),
    "submodule-deleted": (_submodule_deleted, True, True),
}


@needs_native
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "inputs"])
@pytest.mark.parametrize("name", sorted(MODULE_CHANGES))
def test_module_changes_native_agrees_with_python(name: str, freeze: bool) -> None:
    model = _net()
    f = plait.compile(model, backend="eager", options={**NO_CACHE, **_freeze(freeze)})
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        f(x)
        assert len(f.specializations[0].manifest.graph["frozen"]) == (10 if freeze else 0)
        guards = f.specializations[0].guards
        assert guards.evaluator == "native"
        assert _agree(guards, _env(f, x))
        change, fails_frozen, fails_inputs = MODULE_CHANGES[name]
        undo = change(model)
        try:
            held = _agree(guards, _env(f, x))
            assert held != (fails_frozen if freeze else fails_inputs), guards.explain(_env(f, x))
        finally:
            undo()
        _agree(guards, _env(f, x))  # NOTE: some changes leave a trace (a version, a storage)


@needs_native
def test_a_tensor_subclass_is_read_by_python() -> None:
    model = _net()
    f = plait.compile(model, backend="eager", options={**NO_CACHE, "freeze": False})
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        f(x)
        guards = f.specializations[0].guards
        assert guards.evaluator == "native"
        before = guards.holds.python_reads
        _buffer_subclass(model)
        assert _agree(guards, _env(f, x))
    assert guards.holds.python_reads > before


@needs_native
@pytest.mark.gpu
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "inputs"])
def test_cuda_state_native_agrees_with_python(freeze: bool) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = _net().cuda()
    f = plait.compile(model, backend="eager", options={**NO_CACHE, **_freeze(freeze)})
    x = torch.randn(2, 3, 6, 6, device="cuda")
    with torch.no_grad():
        f(x)
        guards = f.specializations[0].guards
        assert guards.evaluator == "native"
        assert _agree(guards, _env(f, x))
        assert not _agree(guards, _env(f, x.cpu()))  # NOTE: the input's device
        model.bn.running_mean.add_(1)
        assert _agree(guards, _env(f, x)) != freeze
        model.cpu()
        assert not _agree(guards, _env(f, x))  # NOTE: the state's device


# --- inputs and ambient settings -------------------------------------------------------------
class Token:
    pass


def _token_with(**attrs: Any) -> Token:
    t = Token()
    t.__dict__.update(attrs)
    return t


def scaled(x: torch.Tensor, n: Any = 2, t: Any = None, s: Any = None) -> torch.Tensor:
    return x * 2 + 1


TOKEN = Token()
INPUT_CASES: dict[str, tuple[tuple[Any, ...], dict[str, Any], bool]] = {
    "same": ((torch.randn(4, 8),), {}, True),
    "dtype": ((torch.randn(4, 8, dtype=torch.float64),), {}, False),
    "shape": ((torch.randn(5, 8),), {}, False),
    "rank": ((torch.randn(4, 8, 1),), {}, False),
    "requires_grad": ((torch.randn(4, 8, requires_grad=True),), {}, False),
    "parameter-input": ((nn.Parameter(torch.randn(4, 8), requires_grad=False),), {}, True),
    "subclass-input": ((torch.randn(4, 8).as_subclass(Sub),), {}, True),
    "scalar-value": ((torch.randn(4, 8), 3), {}, False),
    "scalar-type": ((torch.randn(4, 8), 2.0), {}, False),
    "scalar-bool": ((torch.randn(4, 8), True), {}, False),
    "none-to-int": ((torch.randn(4, 8), 2, 1), {}, False),
    # NOTE: a plain object is a container of its attributes (a key/value cache's way in): another
    # with the same attributes is the same input, one with others is not
    "object-other": ((torch.randn(4, 8), 2, None, Token()), {}, True),
    "object-attribute": ((torch.randn(4, 8), 2, None, _token_with(k=1)), {}, False),
    "tensor-for-scalar": ((torch.randn(4, 8), torch.tensor(2)), {}, False),
    "size-leaf": ((torch.randn(4, 8), 2, None, torch.Size([3])), {}, False),
}


@needs_native
@pytest.mark.parametrize("name", sorted(INPUT_CASES))
def test_input_changes_native_agrees_with_python(name: str) -> None:
    f = plait.compile(scaled, backend="eager", options=NO_CACHE)
    x = torch.randn(4, 8)
    f(x, 2, None, TOKEN)
    guards = f.specializations[0].guards
    assert guards.evaluator == "native"
    assert _agree(guards, _env(f, x, 2, None, TOKEN))
    args, kwargs, holds = INPUT_CASES[name]
    full = (*args, *(2, None, TOKEN)[len(args) - 1 :])
    assert _agree(guards, _env(f, *full, **kwargs)) == holds


@needs_native
def test_dynamic_dims_native_agrees_with_python() -> None:
    def g(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.relu() + y if x.shape[0] > 2 else x

    f = plait.compile(g, backend="eager", dynamic=True, options=NO_CACHE)
    f(torch.randn(4, 8), torch.randn(4, 8))
    guards = f.specializations[0].guards
    for a, b, want in [
        ((6, 8), (6, 8), True),
        ((2, 8), (2, 8), False),
        ((1, 8), (1, 8), False),
        ((6, 8), (5, 8), False),
        ((6, 7), (6, 7), None),
        ((6, 8, 1), (6, 8), False),
    ]:
        held = _agree(guards, _env(f, torch.randn(*a), torch.randn(*b)))
        assert want is None or held == want, (a, b)


AMBIENT_CHANGES: dict[str, tuple[Callable[[], Callable[[], None]], bool]] = {
    "threads": (lambda: _swap(torch.get_num_threads, torch.set_num_threads, 3), False),
    "grad": (lambda: _swap(torch.is_grad_enabled, torch.set_grad_enabled, False), False),
    "default-dtype": (
        lambda: _swap(torch.get_default_dtype, torch.set_default_dtype, torch.float64),
        False,
    ),
    "deterministic": (
        lambda: _swap(
            torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms, True
        ),
        False,
    ),
    "mkldnn-conv-tf32": (lambda: _fp32("conv", "tf32"), False),
    # NOTE: "none" resolves to "ieee" here: the same setting, written another way, holds
    "mkldnn-matmul-ieee": (lambda: _fp32("matmul", "ieee"), True),
    "matmul-precision": (
        lambda: _swap(
            torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "medium"
        ),
        False,
    ),
}


def _swap(get: Callable[[], Any], put: Callable[[Any], Any], value: Any) -> Callable[[], None]:
    before = get()
    put(value)
    return lambda: put(before)


def _fp32(op: str, value: str) -> Callable[[], None]:
    section = getattr(torch.backends.mkldnn, op)
    before = section.fp32_precision
    section.fp32_precision = value
    return lambda: setattr(section, "fp32_precision", before)


@pytest.fixture
def restore() -> Iterator[list[Callable[[], None]]]:
    undo: list[Callable[[], None]] = []
    yield undo
    for fn in reversed(undo):
        fn()


@needs_native
@pytest.mark.parametrize("name", sorted(AMBIENT_CHANGES))
def test_ambient_changes_native_agrees_with_python(
    name: str, restore: list[Callable[[], None]]
) -> None:
    f = plait.compile(scaled, backend="eager", options=NO_CACHE)
    x = torch.randn(4, 8)
    f(x)
    guards = f.specializations[0].guards
    assert _agree(guards, _env(f, x))
    change, holds = AMBIENT_CHANGES[name]
    restore.append(change())
    assert _agree(guards, _env(f, x)) == holds


@needs_native
def test_autocast_native_agrees_with_python() -> None:
    f = plait.compile(scaled, backend="eager", options=NO_CACHE)
    x = torch.randn(4, 8)
    f(x)
    guards = f.specializations[0].guards
    with torch.autocast("cpu"):
        assert not _agree(guards, _env(f, x))
    assert _agree(guards, _env(f, x))


# --- through the API: one recompile, the right reason, eager's outputs -----------------------
API_CHANGES: dict[str, tuple[Callable[[Net], Any], bool, str]] = {
    # name: (change, freeze, what the reason names)
    "double": (lambda m: m.double(), True, "f64"),
    "submodule-train": (lambda m: m.body[2].train(), True, "self.training == False"),
    "submodule-replaced": (
        lambda m: m.body.__setitem__(1, nn.Conv2d(4, 4, 1)),
        True,
        "self has the captured submodules",
    ),
    "bn-in-place": (
        lambda m: m.bn.running_var.mul_(2),
        True,
        "bn.running_var is the frozen tensor, unchanged",
    ),
    "requires_grad": (
        lambda m: m.head.bias.requires_grad_(False),
        False,
        "parameters and buffers keep their dtype, shape, device and requires_grad",
    ),
    "bias-shape": (
        lambda m: setattr(m.head, "bias", nn.Parameter(torch.randn(1))),
        False,
        "changed: head.bias",
    ),
}


@needs_native
@pytest.mark.parametrize("backend", ["eager", "stax"])
@pytest.mark.parametrize("name", sorted(API_CHANGES))
def test_a_change_recompiles_once_with_its_reason(name: str, backend: str) -> None:
    change, freeze, needle = API_CHANGES[name]
    model = _net()
    f = plait.compile(model, backend=backend, options={**NO_CACHE, **_freeze(freeze)})
    with torch.no_grad():
        for _ in range(2):
            f(torch.randn(2, 3, 6, 6))
        assert f.specializations[0].guards.evaluator == "native"
        change(model)
        dtype = next(model.parameters()).dtype
        # NOTE: a bias of another shape (it broadcasts) is refused by the linear op; eager
        # accepts it, so the call goes to the ATen path: compiled, no fallback
        for _ in range(3):
            x = torch.randn(2, 3, 6, 6, dtype=dtype)
            torch.testing.assert_close(f(x), model(x))
    assert len(f.specializations) == 2, f.recompile_reasons
    assert f.specializations[1].fallback_reason is None
    assert len(f.recompile_reasons) == 1 and needle in f.recompile_reasons[0], f.recompile_reasons


@needs_native
def test_unchanged_module_never_recompiles_and_follows_its_weights() -> None:
    model = _net()
    f = plait.compile(model, options={**NO_CACHE, "freeze": False})
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 6, 6)
            torch.testing.assert_close(f(x), model(x))
            model.conv.weight.mul_(0.9)  # NOTE: a graph input: no guard, new values
    assert len(f.specializations) == 1 and not f.recompile_reasons


# --- the evaluator itself ----------------------------------------------------------------------
def test_without_an_evaluator_guards_run_in_python_and_say_so() -> None:
    g = Guard(
        "scalar",
        "arg n",
        "n == 4",
        (int, 4),
        lambda env: (type(env.leaves[0]), env.leaves[0]),
        native=ReadLeaf(0, 4),
    )
    guards = GuardSet([g])  # NOTE: plait.guards.native is imported: it registers nothing
    assert guards.evaluator.startswith("python: no evaluator given")
    assert guards.holds(GuardEnv((), [4])) and not guards.holds(GuardEnv((), [3]))
    assert GuardSet([g], native.EVALUATORS).evaluator == (
        "native" if native_status().available else native_status().reason
    )


@needs_native
def test_an_unreadable_guard_fails_and_an_interrupt_propagates() -> None:
    def boom(env: GuardEnv) -> Any:
        raise ValueError("unreadable")

    def interrupt() -> Any:
        raise KeyboardInterrupt

    assert not GuardSet([Guard("scalar", "x", "x", 1, boom)]).holds(GuardEnv((), []))
    g = Guard("ambient", "i", "i", 1, lambda env: interrupt(), native=ReadCall(interrupt))
    guards = GuardSet([g], native.EVALUATORS)
    assert guards.evaluator == "native"
    with pytest.raises(KeyboardInterrupt):
        guards.holds(GuardEnv((), []))


@needs_native
def test_native_reads_equal_python_reads() -> None:
    t = torch.randn(3, 4)
    assert native.tensor_state(t) == (t._version, t.data_ptr())
    with torch.no_grad():
        t.add_(1)
    assert native.tensor_state(t) == (t._version, t.data_ptr())
    e = torch.empty(0)
    assert native.tensor_state(e) == (e._version, e.data_ptr())
    v = t[1:]
    assert native.tensor_state(v) == (v._version, v.data_ptr())


def test_the_fetcher_reads_the_live_state_like_the_python_one() -> None:
    model = _net()
    fetch = StateFetcher(ModuleState(model))
    assert fetch.native == native_status().available
    assert [id(t) for t in fetch()] == [id(t) for t in fetch._python()]
    new = nn.Parameter(torch.randn(4, 3, 3, 3))
    model.conv.weight = new
    assert fetch()[0] is new
    del model.conv.weight
    # NOTE: a slot removed reads None (every guard on it fails; the recompile reads the
    # module state again)
    assert fetch()[0] is None


def test_a_cycle_through_the_evaluator_is_collected() -> None:
    model = _net()
    # NOTE: in __dict__, not as a submodule: model -> compiled -> guards -> model
    compiled = plait.compile(model, backend="eager", options=NO_CACHE)
    model.__dict__["compiled"] = compiled
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        compiled(x)
        compiled(x)
    assert compiled.specializations[0].guards.evaluator in ("native", native_status().reason)
    del compiled
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


# --- building and caching ----------------------------------------------------------------------
CHILD = r"""
import json, torch, plait
from plait.guards.native import status as native_status
f = plait.compile(lambda x: x + 1, backend="eager", options={"cache": False})
x = torch.randn(3)
f(x); f(x)
s = native_status()
print(json.dumps({"evaluator": f.specializations[0].guards.evaluator, "built": s.built,
                  "log": s.log, "available": s.available}))
"""


def _child(tmp: Path, **env: str) -> dict[str, Any]:
    full = {**os.environ, "PLAIT_GUARDS_CACHE_DIR": str(tmp), **env}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=full, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@needs_native
@pytest.mark.slow
def test_built_once_then_loaded_and_a_corrupt_entry_is_rebuilt(tmp_path: Path) -> None:
    refused = _child(tmp_path, PLAIT_STAX_NO_COMPILE="1")
    assert not refused["available"] and "PLAIT_STAX_NO_COMPILE" in refused["evaluator"]
    first = _child(tmp_path)
    assert first["evaluator"] == "native" and first["built"]
    second = _child(tmp_path, PLAIT_STAX_NO_COMPILE="1")
    assert second["evaluator"] == "native" and not second["built"] and "cache hit" in second["log"]
    (lib,) = tmp_path.glob("*.so")
    lib.write_bytes(lib.read_bytes()[:-16] + b"\0" * 16)
    third = _child(tmp_path)
    assert third["evaluator"] == "native" and third["built"]
    assert "discarded an entry that does not match its hash" in third["log"]
    # NOTE: a failed build is recorded: later processes report it instead of paying for it again
    lib.with_suffix(".failed").write_text("the C++ compiler failed:\nno headers")
    fourth = _child(tmp_path)
    assert fourth["evaluator"].startswith("python: ") and "an earlier build failed" in str(fourth)


@pytest.mark.slow
def test_disabled_evaluator_is_recorded(tmp_path: Path) -> None:
    out = _child(tmp_path, PLAIT_NATIVE_GUARDS="0")
    assert out["evaluator"].startswith("python: ") and "PLAIT_NATIVE_GUARDS=0" in out["evaluator"]
