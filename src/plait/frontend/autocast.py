"""Capture under ``torch.autocast``: autocast's casts written into the graph.

Every sample of a capture runs under the caller's autocast, so each call's result has the dtype
autocast gave it. Where autocast changed a call's floating result dtype (its lower-precision ops
cast their inputs down, its float32 ops up), :func:`autocast_inputs` casts the call's floating
operands to it as IR ``to_dtype`` nodes before the call's capture rule runs, so the IR op sees
the operands autocast gave the kernel and the casts' derivatives flow. Whether autocast changed
a call is found by running it again without autocast, on copies of the samples (nothing is
written twice, the generators' states are restored). The compiled program then runs with
autocast off (:func:`plait.autograd.function.without_autocast`), and the guards pin the
autocast dtype.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     prog = capture_program(torch.mm, (torch.randn(2, 3), torch.randn(3, 4)))
    >>> [n.op for n in prog.graph.nodes]
    ['to_dtype', 'to_dtype', 'matmul']
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from plait.frontend import pytree
from plait.frontend.capture_values import Tracer
from plait.frontend.tracer import CaptureContext, pytree_leaves
from plait.frontend.writes import write_targets

_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32}


def autocast_inputs(
    cx: CaptureContext, func: Any, out: Any, args: tuple, kwargs: dict, inplace: bool
) -> tuple[tuple, dict]:
    """The call's operands as autocast gave them to the op. Where autocast changed the call's
    floating result dtype, each floating operand of another dtype is cast to the result's. A
    call autocast left alone (the same result run without autocast: mixed-dtype batch norm,
    promoting arithmetic) keeps its operands. Never replaced: what the call writes (an in-place
    op's first operand, batch norm's running statistics)."""
    found = [o for o in pytree_leaves(out) if isinstance(o, torch.Tensor)]
    # NOTE: a complex result (stft's) reads as its parts' float dtype
    floats = [_REAL.get(o.dtype, o.dtype) for o in found if o.is_floating_point() or o.is_complex()]
    if not floats:
        return args, kwargs
    target = floats[0]
    operands: list[Tracer] = []
    cx.unwrap((args, kwargs), operands)
    # NOTE: only the plain samples are read here: a Tracer's attributes are torch calls
    if all(t._plain.dtype == target for t in operands if t._plain.is_floating_point()):
        return args, kwargs
    # NOTE: a call whose result dtype autocast did not change either was left alone
    # (mixed-dtype batch norm keeps its bfloat16 result and float32 weights), or is on
    # autocast's float32 list with operands that promote to float32 anyway (the bfloat16
    # logits of binary_cross_entropy_with_logits, which eager's own ops would compute in
    # bfloat16 before promoting): a cast up to float32 is exact, and is what autocast does
    unchanged = _result_dtype_without_autocast(cx, func, args, kwargs) == target
    if unchanged and target != torch.float32:
        return args, kwargs
    written = {id(cx.tracer(t)) for t in write_targets(cx.current, func, args, kwargs)}
    if inplace and args and isinstance(args[0], torch.Tensor):
        written.add(id(cx.tracer(args[0])))

    def cast(x: Any) -> Any:
        if (
            isinstance(x, Tracer)
            and id(x) not in written
            and x._plain.is_floating_point()
            and x._plain.dtype not in (target, torch.float64)  # NOTE: autocast leaves float64
        ):
            value = cx.call("to_dtype", cx.value(x), dtype=target)
            return cx.new_root(x._plain.to(target), value, x._rg)
        if type(x) in (list, tuple):
            return type(x)(cast(v) for v in x)
        return x

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _result_dtype_without_autocast(
    cx: CaptureContext, func: Any, args: tuple, kwargs: dict
) -> torch.dtype | None:
    """The call's first floating result dtype with autocast off, run on copies of the samples;
    None where it has none or PyTorch refuses the operands without autocast."""
    plain = cx.unwrap((args, kwargs), [])
    pargs, pkwargs = pytree.map_leaves(
        lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, plain
    )
    devices = [d for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    # NOTE: every generator it could draw from is restored (CUDA's where initialized),
    # through the generators themselves: torch-level calls here would be the program's
    generators = [torch.default_generator]
    if torch.cuda.is_initialized():
        generators += list(torch.cuda.default_generators)
    states = [g.get_state() for g in generators]
    try:
        with contextlib.ExitStack() as stack:
            for d in devices:
                stack.enter_context(torch.autocast(d, enabled=False))
            stack.enter_context(torch._C.DisableTorchFunctionSubclass())
            stack.enter_context(torch.no_grad())
            result = func(*pargs, **pkwargs)
    except (RuntimeError, TypeError, ValueError):
        return None  # NOTE: eager refuses these operands without autocast's casts
    finally:
        for g, state in zip(generators, states):
            g.set_state(state)
    for o in pytree_leaves(result):
        if isinstance(o, torch.Tensor) and o.is_floating_point():
            return o.dtype
    return None
