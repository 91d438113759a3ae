"""Finite-difference gradient checks in float64, for derivative rules.

Autograd's vector-Jacobian product ``v^T J`` is compared with central differences of the scalar
``<v, f(x)>`` for random cotangents ``v``; step and budgets come from the contract's
``[gradcheck]`` table. Everything runs in float64: finite differences in float32 cannot tell a
wrong derivative from rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import plait.contract
from plait.conformance.compare import Budget, compare
from plait.conformance.draws import as_args
from plait.conformance.report import Failure, Report
from plait.conformance.tree import leaves, map_tensors
from plait.contract import Contract, Tolerance


def gradcheck_fd(
    fn: Callable[..., Any],
    inputs: Any,
    *,
    eps: float | None = None,
    contract: Contract | None = None,
    cotangents: int = 2,
    max_elements: int = 2048,
    seed: int = 0,
) -> Report:
    """Check ``fn``'s autograd derivative against central finite differences in float64.

    Float inputs (and, for an ``nn.Module``, its parameters, on a float64 copy) are perturbed one
    element at a time; at most ``max_elements`` randomly chosen elements per tensor. Returns a
    :class:`Report`; call ``.raise_if_failed()`` to turn failures into a ``ConformanceError``.

    Example:
        >>> import torch
        >>> report = gradcheck_fd(torch.tanh, (torch.randn(5),))
        >>> report.ok
        True
    """
    contract = contract if contract is not None else plait.contract.load()
    spec = contract.gradcheck
    step = spec.eps if eps is None else eps
    budget = Budget(Tolerance(spec.rtol, spec.atol, "float64", False), None, 0.0)
    report = Report(contract_version=contract.version)
    module = copy.deepcopy(fn).double() if isinstance(fn, nn.Module) else None
    call = module if module is not None else fn
    args = tuple(map_tensors(_widen, a) for a in as_args(inputs))
    wrt = [(f"grad[{n}]", t) for n, t in leaves(args, "input") if _is_float(t)]
    if module is not None:
        wrt += [(f"grad[{n}]", p) for n, p in module.named_parameters() if p.requires_grad]
    if not wrt:
        report.note("nothing to differentiate: no float inputs or parameters")
        return report
    gen = torch.Generator().manual_seed(seed)
    for k in range(cotangents):
        case = f"finite differences, cotangent {k}, eps {step:g}"
        outputs = _float_outputs(call, args, report, case)
        if outputs is None:
            return report
        cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outputs]
        analytic = _vjp(outputs, cots, [t for _, t in wrt])
        for (name, tensor), grad in zip(wrt, analytic, strict=True):
            numeric, picked = _fd(call, args, tensor, cots, step, max_elements, gen)
            # NOTE: elements not sampled take autograd's value, so they cannot fail.
            expected = torch.where(picked, numeric, grad)
            report.count("gradcheck")
            compare(report, name, case, expected, grad, budget)
    return report


def _widen(t: torch.Tensor) -> torch.Tensor:
    out = t.detach().contiguous().clone()
    if out.dtype.is_floating_point:
        out = out.to(torch.float64).requires_grad_(True)
    return out


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float64


def _float_outputs(
    call: Callable[..., Any], args: tuple[Any, ...], report: Report, case: str
) -> list[torch.Tensor] | None:
    with torch.enable_grad():
        out = call(*args)
    tensors = [t for _, t in leaves(out, "output") if isinstance(t, torch.Tensor)]
    floats = [t for t in tensors if t.dtype.is_floating_point]
    if any(t.dtype != torch.float64 for t in floats) or not floats:
        msg = "the function must compute float64 outputs from float64 inputs"
        report.add(Failure("error", "setup", "output", case, msg))
        return None
    return floats


def _vjp(
    outputs: list[torch.Tensor], cots: list[torch.Tensor], wrt: list[torch.Tensor]
) -> list[torch.Tensor]:
    live = [(o, c) for o, c in zip(outputs, cots, strict=True) if o.grad_fn is not None]
    if not live:
        return [torch.zeros_like(t) for t in wrt]
    grads = torch.autograd.grad([o for o, _ in live], wrt, [c for _, c in live], allow_unused=True)
    return [
        torch.zeros_like(t) if g is None else g.detach() for t, g in zip(wrt, grads, strict=True)
    ]


def _fd(
    call: Callable[..., Any],
    args: tuple[Any, ...],
    tensor: torch.Tensor,
    cots: list[torch.Tensor],
    step: float,
    max_elements: int,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Central differences of ``<cots, call(args)>`` w.r.t. sampled elements of ``tensor``;
    also the mask of the sampled elements."""
    if not tensor.is_contiguous():
        raise ValueError("gradcheck_fd perturbs elements in place: tensors must be contiguous")
    numeric = torch.zeros(tensor.shape, dtype=torch.float64)
    picked = torch.zeros(tensor.shape, dtype=torch.bool)
    flat_numeric, flat_picked = numeric.view(-1), picked.view(-1)
    n = tensor.numel()
    picks = torch.randperm(n, generator=gen)[:max_elements] if n > max_elements else range(n)
    with torch.no_grad():
        target = tensor.detach().view(-1)
        for i in picks:
            i = int(i)
            original = float(target[i])
            target[i] = original + step
            plus = _inner(call, args, cots)
            target[i] = original - step
            minus = _inner(call, args, cots)
            target[i] = original
            flat_numeric[i] = (plus - minus) / (2 * step)
            flat_picked[i] = True
    return numeric, picked


def _inner(call: Callable[..., Any], args: tuple[Any, ...], cots: list[torch.Tensor]) -> float:
    out = call(*args)
    floats = [t for _, t in leaves(out, "output") if isinstance(t, torch.Tensor)]
    floats = [t for t in floats if t.dtype.is_floating_point]
    return float(sum((t.detach() * c).sum() for t, c in zip(floats, cots, strict=True)))
