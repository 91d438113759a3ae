"""Build a specialization's guards from what capture saw and what the program read."""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from torch.nn.parameter import is_lazy

from plait.frontend.state import ModuleState
from plait.frontend.tensor_attrs import ANY_ATTRIBUTE
from plait.guards.guard import (
    Guard,
    GuardEnv,
    ReadAttrs,
    ReadCall,
    ReadEdges,
    ReadLeaf,
    ReadStructure,
    ReadTensors,
    TensorCheck,
    float_bits,
)
from plait.ir import TensorType
from plait.ir.types import dtype_name
from plait.symbolic.exact import exact_function

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
        fmt=lambda r: structure_text(r[0], r[1]),
        native=ReadStructure(spec, kinds),
    )


def structure_text(spec: Any, kinds: Sequence[str]) -> str:
    """The call's structure with each leaf's kind, by argument: ``(inp: {'a': tensor, 'b':
    [tensor]}, scale: float)`` (dict keys in their order: a call differing only in it shows
    where)."""
    it = iter(kinds)

    def text(s: Any) -> str:
        tag = s[0] if isinstance(s, tuple) and s else None
        if tag == "*":
            return next(it, "?")
        if tag in ("tuple", "list"):
            body = ", ".join(text(k) for k in s[2])
            return f"({body})" if tag == "tuple" else f"[{body}]"
        if tag == "alias":  # NOTE: the call's container met before, by its position
            return f"<the call's container {s[1]}>"
        if tag in ("dict", "defaultdict"):
            keys, kids = s[-2], s[-1]
            return "{" + ", ".join(f"{k!r}: {text(v)}" for k, v in zip(keys, kids)) + "}"
        if isinstance(tag, str):
            return f"{tag}(" + ", ".join(text(k) for k in s[-1]) + ")"
        return "?"

    named = isinstance(spec, tuple) and all(
        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in spec
    )
    if named:
        return "(" + ", ".join(f"{name}: {text(sub)}" for name, sub in spec) + ")"
    out = text(spec)
    return out if out.startswith("(") else f"({out})"


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
    meta = TensorCheck("leaf", i, dtype=expected[0], device=expected[1], shape=expected[2])
    return [
        Guard(
            "tensor",
            path,
            f"{path}: {ir_type}{dev}",
            expected,
            read,
            fmt=_fmt_tensor,
            native=ReadTensors((meta,)),
        ),
        Guard(
            "requires_grad",
            f"{path}.requires_grad",
            f"{path}.requires_grad == {rg}",
            rg,
            lambda env: env.leaves[i].requires_grad,
            native=ReadTensors((TensorCheck("leaf", i, requires_grad=rg),)),
        ),
    ]


def _fmt_tensor(reading: Any) -> str:
    dtype, device, shape = reading
    dims = ", ".join("*" if n is None else str(n) for n in shape)
    return f"{dtype_name(dtype)}[{dims}] on {device}"


def scalar_reading(x: Any) -> tuple[Any, Any]:
    """What a scalar guard compares: ``(type, value)``, a float (or complex) by its bit
    pattern (``("bits", ...)``) so that a guard tells ``-0.0`` from ``0.0`` and holds for the
    same NaN."""
    if isinstance(x, float):
        return (type(x), ("bits", float_bits(x)))
    if isinstance(x, complex):
        return (type(x), ("bits", float_bits(x.real), float_bits(x.imag)))
    return (type(x), x)


def _show_scalar(reading: tuple[Any, Any]) -> str:
    cls, value = reading
    if isinstance(value, tuple) and value[:1] == ("bits",):
        parts = [struct.unpack("<d", struct.pack("<q", b))[0] for b in value[1:]]
        shown = repr(parts[0]) if len(parts) == 1 else repr(complex(*parts))
        if not any(math.isnan(p) for p in parts):
            return f"{shown} ({cls.__name__})"
        # NOTE: NaNs of other bits print alike
        bits = ", ".join(f"{b & (2**64 - 1):#018x}" for b in value[1:])
        return f"{shown} ({cls.__name__}, bits {bits})"
    return f"{value!r} ({cls.__name__})"


def scalar_guard(i: int, path: str, value: Any) -> Guard:
    if isinstance(value, (*_PRIMITIVES, complex)):
        expected = scalar_reading(value)
        # NOTE: floats by bit pattern, natively too; a complex is read in Python
        native: ReadLeaf | None = ReadLeaf(i, value, bits=isinstance(value, float))
        if isinstance(value, complex):
            native = None
        return Guard(
            "scalar",
            path,
            f"{path} == {value!r}",
            expected,
            lambda env: scalar_reading(env.leaves[i]),
            fmt=_show_scalar,
            native=native,
        )
    return Guard(
        "scalar",
        path,
        f"{path} is the captured {type(value).__name__} object",
        True,
        lambda env: env.leaves[i] is value,
        portable=False,
        native=ReadLeaf(i, value, identity=True),
    )


def input_attrs_guard(absent: Sequence[tuple[int, str]], paths: Sequence[str]) -> Guard:
    """The input tensors lack the Python attributes the program looked for on them and did not
    find (``getattr(x, "scale", 1.0)`` took its default), or any at all where it read their
    whole dict (``vars(x)``: ``ANY_ATTRIBUTE``): a call whose tensor holds one would read it
    in eager (:mod:`plait.frontend.tensor_attrs`)."""
    pairs = tuple(absent)

    def name_of(i: int, name: str) -> str:
        path = paths[i] if i < len(paths) else str(i)
        return f"vars({path})" if name == ANY_ATTRIBUTE else f"{path}.{name}"

    shown = ", ".join(name_of(i, name) for i, name in pairs)

    def holds(leaf: Any, name: str) -> bool:
        own = getattr(leaf, "__dict__", None) or {}
        return bool(own) if name == ANY_ATTRIBUTE else name in own

    def read(env: GuardEnv) -> tuple[str, ...]:
        leaves = env.leaves
        return tuple(name_of(i, name) for i, name in pairs if holds(leaves[i], name))

    return Guard("python", "input tensor attributes", f"inputs lack {shown}", (), read)


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
        fn = exact_function(rel, syms)  # NOTE: lambdify's code divides in floating point
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


def autocast_state() -> tuple[str, ...]:
    """The autocast a capture sees: ``()`` when off, else each enabled device with its dtype
    (``("cpu:bfloat16",)``): a program captured under one autocast dtype casts to it, so the
    dtype is guarded as well as the switch."""
    return tuple(
        f"{d}:{str(torch.get_autocast_dtype(d)).removeprefix('torch.')}"
        for d in ("cpu", "cuda")
        if torch.is_autocast_enabled(d)
    )


# NOTE: autocast on no device at all implies the state (): one cheap call decides the common
# case (autocast off); any other answer is decided by autocast_state itself.
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)


def _autocast_state_fast() -> tuple[str, ...]:
    """:func:`autocast_state`, with one cheap call deciding the common case (off)."""
    if _ANY_AUTOCAST is not None and not _ANY_AUTOCAST():
        return ()
    return autocast_state()


def _autocast_read(expected: tuple[str, ...]) -> ReadCall:
    return ReadCall(_autocast_state_fast)


def ambient_guards() -> list[Guard]:
    """What capture itself read of the ambient state: grad mode, default dtype, autocast."""
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    autocast = autocast_state()
    return [
        Guard(
            "grad_mode",
            "torch.is_grad_enabled()",
            f"torch.is_grad_enabled() == {grad}",
            grad,
            lambda env: torch.is_grad_enabled(),
            native=ReadCall(torch.is_grad_enabled),
        ),
        Guard(
            "ambient",
            "torch.get_default_dtype()",
            f"torch.get_default_dtype() == {dtype}",
            dtype,
            lambda env: torch.get_default_dtype(),
            native=ReadCall(torch.get_default_dtype),
        ),
        Guard(
            "ambient",
            "torch.autocast",
            f"autocast is {', '.join(autocast) if autocast else 'off'}",
            autocast,
            lambda env: autocast_state(),
            native=_autocast_read(autocast),
        ),
    ]


def _fmt_flags(flags: tuple[bool, ...]) -> str:
    return str(flags[0]) if len(set(flags)) == 1 else "mixed flags"


_SIG = operator.attrgetter("dtype", "shape", "device", "requires_grad")
# NOTE: the source of the guard on the state's signatures; a compile that freezes tensors may
# take over its fast-path duty (plait.guards.state) with a cheaper exact check of its own.
STATE_SIGNATURES = "parameters and buffers"
_TRAINING = operator.attrgetter("training")


def _picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """``pick(seq)``: the items at ``indices``, as a sequence (one C call)."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        k = indices[0]
        return lambda seq: (seq[k],)
    return operator.itemgetter(*indices)


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

    # NOTE: a lazy module's uninitialized parameter (a fallback's: capture refuses it) has a
    # signature of its own: its first call gives it a shape, and the next call captures
    sig = _lazy_sig if any(is_lazy(state[k]) for k in used) else _SIG
    expected = tuple(map(sig, (state[k] for k in used)))
    signatures = ReadTensors(tuple(_sig_check(k, s) for k, s in zip(used, expected)))
    paths = [ms.entries[k].path for k in used]
    pick = _picker(used)

    def state_detail(env: GuardEnv) -> str:
        now = ms.fetch()
        bad = [p for p, k, e in zip(paths, used, expected) if sig(now[k]) != e]
        return "changed: " + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")

    # NOTE: the fast path reads with C-level maps over precomputed tables (a few tens of
    # nanoseconds per module or tensor); the module's own methods stay the reference.
    modules = [m for _, m in ms.modules]
    # NOTE: and the entries that read the state are current (ModuleState.status): a parameter
    # or buffer registered, deleted or set to None since reorders the state a program reads
    # and each slot of tied weights holds the tensor its entry reads (ModuleState.tied)
    tables = [p._modules for p, _, _ in ms.edges] + [t for t, _, _ in ms.tied] + [ms.status]
    keys = [k for _, k, _ in ms.edges] + [a for _, a, _ in ms.tied] + ["current"]
    children: list[Any] = [c for _, _, c in ms.edges] + [x for _, _, x in ms.tied] + [ms]

    def intact(env: GuardEnv) -> bool:
        return all(map(operator.is_, map(dict.get, tables, keys), children))

    return [
        Guard(
            "state",
            "self",
            "self has the captured submodules",
            True,
            intact,
            gate=True,
            native=ReadEdges(tuple(tables), tuple(keys), tuple(children)),
        ),
        Guard(
            "training",
            "self.training",
            text,
            flags,
            lambda env: tuple(map(_TRAINING, modules)),
            train_detail,
            fmt=_fmt_flags,
            native=ReadAttrs(tuple(modules), "training"),
        ),
        Guard(
            "state",
            STATE_SIGNATURES,
            "parameters and buffers keep their dtype, shape, device and requires_grad",
            expected,
            lambda env: tuple(map(sig, pick(env.state))),
            state_detail,
            fmt=lambda r: f"{len(r)} signatures",
            native=signatures,
        ),
    ]


def _lazy_sig(t: torch.Tensor) -> tuple[Any, ...]:
    """A tensor's signature, an uninitialized parameter's included (its shape, read by
    PyTorch's own property, raises; the tensor under it is empty)."""
    if not is_lazy(t):
        return _SIG(t)
    with torch._C.DisableTorchFunction():  # NOTE: its class overrides `shape` to raise
        return t.dtype, torch._C.TensorBase.size(t), t.device, t.requires_grad


def _sig_check(k: int, sig: tuple[Any, ...]) -> TensorCheck:
    """The check of state tensor ``k`` against its signature (dtype, shape, device,
    requires_grad)."""
    dtype, shape, device, rg = sig
    return TensorCheck("state", k, dtype=dtype, device=device, shape=tuple(shape), requires_grad=rg)


_STRIDES = operator.methodcaller("stride")


def _layout(t: torch.Tensor) -> Any:
    """A tensor's layout as a symbolic program's guard reads it: ``"contiguous"`` for a
    row-major tensor (its strides follow its sizes, which the size guards judge; every view,
    reshape and contiguity question has the same answer for each such tensor of the guarded
    shape), else its strides."""
    return "contiguous" if t.is_contiguous() else t.stride()


def layout_guard(
    where: str,
    leaves: Sequence[Any],
    paths: Sequence[str],
    used: Sequence[int],
    state: Sequence[torch.Tensor],
    symbolic: bool = False,
    source: str = "strides",
) -> Guard:
    """The program read a layout (``is_contiguous`` in ``where``): the answer depends on the
    strides of the tensors it reads, so the strides of every tensor input and used parameter
    or buffer are pinned; where sizes are symbolic, a row-major tensor's only its contiguity
    (its strides change with the sizes the program serves)."""
    tensor_ix = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    pick_leaves, pick_state = _picker(tensor_ix), _picker(used)
    strides = _layout if symbolic else _STRIDES
    expected = (
        tuple(map(strides, pick_leaves(leaves))),
        tuple(map(strides, pick_state(state))) if used else (),
    )
    names = ", ".join([paths[i] for i in tensor_ix][:3] + (["..."] if len(tensor_ix) > 3 else []))

    def read(env: GuardEnv) -> Any:
        return (
            tuple(map(strides, pick_leaves(env.leaves))),
            tuple(map(strides, pick_state(env.state))) if used else (),
        )

    return Guard(
        "layout",
        source,
        f"{names} keep their strides (the program read a layout in {where})",
        expected,
        read,
        fmt=lambda r: f"strides {list(r[0])}",
    )


def _const_signature(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, tuple(t.shape), t.stride(), t.device, t.requires_grad)


def const_guard(consts: Sequence[torch.Tensor]) -> list[Guard]:
    """The constant tensors the program reads (a global tensor, a plain module attribute) keep
    their dtype, shape, strides, device and ``requires_grad``: their values are read live on
    each call, but a graph fixed their types (``T.data = torch.randn(8)``, ``T.resize_(1)``,
    ``T.requires_grad_()`` change them under the same identity: one recompile, where the graph
    would be fed a tensor of another type, or a size or flag the program read would be stale)."""
    if not consts:
        return []
    kept = tuple(consts)
    expected = tuple(map(_const_signature, kept))

    def read(env: GuardEnv = None) -> tuple[Any, ...]:  # type: ignore[assignment]
        return tuple(map(_const_signature, kept))

    def detail(env: GuardEnv) -> str:
        now = read(env)
        bad = [f"const{k}" for k, (a, b) in enumerate(zip(expected, now)) if a != b]
        return "changed: " + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")

    return [
        Guard(
            "tensor",
            "constant tensors",
            "constant tensors keep their dtype, shape, strides, device and requires_grad",
            expected,
            read,
            detail,
            fmt=lambda r: f"{len(r)} signatures",
            native=ReadCall(read),
        )
    ]
