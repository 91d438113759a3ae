"""Helpers for the capture tests: run a compiled program and eager PyTorch side by side."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from tests.util import assert_bitwise, contract_tol


def assert_same(
    a: Any, b: Any, what: str = "output", view: Callable[[Any], Any] | None = None
) -> None:
    """Bitwise equality of (nested) outputs: tensors by their bits, everything else by ==.
    ``view``: what an object of the caller's own types is compared by (its fields, as a list
    or dict), None for any other value."""
    seen = None if view is None else view(a)
    if seen is not None:
        assert type(a) is type(b), what
        assert_same(seen, view(b), f"{what} fields", view)
    elif isinstance(a, torch.Tensor):
        assert_bitwise(a, b, what)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{i}]", view)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), what
        for k in a:
            assert_same(a[k], b[k], f"{what}[{k!r}]", view)
    else:
        assert a == b, f"{what}: {a!r} != {b!r}"


def assert_state_equal(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert_bitwise(sa[k], sb[k], k)


def compare_module(
    model: nn.Module, make_input: Callable[[int], Any], calls: int = 3, **compile_kwargs: Any
) -> plait.api.CompiledModule:
    """Compile ``model`` and check each call (fresh inputs, same seed before both) bitwise
    against an eager deep copy, outputs and state (buffers) alike."""
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, backend="eager", **compile_kwargs)
    for i in range(calls):
        args = make_input(i)
        args = args if isinstance(args, tuple) else (args,)
        torch.manual_seed(1000 + i)
        got = compiled(*args)
        torch.manual_seed(1000 + i)
        want = reference(*args)
        assert_same(got, want, f"call {i}")
        assert_state_equal(model, reference)
    return compiled


@pytest.fixture
def opaque_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls with no capture rule skip the ATen trace: they take the opaque path that a call
    the trace refuses takes (what tests of opaque nodes themselves exercise)."""
    from plait.frontend import aten_trace, opaque

    def refuse(
        cx: Any,
        func: Any,
        args: tuple,
        kwargs: dict,
        sampled: Any = aten_trace.NOT_RUN,
        writes: bool = False,
    ) -> Any:
        return aten_trace.Refused("ATen tracing is off in this test", sampled)

    monkeypatch.setattr(opaque, "trace_to_aten", refuse)


def same_as_eager(compiled: Any, eager: Callable[..., Any], seed: int) -> None:
    """One call of a ``(4, 6)`` input drawn under ``seed``, compiled against eager, within the
    contract's model tolerance."""
    torch.manual_seed(seed)
    x = torch.randn(4, 6)
    with torch.no_grad():
        got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))


def recompiled_once(eager: Callable[..., Any], change: Callable[[], None]) -> Any:
    """Two calls, ``change()``, two calls: each against eager (fresh draws), exactly one
    recompile for the change and no fallback; returns the compiled callable."""
    compiled = plait.compile(eager, options={"cache": False})
    same_as_eager(compiled, eager, 1)
    same_as_eager(compiled, eager, 2)
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    change()
    same_as_eager(compiled, eager, 3)
    same_as_eager(compiled, eager, 4)
    assert len(compiled.specializations) == 2, compiled.recompile_reasons
    assert all(s.fallback_reason is None for s in compiled.specializations)
    return compiled
