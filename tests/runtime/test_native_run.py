"""A straight run of native calls and arena kernels runs as one C call (plait.runtime.native_run).

Hugging Face's MobileNetV2 and EfficientNet (small configs, random weights) compile to runners
whose native steps form one run. Each test checks the compiled model against eager on fresh
inputs across calls (the first call runs the steps one by one and copies their arrays, later
ones run the copies), and against the same runner with no run, bit for bit. Their weights are
constants the compiler folded (batch norms), so a block whose weights the caller passes checks
what a run must see between calls: a weight written in place, through ``.data`` (no version
counter moves) or given other memory, and a weight that turns non-finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.runtime import native_run
from tests.codegen.hf_vision_models import efficientnet, mobilenet_v2
from tests.util import assert_bitwise, contract_tol

pytestmark = pytest.mark.usefixtures("stax_cache")

SHAPE = (2, 3, 32, 32)
RUN = ".key else 1"


MODELS: dict[str, Callable[[], Any]] = {"mobilenet_v2": mobilenet_v2, "efficientnet": efficientnet}


def _compiled(model: torch.nn.Module) -> Any:
    return plait.compile(model.eval(), backend="stax", options={"cache": False})


def _program(compiled: Any) -> Any:
    return compiled.specializations[0].compiled.program


def _runs(compiled: Any) -> list[native_run.NativeRun]:
    names = _program(compiled).runner.globals
    return [v for v in names.values() if isinstance(v, native_run.NativeRun)]


def _inputs(seed: int) -> Iterator[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randn(SHAPE, generator=gen)


def _check(compiled: Any, model: torch.nn.Module, x: torch.Tensor, what: str) -> torch.Tensor:
    with torch.no_grad():
        got, want = compiled(x).last_hidden_state, model(x).last_hidden_state
    tol = contract_tol("model", torch.float32)
    torch.testing.assert_close(got, want, **tol, equal_nan=True, msg=what)
    return got


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    def off() -> None:
        monkeypatch.setattr(native_run, "LEAST", 10**9)

    return off


@pytest.mark.parametrize("name", sorted(MODELS))
def test_native_steps_run_as_one_call_and_match_the_steps_run_one_by_one(
    name: str, no_runs: Callable[[], None]
) -> None:
    torch.manual_seed(1)
    model = MODELS[name]()
    compiled = _compiled(model)
    xs = [x for x, _ in zip(_inputs(2), range(3))]
    got = [_check(compiled, model, x, f"call {i}") for i, x in enumerate(xs)]
    assert _program(compiled).source.count(RUN) == 1
    (run,) = _runs(compiled)
    assert run.key is not None and run.args[1] >= native_run.LEAST
    no_runs()
    plain = _compiled(model)
    for i, (x, fast) in enumerate(zip(xs, got)):
        with torch.no_grad():
            assert_bitwise(fast, plain(x).last_hidden_state, f"call {i}, one call against steps")
    assert RUN not in _program(plain).source


def _block(x: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
    """MobileNet's inverted residual without the residual, its weights passed by the caller:
    a 1x1 convolution, a depthwise one, a 1x1 one, a depthwise one, and a last 1x1 one."""
    h = F.conv2d(x, w[0], w[1]).clamp(0, 6)
    h = F.conv2d(h, w[2], w[3], padding=1, groups=w[2].shape[0]).clamp(0, 6)
    h = F.conv2d(h, w[4], w[5])
    h = F.conv2d(h, w[6], None, padding=1, groups=w[6].shape[0]).clamp(0, 6)
    return F.conv2d(h, w[7])


def _weights(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(16, 8, 1, 1), (16,), (16, 1, 3, 3), (16,), (24, 16, 1, 1), (24,), (24, 1, 3, 3)]
    return [torch.randn(s, generator=gen) for s in [*shapes, (8, 24, 1, 1)]]


def _check_block(compiled: Any, x: torch.Tensor, weights: list[torch.Tensor], what: str) -> None:
    with torch.no_grad():
        got, want = compiled(x, *weights), _block(x, *weights)
    tol = contract_tol("conv", torch.float32)
    torch.testing.assert_close(got, want, **tol, equal_nan=True, msg=what)


def _block_inputs(seed: int) -> Iterator[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randn(2, 8, 10, 10, generator=gen)


def _write_in_place(w: torch.Tensor) -> None:
    w.mul_(-1.5)


def _write_through_data(w: torch.Tensor) -> None:
    w.data.mul_(-1.5)  # NOTE: no version bump of w; its first elements change


def _replace_data(w: torch.Tensor) -> None:
    w.data = w.detach() * -1.5  # NOTE: other memory, no version bump


WRITES = {
    "in_place": _write_in_place,
    "through_data": _write_through_data,
    "replaced": _replace_data,
}
# NOTE: operand index of the block's weights: the first depthwise, the middle 1x1, its bias
WHICH = {"depthwise": 2, "pointwise": 4, "bias": 5}


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("which", sorted(WHICH))
def test_a_weight_changed_between_calls_is_read_as_it_is_now(write: str, which: str) -> None:
    weights = _weights(3)
    compiled = plait.compile(_block, backend="stax", options={"cache": False})
    inputs = _block_inputs(4)
    for i in range(2):
        _check_block(compiled, next(inputs), weights, f"call {i}")
    (run,) = _runs(compiled)
    bound = run.key
    assert bound is not None and run.args[1] == 3
    target = weights[WHICH[which]]
    with torch.no_grad():
        WRITES[write](target)
    for i in range(2):
        _check_block(compiled, next(inputs), weights, f"call {i} after the {which} {write}")
    assert run.key is not None
    assert (run.key != bound) == (write != "through_data")  # NOTE: .data writes bump nothing


def test_a_non_finite_weight_runs_eager_and_the_run_returns_once_it_is_finite() -> None:
    weights = _weights(5)
    compiled = plait.compile(_block, backend="stax", options={"cache": False})
    inputs = _block_inputs(6)
    _check_block(compiled, next(inputs), weights, "first call")
    (run,) = _runs(compiled)
    with torch.no_grad():
        old = weights[2][3, 0, 1, 1].item()
        weights[2][3, 0, 1, 1] = float("inf")
    for i in range(2):
        _check_block(compiled, next(inputs), weights, f"call {i} with an infinite weight")
        assert run.key is None and run.refused is not None
    with torch.no_grad():
        weights[2][3, 0, 1, 1] = old
    for i in range(2):
        _check_block(compiled, next(inputs), weights, f"call {i} finite again")
    assert run.key is not None


def test_another_runner_of_the_program_leaves_the_run_its_own_buffers() -> None:
    """A profile builds a second runner with its own arena and calls the same native calls
    (which store that arena's pointers in their arrays): the run keeps its copies."""
    torch.manual_seed(7)
    model = mobilenet_v2()
    compiled = _compiled(model)
    inputs = _inputs(8)
    _check(compiled, model, next(inputs), "first call")
    program = _program(compiled)
    call, seen = program._call, []

    def recording(*args: Any) -> Any:
        seen.append(args)
        return call(*args)

    program._call = recording
    for i in range(2):
        _check(compiled, model, next(inputs), f"call {i}")
    program._call = call
    with torch.no_grad():
        program.profile(*seen[-1], repeat=2)
    _check(compiled, model, next(inputs), "after the profile")


def test_a_call_that_read_other_memory_than_the_plan_is_not_run_from_its_arrays() -> None:
    """Where a call's array holds a pointer the run does not hold (here: the arena view of
    its operand is not the tensor the call read), the run refuses to copy it, and the steps
    run one by one."""
    weights = _weights(9)
    compiled = plait.compile(_block, backend="stax", options={"cache": False})
    inputs = _block_inputs(10)
    _check_block(compiled, next(inputs), weights, "first call")
    (run,) = _runs(compiled)
    assert run.key is not None
    run.members[0].data[0] = run.members[0].data[0].clone()  # type: ignore[union-attr]
    with torch.no_grad():
        weights[2].mul_(0.5)  # NOTE: the key changes: the steps run one by one, then bind
    for i in range(2):
        _check_block(compiled, next(inputs), weights, f"call {i}")
        assert run.key is None and run.refused is not None


def _squeeze(x: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
    """EfficientNet's block, its weights passed by the caller: a depthwise convolution of the
    caller's map with SiLU, squeeze-and-excitation (pool, 1x1, SiLU, 1x1, sigmoid, scale) and
    a 1x1 convolution. The depthwise call reads the caller's tensor: it runs on its own, and
    the run starts at the pool step."""
    h = F.silu(F.conv2d(x, w[0], padding=1, groups=w[0].shape[0]))
    s = F.silu(F.conv2d(F.adaptive_avg_pool2d(h, 1), w[1], w[2]))
    h = h * torch.sigmoid(F.conv2d(s, w[3], w[4]))
    return F.conv2d(h, w[5])


def test_a_squeeze_whose_depthwise_weight_turns_infinite_reads_eager_means() -> None:
    """The pool step hands over the means its depthwise call kept, and the run skips it:
    where the depthwise call ran eager's ops, that call writes the kept means itself."""
    gen = torch.Generator().manual_seed(11)
    shapes = [(32, 1, 3, 3), (8, 32, 1, 1), (8,), (32, 8, 1, 1), (32,), (8, 32, 1, 1)]
    weights = [torch.randn(s, generator=gen) for s in shapes]
    compiled = plait.compile(_squeeze, backend="stax", options={"cache": False})
    tol = contract_tol("conv", torch.float32)

    def check(what: str) -> None:
        x = torch.randn(2, 32, 10, 10, generator=gen)
        with torch.no_grad():
            got, want = compiled(x, *weights), _squeeze(x, *weights)
        torch.testing.assert_close(got, want, **tol, equal_nan=True, msg=what)

    for i in range(2):
        check(f"call {i}")
    (run,) = _runs(compiled)
    assert run.key is not None
    assert "adaptive_avg_pool2d" in str(_program(compiled).schedule()[1])
    with torch.no_grad():
        weights[0][5, 0, 0, 2] = float("inf")
    for i in range(2):
        check(f"call {i} with an infinite depthwise weight")
    with torch.no_grad():
        weights[0][5, 0, 0, 2] = 0.25
    for i in range(2):
        check(f"call {i} finite again")
    assert run.key is not None


def test_weights_made_under_inference_mode_are_read_as_they_are_at_every_call() -> None:
    """Inference tensors have no version counter: a weight written in place inside
    ``torch.inference_mode()`` moves nothing the run's key reads, so such a run is never
    bound, and each call prepares the weights again."""
    compiled = plait.compile(_block, backend="stax", options={"cache": False})
    inputs = _block_inputs(13)
    with torch.inference_mode():
        weights = [w.clone() for w in _weights(14)]
        assert all(w.is_inference() for w in weights)
        for i in range(2):
            _check_block(compiled, next(inputs), weights, f"call {i}")
        for which, k in sorted(WHICH.items()):
            weights[k].mul_(-1.5)
            _check_block(compiled, next(inputs), weights, f"after the {which} written")
    (run,) = _runs(compiled)
    assert run.key is None and run.refused is False
