"""Parity: the conformance gate's verdict, and the errors shown beside it.

The verdict is the gate's alone (``plait.conformance.check`` under the numerical contract; fresh
input draws, a float64 anchor, poisoned outputs, layouts). The numbers shown next to it are
computed here for display on the benchmark's own images: max absolute error, max relative error
(``max|y - ref| / max|ref|``, normwise: an elementwise ratio is unstable near zero) against eager
and against a float64 copy of the model, and top-1 agreement.

Example:
    >>> import torch
    >>> errors(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]))
    {'max_abs': 0.5, 'max_rel': 0.25}
    >>> top1(torch.eye(3), torch.eye(3))
    1.0
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

MAX_FAILURES = 20
MAX_NOTES = 10


def errors(y: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    diff = (y.detach().double().cpu() - ref.detach().double().cpu()).abs()
    scale = float(ref.detach().double().abs().max())
    max_abs = float(diff.max())
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale > 0 else max_abs}


def _flat_state(m: nn.Module) -> torch.Tensor:
    """Every float parameter and buffer, as one float64 vector."""
    ts = [*m.parameters(), *(b for b in m.buffers() if b.is_floating_point())]
    return torch.cat([t.detach().reshape(-1).double().cpu() for t in ts])


def state_after_steps(
    eager: nn.Module,
    anchor: nn.Module,
    m: nn.Module,
    dtype: torch.dtype = torch.float32,
    spread: Sequence[nn.Module] = (),
) -> dict[str, Any]:
    """The contract's model rule on a model's state after the same optimizer steps: against
    the float64 run (``anchor``), ``m``'s RMS error may exceed eager's by ``factor`` and its
    worst error by ``tail_factor``, the factors of ``dtype`` (the compute dtype: bfloat16 under
    autocast); a trajectory amplifies rounding alike for every correct program, so the bound
    is eager's own error, never a fixed tolerance. ``spread``: other eager runs of the same
    steps that round otherwise (channels_last: oneDNN's other algorithms); eager's error is
    the largest of theirs, since one run's distance from float64 is partly chance (a few
    steps of batch norm and ReLU switching amplify one ulp unevenly)."""
    import plait.contract

    c = plait.contract.load()
    ref = _flat_state(anchor)
    own = _flat_state(m) - ref
    bases = [_flat_state(e) - ref for e in (eager, *spread)]
    rms = float(own.square().mean().sqrt())
    base_rms = max(float(b.square().mean().sqrt()) for b in bases)
    worst, base_worst = float(own.abs().max()), max(float(b.abs().max()) for b in bases)
    tiny = float(torch.finfo(torch.float32).tiny)
    return {
        "rms_error_vs_float64": rms,
        "eager_rms_error_vs_float64": base_rms,
        "max_error_vs_float64": worst,
        "eager_max_error_vs_float64": base_worst,
        "within_contract": rms <= c.model_factor(dtype) * base_rms + tiny
        and worst <= c.model_tail_factor(dtype) * base_worst + tiny,
    }


def top1(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.argmax(-1).cpu() == ref.argmax(-1).cpu()).double().mean())


def float64_model(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).cpu().double().eval()


def outputs(
    fn: Callable[[torch.Tensor], torch.Tensor], batches: list[torch.Tensor]
) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([fn(x).detach().cpu() for x in batches])


def display(
    y: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, images: int
) -> dict[str, Any]:
    """The displayed (not judged) parity of one system's logits."""
    return {
        "images": images,
        "vs_eager": errors(y, eager),
        "vs_float64": errors(y, ref64),
        "eager_vs_float64": errors(eager, ref64),
        "top1_agreement_vs_eager": top1(y, eager),
        "top1_agreement_vs_float64": top1(y, ref64),
    }


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def report_record(report: Any, what: str) -> dict[str, Any]:
    """A conformance Report as JSON: verdict, failures, margins (share of the model-rule budget
    used per anchored value; above 1 fails), notes and checks run."""
    margins = {k: _num(v) for k, v in report.margins.items()}
    finite = [v for v in margins.values() if v is not None]
    return {
        "what": what,
        "ok": bool(report.ok),
        "contract": report.contract_version,
        "errors": len(report.errors),
        "warnings": len(report.warnings),
        "checks": int(sum(report.checks_run.values())),
        "worst_margin": max(finite) if finite else None,
        "output_margins": {k: v for k, v in margins.items() if k.startswith("output")},
        "failures": [
            {
                "severity": f.severity,
                "check": f.check,
                "where": f.where,
                "case": f.case,
                "message": f.message,
                "error": _num(f.error),
                "budget": _num(f.budget),
            }
            for f in report.failures[:MAX_FAILURES]
        ],
        "notes": list(report.notes[:MAX_NOTES]),
    }


def gate(
    reference: nn.Module,
    candidate: Callable[..., Any],
    example: torch.Tensor,
    *,
    module: nn.Module,
    draws: int,
    layouts: tuple[str, ...],
    seed: int,
    grads: bool = False,
) -> dict[str, Any]:
    """Judge ``candidate`` against the eager ``reference`` with the conformance gate; ``module``
    is the module whose state the candidate reads and writes (named explicitly: a wrapper such as
    torch.compile's prefixes its buffer names). Inference runs under ``torch.no_grad()`` (so
    plait may freeze); ``grads=True`` judges gradients and buffer updates too (training mode)."""
    import plait.conformance

    what = "outputs, buffers, gradients" if grads else "outputs"
    what = f"{what}; draws {draws}; layouts {', '.join(layouts)}"
    ctx = torch.enable_grad() if grads else torch.no_grad()
    try:
        with ctx:
            report = plait.conformance.check(
                reference,
                candidate,
                (example,),
                grads=grads,
                draws=draws,
                layouts=layouts,
                seed=seed,
                candidate_module=module,
            )
    except Exception as exc:  # NOTE: a candidate that crashes under the gate fails it.
        failure = {
            "severity": "error",
            "check": "exception",
            "where": "call",
            "case": "gate",
            "message": f"{type(exc).__name__}: {exc}"[:1000],
            "error": None,
            "budget": None,
        }
        return {
            "what": what,
            "ok": False,
            "contract": None,
            "errors": 1,
            "warnings": 0,
            "checks": 0,
            "worst_margin": None,
            "output_margins": {},
            "failures": [failure],
            "notes": [],
        }
    return report_record(report, what)
