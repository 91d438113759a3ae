"""Tie a compiled forward and backward into PyTorch's autograd.

:class:`CompiledAutograd` holds two executors (any callables over a list of values: the Stax
programs, or the reference interpreter in tests) and the partition's calling convention. Calling
it runs the forward inside a ``torch.autograd.Function``: the saved values are kept with
``save_for_backward`` (so an in-place write to one before the backward raises PyTorch's error),
and PyTorch's engine calls the backward with the cotangents, so ``loss.backward()``, ``.grad``
accumulation, hooks on inputs, optimizers and frozen parameters work as in eager.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, interpret
    >>> from plait.autograd import build_joint, partition
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float64))
    >>> b.output(b.call("mul", x, x))
    >>> p = partition(build_joint(b.build(), wrt=["x"]))
    >>> run = CompiledAutograd.interpreted(p, n_inputs=1, n_outputs=1, cotangents=[0], grads=[0])
    >>> t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    >>> run([t])[0].sum().backward()
    >>> t.grad.tolist()
    [2.0, 4.0, 6.0]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from plait.autograd.partition import Partition
from plait.errors import InternalValueError, PlaitCompileError

Executor = Callable[[list[Any]], Sequence[Any]]


_DEVICES = ("cpu", "cuda")
# NOTE: one cheap call answers the common case (autocast off everywhere) on every program call
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)


def any_autocast() -> bool:
    """Is autocast on for any device (one cheap call where PyTorch has it)?"""
    if _ANY_AUTOCAST is not None:
        return bool(_ANY_AUTOCAST())
    return any(torch.is_autocast_enabled(d) for d in _DEVICES)


def without_autocast(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with autocast off (see :func:`autocast_off`); no context entered in the
    common case, autocast off already: this runs on every compiled call."""
    if not any_autocast():
        return fn(*args)
    with autocast_off():
        return fn(*args)


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Autocast disabled while a compiled program runs: capture wrote autocast's casts into the
    graph, so the program's PyTorch calls must not cast again."""
    on = [d for d in _DEVICES if torch.is_autocast_enabled(d)]
    if not on:
        yield
        return
    with contextlib.ExitStack() as stack:
        for d in on:
            stack.enter_context(torch.autocast(d, enabled=False))
        yield


def transforms_active() -> bool:
    """Is a ``torch.func`` transform (grad, vjp, jacrev, vmap; a batched backward's vmap) running
    the caller? A compiled program's kernels read real tensors and its autograd function has no
    transform rules: under one, PyTorch would fail inside the call."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _legacy_batched(t: Any) -> bool:
    """A cotangent batched by ``torch.autograd.grad(..., is_grads_batched=True)`` (the legacy
    vmap: no functorch interpreter is running)."""
    return isinstance(t, torch.Tensor) and torch._C._functorch.is_legacy_batchedtensor(t)


class DoubleBackwardError(PlaitCompileError):
    """A gradient of a gradient through a compiled backward (``create_graph=True``)."""

    error_code = "PLAIT-C122"


class CompiledAutograd:
    """Runs a partitioned program under PyTorch's autograd; see the module doc."""

    def __init__(
        self,
        forward: Executor,
        backward: Executor,
        *,
        n_inputs: int,
        n_outputs: int,
        cotangents: Sequence[int],
        grads: Sequence[int],
        reaches: Sequence[Sequence[int]] | None = None,
        name: str = "a plait-compiled program",
    ) -> None:
        self.forward = forward
        self.backward = backward
        self.n_inputs = n_inputs
        self.n_outputs = n_outputs
        self.cotangents = list(cotangents)  # forward outputs that take a cotangent
        self.grads = list(grads)  # forward inputs whose gradient the backward returns
        # NOTE: per gradient, the positions in `cotangents` of the outputs its input reaches
        # (plait.autograd.Joint.reaches); None: every output
        everything = list(range(len(self.cotangents)))
        self.reaches = (
            [list(r) for r in reaches] if reaches is not None else [everything for _ in grads]
        )
        self.name = name

    @classmethod
    def interpreted(cls, p: Partition, **conv: Any) -> CompiledAutograd:
        """Both graphs run by the reference interpreter (tests, and the eager backend)."""
        from plait.ir.interpret import interpret

        return cls(
            lambda vs: interpret(p.forward, vs, check_types=False),
            lambda vs: interpret(p.backward, vs, check_types=False),
            **conv,
        )

    def __call__(self, values: list[Any]) -> list[Any]:
        if len(values) != self.n_inputs:
            raise InternalValueError(f"{self.name} takes {self.n_inputs} inputs, got {len(values)}")
        return list(_Apply.apply(self, *values))


def _zeros_for(meta: tuple[Any, ...]) -> torch.Tensor:
    shape, dtype, device = meta
    return torch.zeros(shape, dtype=dtype, device=device)


def keep_for_backward(ctx: Any, outs: list[Any], saved: list[Any], taking: Any) -> None:
    """What a compiled backward reads, kept on an autograd ``ctx``: the outputs' metadata (a
    missing cotangent's zeros; not the outputs, which may be freed), the saved values (tensors
    through ``save_for_backward``, a saved Python number as it is), and the outputs no
    cotangent index in ``taking`` reads marked non-differentiable."""
    ctx.outs = [(o.shape, o.dtype, o.device) if isinstance(o, torch.Tensor) else None for o in outs]
    ctx.save_for_backward(*(t for t in saved if isinstance(t, torch.Tensor)))
    ctx.others = [None if isinstance(t, torch.Tensor) else t for t in saved]
    taking = set(taking)
    dead = [o for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and i not in taking]
    ctx.mark_non_differentiable(*dead)


def backward_inputs(ctx: Any, cotangents: tuple[Any, ...], taking: Any) -> list[Any]:
    """The compiled backward's inputs from what :func:`keep_for_backward` kept: the saved
    values, then the cotangents of ``taking`` (zeros where autograd passed None)."""
    cots = []
    for i in taking:
        c = cotangents[i]
        cots.append(_zeros_for(ctx.outs[i]) if c is None else c.contiguous())
    tensors = iter(ctx.saved_tensors)
    saved = [next(tensors) if o is None else o for o in ctx.others]
    return [*saved, *cots]


def untouched_inputs(run: CompiledAutograd, cotangents: tuple[Any, ...]) -> set[int]:
    """The positions in ``run.grads`` whose input reaches no output autograd passed a gradient
    for (a None cotangent: an output unused by the loss): their gradient is None, as eager's
    is for a tensor outside the graph it differentiates (zeros would be stepped on by an
    optimizer, with weight decay or momentum)."""
    given = {k for k, i in enumerate(run.cotangents) if cotangents[i] is not None}
    return {j for j, r in enumerate(run.reaches) if given.isdisjoint(r)}


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: CompiledAutograd, *values: Any) -> Any:
        results = list(without_autocast(run.forward, list(values)))
        outs, saved = results[: run.n_outputs], results[run.n_outputs :]
        ctx.run = run
        keep_for_backward(ctx, outs, saved, run.cotangents)
        # NOTE: an output no gradient reached comes to the backward as None, not zeros
        ctx.set_materialize_grads(False)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *cotangents: Any) -> Any:
        run: CompiledAutograd = ctx.run
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                f"{run.name}: its backward is compiled and has no derivative of its own; "
                "a second-order gradient (create_graph=True, torch.autograd.grad of a gradient) "
                "needs the call run eagerly (plait.compile(..., backend='eager'))"
            )
        if transforms_active() or any(_legacy_batched(c) for c in cotangents):
            raise DoubleBackwardError(
                f"{run.name}: its backward is compiled and has no batching rule: a batched "
                "gradient (is_grads_batched=True, a torch.func transform of the backward) needs "
                "the call run eagerly (plait.compile(..., backend='eager'))"
            )
        out: list[Any] = [None] * (1 + run.n_inputs)
        untouched = untouched_inputs(run, cotangents)
        if len(untouched) == len(run.grads):
            return tuple(out)  # NOTE: no gradient reaches any input: nothing to run
        inputs = backward_inputs(ctx, cotangents, run.cotangents)
        grads = list(without_autocast(run.backward, inputs))
        for j, (i, g) in enumerate(zip(run.grads, grads)):
            out[1 + i] = None if j in untouched else g
        return tuple(out)
