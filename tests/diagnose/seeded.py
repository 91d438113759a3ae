"""Seeded miscompiles: deliberate compiler bugs that ``plait.diagnose.bisect`` must find.

Each is a compiler extension or patch, never model code: a wrong rewrite rule in a pass a user
registers, a wrong constant fold, a wrong fused kernel, a wrong extern call argument. A test
process installs one with :func:`seeded`; a repro's fresh process installs it with
``python -c "import tests.diagnose.seeded as s; s.install(NAME); ..."`` (the bug is in the
compiler there too; the model's code is not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from plait.codegen import extern, scalar
from plait.ir import Value
from plait.passes import CONTRACT, PassContext, all_passes, register_pass
from plait.passes import fold as fold_pass
from plait.passes.rewrite import Op, Rule, Var, apply_rules

USER_PASS = "fast-sigmoid"
USER_RULE = "fast-sigmoid.tanh-form"


def _tanh_form(m: Any, emit: Any) -> Any:
    # NOTE: the bug: sigmoid(x) = 0.5 * tanh(x / 2) + 0.5; this rule forgets the halving
    t = emit("tanh", m["x"])
    return emit("add", emit("mul", t, 0.5), 0.5)


def register_user_pass() -> None:
    """A user's pass with one wrong rewrite rule (registered once per process)."""
    if USER_PASS in all_passes():
        return

    @register_pass(USER_PASS, CONTRACT, rules=(USER_RULE,))
    def fast_sigmoid(graph: Any, ctx: PassContext) -> Any:
        """sigmoid through tanh (a user's pass)."""
        return apply_rules(graph, [Rule(USER_RULE, Op("sigmoid", Var("x")), _tanh_form)],
                           ctx.record)  # fmt: skip


register_user_pass()


def _wrong_fold(original: Callable[..., Any]) -> Callable[..., Any]:
    def evaluate(o: Any, graph: Any, cache: dict[int, Any]) -> Any:
        out = original(o, graph, cache)
        if isinstance(o, Value) and o.producer is not None and o.producer.op == "sub":
            return -out  # NOTE: the bug: a folded subtraction with its operands swapped
        return out

    return evaluate


def _wrong_sigmoid(b: Any, node: Any, args: Any, idx: Any) -> Any:
    # NOTE: the bug: 1 / (1 + exp(x)) (the sign of the exponent dropped)
    t = scalar.out_type(node)
    x = scalar.to(b, args[0], t)
    one = scalar.to(b, scalar.Arg(None, 1.0, None), t)
    return b.op("div", [one, b.op("add", [one, b.op("exp", [x], t)], t)], t)


def _wrong_avg_pool(n: Any, consts: Any) -> Any:
    a = n.attrs
    k, s, p = a["kernel_size"], a["stride"] or a["kernel_size"], a["padding"]
    c, inc, div = a["ceil_mode"], a["count_include_pad"], a["divisor_override"]

    def fn(x: Any) -> Any:
        # NOTE: the bug: count_include_pad passed negated
        return torch._C._nn.avg_pool2d(x, k, s, p, c, not inc, div)

    return extern.ExternCall(fn, "reduction", "aten.avg_pool2d")


_PATCHES: dict[str, tuple[Any, str, Callable[[Any], Any]]] = {
    "fold": (fold_pass, "_evaluate", _wrong_fold),
    "fused-kernel": (scalar.RULES, "sigmoid", lambda _: _wrong_sigmoid),
    "extern-argument": (extern.EXTERN_RULES, "avg_pool2d", lambda _: _wrong_avg_pool),
}
BUGS = ("user-pass", *_PATCHES)


def _get(target: Any, key: str) -> Any:
    return target[key] if isinstance(target, dict) else getattr(target, key)


def _set(target: Any, key: str, value: Any) -> None:
    if isinstance(target, dict):
        target[key] = value
    else:
        setattr(target, key, value)


def install(name: str) -> Callable[[], None]:
    """Install bug ``name``; returns what uninstalls it."""
    if name == "user-pass":
        register_user_pass()
        return lambda: None
    target, key, make = _PATCHES[name]
    original = _get(target, key)
    _set(target, key, make(original))
    return lambda: _set(target, key, original)


@contextlib.contextmanager
def seeded(name: str) -> Iterator[None]:
    undo = install(name)
    try:
        yield
    finally:
        undo()
