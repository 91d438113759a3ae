"""One run of a program on one case: state reset, seeded RNG, outputs, buffers and gradients.

Every run starts from the same module state (buffers restored to the snapshot taken when the gate
began) and the same global RNG seed, so reference and candidate see identical conditions, and the
gate leaves the user's modules as it found them.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from plait.conformance.draws import Args, fresh_copy
from plait.conformance.tree import leaves


@dataclass
class Run:
    """What one call produced. ``error`` is set (and the rest empty) when the call raised."""

    outputs: Any = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    inputs_after: Args = ()
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    input_storages: set[int] = field(default_factory=set)
    not_differentiable: list[str] = field(default_factory=list)
    named_inputs: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class Program:
    """A callable plus the module whose state it reads and mutates (if any)."""

    fn: Callable[..., Any]
    module: nn.Module | None
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    # NOTE: False for a reference that answers stored values (an artifact's reference cases,
    # ``output_aliases_known = False`` on the callable): which of its outputs share memory is
    # not eager's, so output aliasing is not judged against it
    aliases_known: bool = True

    @classmethod
    def of(cls, fn: Callable[..., Any], module: nn.Module | None) -> Program:
        if module is None and isinstance(fn, nn.Module):
            module = fn
        initial = {}
        if module is not None:
            initial = {n: b.detach().clone() for n, b in module.named_buffers()}
        return cls(fn, module, initial, bool(getattr(fn, "output_aliases_known", True)))

    def reset(self) -> None:
        """Put every buffer back to its initial value (only those that changed, in place)."""
        if self.module is None:
            return
        with torch.no_grad():
            for name, buf in self.module.named_buffers():
                saved = self.initial.get(name)
                if saved is None or buf.shape != saved.shape:
                    continue
                if buf.dtype != saved.dtype or not torch.equal(buf, saved.to(buf.device)):
                    buf.copy_(saved)

    def params(self) -> list[tuple[str, nn.Parameter]]:
        if self.module is None:
            return []
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def storages(self) -> set[int]:
        """Storage addresses of the module's parameters and buffers (never to be poisoned)."""
        if self.module is None:
            return set()
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        return {t.untyped_storage().data_ptr() for t in tensors}


def run(
    program: Program,
    args: Args,
    *,
    rng_seed: int,
    grads: bool,
    cuda: bool,
    input_grads: bool | None = None,
) -> Run:
    """Call ``program`` on a private copy of ``args`` with the global RNG seeded to ``rng_seed``.

    With ``grads`` the forward runs with grad enabled and, unless ``input_grads`` is False, the
    float inputs require grad (``input_grads=True`` without ``grads``: they require grad, as a
    compiled candidate's users' inputs did); call :func:`backward` afterwards with the cotangents.
    """
    program.reset()
    requires_grad = grads if input_grads is None else input_grads
    copied, named_inputs = fresh_copy(args, requires_grad=requires_grad)
    result = Run(inputs_after=copied, input_storages=storages(copied), named_inputs=named_inputs)
    try:
        with seeded(rng_seed, cuda), torch.enable_grad() if grads else _nullctx():
            result.outputs = program.fn(*copied)
    except Exception as exc:  # NOTE: a raising candidate is a finding, not a crash of the gate.
        result.error = exc
        return result
    if program.module is not None:
        result.buffers = {n: b.detach().clone() for n, b in program.module.named_buffers()}
    return result


def backward(result: Run, program: Program, cotangents: dict[str, torch.Tensor]) -> None:
    """Gradients of ``sum(cotangent * output)`` w.r.t. float inputs and parameters, into
    ``result.grads``; outputs the cotangents name but that cannot be differentiated are listed in
    ``result.not_differentiable``."""
    outs, cots = [], []
    for name, leaf in leaves(result.outputs, "output"):
        if name not in cotangents:
            continue
        if not isinstance(leaf, torch.Tensor) or leaf.grad_fn is None:
            result.not_differentiable.append(name)
            continue
        outs.append(leaf)
        cots.append(cotangents[name].to(dtype=leaf.dtype, device=leaf.device))
    wrt = [(f"grad[{n}]", t) for n, t in result.named_inputs]
    wrt += [(f"grad[{n}]", p) for n, p in program.params()]
    if not outs or not wrt:
        return
    try:
        grads = torch.autograd.grad(outs, [t for _, t in wrt], cots, allow_unused=True)
    except Exception as exc:  # NOTE: as for the forward, a raising backward is a finding.
        result.error = exc
        return
    result.grads = {
        name: None if g is None else g.detach().clone()
        for (name, _), g in zip(wrt, grads, strict=True)
    }


def make_cotangents(outputs: Any, seed: int) -> dict[str, torch.Tensor]:
    """Random cotangents (never ones) for every differentiable float output, keyed by name.

    Each output's cotangent depends only on its name and ``seed``, and is rounded to the output's
    dtype, so the float64 anchor (which widens it exactly) sees the very same numbers.
    """
    out = {}
    for name, leaf in leaves(outputs, "output"):
        if isinstance(leaf, torch.Tensor) and leaf.dtype.is_floating_point and leaf.grad_fn:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            noise = torch.randn(leaf.shape, generator=gen, dtype=torch.float64)
            out[name] = noise.to(leaf.dtype)
    return out


def storages(obj: Any) -> set[int]:
    return {
        leaf.untyped_storage().data_ptr()
        for _, leaf in leaves(obj, "")
        if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().nbytes() > 0
    }


@contextlib.contextmanager
def seeded(seed: int, cuda: bool) -> Iterator[None]:
    """Run with the global RNG seeded to ``seed``, restoring the caller's RNG state afterwards."""
    devices = [torch.cuda.current_device()] if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """float32 means float32: TF32 off for matmul and cuDNN while the gate runs (restored after).

    NOTE: cuDNN's flag through torch._C: ``torch.backends.cudnn.allow_tf32 = ...`` raises once
    a program called ``torch.backends.disable_global_flags()`` (PyTorch's own test utilities do).
    """
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch._C._get_cudnn_allow_tf32()
    precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._C._set_cudnn_allow_tf32(False)
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch._C._set_cudnn_allow_tf32(cudnn)
        torch.set_float32_matmul_precision(precision)


@contextlib.contextmanager
def _nullctx() -> Iterator[None]:
    yield
