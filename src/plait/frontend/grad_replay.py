"""The tensors a refused capture computed under grad mode, made again with eager's autograd history.

A capture runs every call of the program for real on samples, under ``no_grad`` (the graph, not
PyTorch's autograd, is what capture differentiates). Where a read of tensor data refuses the
capture of a call made with grad mode on, the call can go on eagerly from the refusal
(:mod:`plait.frontend.continuation`) only if the tensors computed so far carry the history
eager's would: :class:`GradTape` records each call the program made (its function, its
arguments over the samples, its results, the grad mode it ran under), and at the refusal runs
them again, in order, on the caller's tensors (the call's inputs, the module's parameters and
buffers, the constants it read) with that grad mode: the same kernels on the same values, so
each tensor the program holds becomes eager's, history included. The program's Python before
the refusal is not run again.

NOTE: invariants. A call is recorded only at the program's level (not the calls a capture
rule makes while it runs), so replaying the tape makes each call once, under the grad mode and
inference mode it ran in. The replay runs only where every tensor a recorded call reads, and
every tensor the program still holds, is a lifted sample or a recorded call's result, and where
each call ran under the autocast and saved-tensor hooks in force at the refusal (:func:`modes`:
the replay runs under those; a call the program made inside its own ``torch.autocast`` block,
or inside ``saved_tensors_hooks`` or a non-reentrant checkpoint, would not compute or save
what eager's did). That is checked before anything runs: the replay writes the caller's
tensors, as eager did, and cannot be undone. A tape that grows past :data:`LIMIT` bytes of
results stops: that call then runs eagerly from the start, as before.

Example:
    >>> import torch
    >>> w = torch.ones(3, requires_grad=True)
    >>> tape, sample = GradTape(), w.detach()
    >>> tape.root(sample, w)
    >>> with torch.no_grad():
    ...     y = sample * 2
    >>> tape.record(torch.mul, (sample, 2), {}, y, grad=True)
    >>> made = tape.replay([y])
    >>> made[0].requires_grad, made[0].tolist()
    (True, [2.0, 2.0, 2.0])
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from plait.frontend import pytree
from plait.frontend.views import tensors_in

LIMIT = 256 << 20  # NOTE: bytes of recorded results held until a refusal replays them


def _remap(x: Any, env: dict[int, torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return env[id(x)]
    if type(x) is tuple or type(x) is list:
        return type(x)(_remap(v, env) for v in x)
    if isinstance(x, (list, tuple)) and pytree.is_named_sequence(x):
        return pytree.same_type(x, [_remap(v, env) for v in x])
    if isinstance(x, dict):
        return {k: _remap(v, env) for k, v in x.items()}
    return x


def modes() -> tuple[Any, ...]:
    """The thread's state, beside grad and inference mode, that changes what a call computes or
    the history it leaves: autocast's (on, and its dtype, per device type) and the saved-tensor
    hooks autograd calls on each tensor it saves (``saved_tensors_hooks``, a non-reentrant
    ``torch.utils.checkpoint``)."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return (
        *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")),
        torch._C._autograd._saved_tensors_hooks_is_enabled(),  # type: ignore[attr-defined]
        *(hooks or ()),
    )


class GradTape:
    """The program's calls during one capture, to make again with grad (see the module doc)."""

    def __init__(self) -> None:
        # NOTE: each lifted sample with what names the caller's tensor it stands for
        self.roots: list[tuple[torch.Tensor, Any]] = []
        # NOTE: each call: function, arguments, results, grad mode, inference mode, modes()
        self.calls: list[tuple[Any, Any, dict, Any, bool, bool, tuple]] = []
        self.held = 0
        self.broken: str | None = None

    def root(self, sample: torch.Tensor, source: Any) -> None:
        """A lifted sample, and what the replay's ``resolve`` turns into the caller's tensor."""
        self.roots.append((sample, source))

    def record(self, func: Any, pargs: Any, pkwargs: dict, out: Any, *, grad: bool) -> None:
        """A call the program made: ``func`` on the samples, ``out`` its results."""
        if self.broken is not None:
            return
        self.held += sum(t.untyped_storage().nbytes() for t in tensors_in(out))
        if self.held > LIMIT:
            self.stop(f"the calls before it hold more than {LIMIT >> 20} MiB of results")
            return
        inference = torch.is_inference_mode_enabled()
        self.calls.append((func, pargs, pkwargs, out, grad, inference, modes()))

    def stop(self, why: str) -> None:
        self.broken = self.broken or why
        self.calls.clear()
        self.roots.clear()

    def why_not(self, held: list[torch.Tensor]) -> str | None:
        """Why the tape cannot make ``held`` (the samples the program holds) again, or None."""
        if self.broken is not None:
            return self.broken
        known = {id(s) for s, _ in self.roots}
        now = modes()
        for func, pargs, pkwargs, out, _, _, ran in self.calls:
            name = getattr(func, "__name__", str(func))
            if any(id(t) not in known for t in tensors_in((pargs, pkwargs))):
                return f"{name} read a tensor that no call of the program made"
            if len(ran) != len(now) or any(a is not b and a != b for a, b in zip(ran, now)):
                return f"{name} ran under another autocast or other saved-tensor hooks"
            known.update(id(t) for t in tensors_in(out))
        if any(id(t) not in known for t in held):
            return "the program holds a tensor that no call of the program made"
        return None

    def replay(
        self, held: list[torch.Tensor], resolve: Callable[[Any], torch.Tensor] = lambda t: t
    ) -> list[torch.Tensor]:
        """Run the recorded calls again on the caller's tensors (``resolve`` of each root's
        source), each under its grad mode; returns the tensor made for each of ``held``. Call
        after :meth:`why_not` said None."""
        env = {id(s): resolve(src) for s, src in self.roots}
        with torch._C.DisableTorchFunctionSubclass():
            for func, pargs, pkwargs, out, grad, inference, _ in self.calls:
                with _inference(inference), torch.set_grad_enabled(grad):
                    made = func(*_remap(pargs, env), **_remap(pkwargs, env))
                for o, m in zip(tensors_in(out), tensors_in(made)):
                    env[id(o)] = m
        result = [env[id(t)] for t in held]
        self.stop("replayed")
        return result


def _inference(on: bool) -> Any:
    """Inference mode as a recorded call ran in (its tensors are inference tensors, as eager's)."""
    if on == torch.is_inference_mode_enabled():
        return contextlib.nullcontext()
    return torch.inference_mode(on)
