"""Build a specialization's guards from what capture saw and what the program read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from plait.frontend.guards import Guard, GuardEnv
from plait.frontend.state import ModuleState
from plait.ir import TensorType
from plait.ir.types import dtype_name

_PRIMITIVES = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.Size)


def leaf_kind(x: Any) -> str:
    return "tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def structure_guard(spec: Any, leaves: Sequence[Any], paths: Sequence[str]) -> Guard:
    kinds = tuple(leaf_kind(x) for x in leaves)
    text = "inputs: (" + ", ".join(f"{p}: {k}" for p, k in zip(paths, kinds)) + ")"

    def read(env: GuardEnv) -> Any:
        return (env.spec, tuple(leaf_kind(x) for x in env.leaves))

    return Guard(
        "structure",
        "inputs",
        text,
        (spec, kinds),
        read,
        gate=True,
        fmt=lambda r: "(" + ", ".join(r[1]) + ")",
    )


def tensor_guards(i: int, path: str, t: torch.Tensor, ir_type: TensorType) -> list[Guard]:
    symbolic = {d for d, n in enumerate(ir_type.shape) if not isinstance(n, int)}
    expected = (
        t.dtype,
        t.device,
        tuple(None if d in symbolic else int(n) for d, n in enumerate(t.shape)),
    )
    if symbolic:

        def read(env: GuardEnv) -> Any:
            x = env.leaves[i]
            return (
                x.dtype,
                x.device,
                tuple(None if d in symbolic else n for d, n in enumerate(x.shape)),
            )
    else:

        def read(env: GuardEnv) -> Any:
            x = env.leaves[i]
            return (x.dtype, x.device, x.shape)

    dev = "" if t.device.type == "cpu" else f" on {t.device}"
    rg = t.requires_grad
    return [
        Guard("tensor", path, f"{path}: {ir_type}{dev}", expected, read, fmt=_fmt_tensor),
        Guard(
            "requires_grad",
            f"{path}.requires_grad",
            f"{path}.requires_grad == {rg}",
            rg,
            lambda env: env.leaves[i].requires_grad,
        ),
    ]


def _fmt_tensor(reading: Any) -> str:
    dtype, device, shape = reading
    dims = ", ".join("*" if n is None else str(n) for n in shape)
    return f"{dtype_name(dtype)}[{dims}] on {device}"


def scalar_guard(i: int, path: str, value: Any) -> Guard:
    if isinstance(value, _PRIMITIVES):
        expected = (type(value), value)
        return Guard(
            "scalar",
            path,
            f"{path} == {value!r}",
            expected,
            lambda env: (type(env.leaves[i]), env.leaves[i]),
            fmt=lambda r: f"{r[1]!r} ({r[0].__name__})",
        )
    return Guard(
        "scalar",
        path,
        f"{path} is the captured {type(value).__name__} object",
        True,
        lambda env: env.leaves[i] is value,
    )


def _display(expr: Any, names: dict[sympy.Symbol, sympy.Symbol]) -> str:
    return str(expr.xreplace(names))


def predicate_guards(
    predicates: Sequence[tuple[Any, bool]],
    symbols: dict[sympy.Symbol, tuple[int, int, str]],
    redundant: bool,
) -> list[Guard]:
    """Guards for the size comparisons the program made (``x.shape[0] > 2``)."""
    names = {s: sympy.Symbol(src) for s, (_, _, src) in symbols.items()}
    out: list[Guard] = []
    for rel, outcome in predicates:
        syms = sorted(rel.free_symbols, key=str)
        locs = [symbols[s][:2] for s in syms]
        fn = sympy.lambdify(syms, rel, modules="math")
        text = f"{_display(rel.lhs, names)} {rel.rel_op} {_display(rel.rhs, names)}"

        def read(env: GuardEnv, fn: Any = fn, locs: Any = locs) -> bool:
            return bool(fn(*(env.leaves[i].shape[d] for i, d in locs)))

        def detail(env: GuardEnv, syms: Any = syms, locs: Any = locs) -> str:
            return ", ".join(
                f"{symbols[s][2]} = {env.leaves[i].shape[d]}" for s, (i, d) in zip(syms, locs)
            )

        out.append(
            Guard(
                "dim",
                ", ".join(symbols[s][2] for s in syms),
                text,
                outcome,
                read,
                detail,
                redundant=redundant,
            )
        )
    return out


def _at_least_two(i: int, d: int) -> Callable[[GuardEnv], bool]:
    return lambda env: bool(env.leaves[i].shape[d] >= 2)


def _same_size(i: int, d: int, j: int, e: int) -> Callable[[GuardEnv], bool]:
    return lambda env: bool(env.leaves[j].shape[e] == env.leaves[i].shape[d])


def symbol_guards(
    cx_symbols: dict[sympy.Symbol, tuple[int, int, str]],
    bindings: dict[sympy.Symbol, int],
    duck: Sequence[tuple[int, int, str, sympy.Symbol]],
) -> list[Guard]:
    """Dynamic dims: each symbol is >= 2 (0 and 1 are specialized), and dims that shared a
    size at capture (and so a symbol) still share it."""
    out: list[Guard] = []
    for sym in bindings:
        i, d, src = cx_symbols[sym]
        out.append(Guard("dim", src, f"{src} >= 2", True, _at_least_two(i, d)))
    for j, e, src, sym in duck:
        i, d, first = cx_symbols[sym]
        out.append(Guard("dim", src, f"{src} == {first}", True, _same_size(i, d, j, e)))
    return out


def autocast_on() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def ambient_guards() -> list[Guard]:
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    return [
        Guard(
            "grad_mode",
            "torch.is_grad_enabled()",
            f"torch.is_grad_enabled() == {grad}",
            grad,
            lambda env: torch.is_grad_enabled(),
        ),
        Guard(
            "ambient",
            "torch.get_default_dtype()",
            f"torch.get_default_dtype() == {dtype}",
            dtype,
            lambda env: torch.get_default_dtype(),
        ),
        Guard("ambient", "torch.autocast", "autocast is off", False, lambda env: autocast_on()),
    ]


def _fmt_flags(flags: tuple[bool, ...]) -> str:
    return str(flags[0]) if len(set(flags)) == 1 else "mixed flags"


def module_guards(
    ms: ModuleState, used: Sequence[int], state: Sequence[torch.Tensor]
) -> list[Guard]:
    flags = ms.training_flags()

    def train_detail(env: GuardEnv) -> str:
        now = ms.training_flags()
        changed = [
            f"{ms.module_path(k)}.training is {b}"
            for k, (a, b) in enumerate(zip(flags, now))
            if a != b
        ]
        return ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")

    mixed = len(set(flags)) > 1
    text = f"self.training == {flags[0]}" + (
        " (submodules differ)"
        if mixed
        else f" (and all {len(flags) - 1} submodules)"
        if len(flags) > 1
        else ""
    )

    def sig(t: torch.Tensor) -> tuple[Any, ...]:
        return (t.dtype, t.shape, t.device, t.requires_grad)

    expected = tuple(sig(state[k]) for k in used)
    paths = [ms.entries[k].path for k in used]

    def state_detail(env: GuardEnv) -> str:
        now = ms.fetch()
        bad = [p for p, k, e in zip(paths, used, expected) if sig(now[k]) != e]
        return "changed: " + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")

    return [
        Guard(
            "state",
            "self",
            "self has the captured submodules",
            True,
            lambda env: ms.structure_intact(),
            gate=True,
        ),
        Guard(
            "training",
            "self.training",
            text,
            flags,
            lambda env: ms.training_flags(),
            train_detail,
            fmt=_fmt_flags,
        ),
        Guard(
            "state",
            "parameters and buffers",
            "parameters and buffers keep their dtype, shape, device and requires_grad",
            expected,
            lambda env: tuple(sig(env.state[k]) for k in used),
            state_detail,
            fmt=lambda r: f"{len(r)} signatures",
        ),
    ]
