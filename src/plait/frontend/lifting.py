"""The graph inputs a capture starts from: the call's tensors (each traced through a clone of
its own; a tensor passed twice through one; a parameter or buffer of the module passed as an
input as that state tensor) and the module's parameters (traced in place) and buffers (through
clones)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.parameter import is_lazy

from plait.frontend.capture_values import Tracer
from plait.frontend.layout_clone import layout_clone
from plait.frontend.state import ModuleState
from plait.frontend.tracer import CaptureContext


def _input_name(path: str, taken: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", path).strip("_") or "arg"
    base, n = name, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def lift_user_inputs(
    cx: CaptureContext, leaves: list[Any], paths: list[str], state: Sequence[torch.Tensor] = ()
) -> list[Any]:
    """The call's leaves with each tensor traced; one that is a tensor of the module's state
    (``state``: its tensors, as ``ModuleState.fetch`` gives them) is left as it is, for
    :func:`bind_state_leaves` (recorded in ``cx.state_leaves``)."""
    out = list(leaves)
    taken: set[str] = set()
    first: dict[int, int] = {}
    entry_of: dict[int, int] = {}
    for k, t in enumerate(state):
        entry_of.setdefault(id(t), k)
    for i, (leaf, path) in enumerate(zip(leaves, paths)):
        if not isinstance(leaf, torch.Tensor):
            continue
        cx.input_paths.setdefault(id(leaf), path)
        if id(leaf) in entry_of:
            cx.state_leaves.append((i, entry_of[id(leaf)]))
            continue
        j = first.setdefault(id(leaf), i)
        if j != i:  # NOTE: the same tensor passed again: one tracer, as eager has one object
            cx.same_leaves.append((i, j))
            out[i] = out[j]
            continue
        if isinstance(leaf, Tracer):
            cx.limitation("a tensor from a running capture was passed to another capture")
        if leaf.requires_grad and not leaf.is_leaf:
            cx.nonleaf_inputs.add(i)
        ir_shape, exprs = cx.input_dims(i, path, leaf.shape)
        cx.current = f"input {path}"
        ty = cx.type_of_plain(leaf).with_shape(ir_shape)
        with torch._C.DisableTorchFunction():
            sample = layout_clone(leaf.detach())
        tr = cx.lift_input(
            sample,
            kind="user",
            name=_input_name(path, taken),
            ref=i,
            writeback=True,
            requires_grad=leaf.requires_grad,
            ir_type=ty,
        )
        tr._dim_exprs = exprs
        tr._lift.origin = leaf  # type: ignore[union-attr]
        out[i] = tr
    cx.current = "<capture>"
    return out


def bind_state_leaves(cx: CaptureContext, traced: list[Any], state_tracers: list[Tracer]) -> None:
    """Trace each input that is a parameter or buffer of the module as that state tensor (its
    tracer from :func:`lift_state`): ``x is self.weight`` reads as in eager, and a write
    through either name is a write of the state tensor."""
    for i, k in cx.state_leaves:
        traced[i] = state_tracers[k]


def lift_state(
    cx: CaptureContext, ms: ModuleState | None, tensors: list[torch.Tensor]
) -> tuple[list[Tracer], list[Any]]:
    """A tracer for each of ``ms``'s tensors (``tensors``, as ``ms.fetch()`` gave them)."""
    if ms is None:
        return [], []
    for prefix, mod in ms.modules:
        if isinstance(mod, torch.jit.ScriptModule):
            cx.limitation(
                f"{prefix or 'the module'} is a TorchScript module ({type(mod).__name__}, made "
                "by torch.jit.script or torch.jit.trace), which capture cannot run: compile the "
                "Python module it was made from"
            )
    for entry, t in zip(ms.entries, tensors):
        if is_lazy(t):
            # NOTE: a lazy module (nn.LazyLinear) gives it a shape at its first call, from a
            # pre-hook that reads the module's own slots: traced, they hold no uninitialized one
            cx.limitation(
                f"{entry.path} is an uninitialized parameter of a lazy module (its shape comes "
                "from the first call's input, which runs eagerly; with fullgraph=True, call the "
                "model once before compiling it)"
            )
        elif t.is_inference():
            # NOTE: a compiled program's guards and prepared weights see writes to its state
            # through version counters, which inference tensors do not have
            cx.limitation(
                f"{entry.path} is an inference tensor (made under torch.inference_mode()), "
                "whose writes no version counter records: create or load the model outside "
                "torch.inference_mode() (calling the compiled model inside it is fine)"
            )
    tracers: list[Tracer] = []
    for k, (entry, t) in enumerate(zip(ms.entries, tensors)):
        with torch._C.DisableTorchFunction():
            # NOTE: parameters are traced in place (their writes are refused); buffers through
            # clones, so BatchNorm's running statistics stay untouched by capture.
            sample = t.detach() if entry.kind == "param" else layout_clone(t.detach())
        tracers.append(
            cx.lift_input(
                sample,
                kind=entry.kind,
                name=entry.path,
                ref=k,
                writeback=entry.kind == "buffer",
                requires_grad=t.requires_grad,
            )
        )
        tracers[-1]._lift.origin = t  # type: ignore[union-attr]
    return tracers, tensors
