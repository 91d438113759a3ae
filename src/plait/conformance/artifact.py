"""What the gate judges of a compiled callable: the specializations its users' calls ran.

A candidate that speaks the public artifact protocol (``specialization_uses()``,
``guard_failures(key, *args)``, ``call_specialization(key, *args)``, ``specialize(*args)``:
what ``plait.compile`` returns) is judged as its users run it. The gate groups the
specializations that ran user calls by the settings of those calls (grad mode, autocast, default
dtype, threads, precision and determinism flags), runs every case under each group's settings,
and calls the candidate pinned to that group's specializations: a call none of them admits is a
failure (``check`` ``"specialization"``), never a compile. With no user call yet, the gate makes
the specialization a first call would make under the check's own settings, and says so.

Any other candidate (a plain function, a torch.compile'd module) is called as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.conformance.draws import fresh_copy
from plait.conformance.report import Failure, Judged, Report

_PROTOCOL = ("specialization_uses", "guard_failures", "call_specialization", "specialize")
GRAD_MODE = "torch.is_grad_enabled()"


class NeedsAnotherSpecialization(Exception):
    """Judging this call would need a specialization the user's calls have not run."""


@dataclass
class Context:
    """One way the candidate is run: under ``settings`` (applied by ``enter``), pinned to
    ``keys`` (none: the candidate is not a compiled artifact and is called as it is)."""

    call: Callable[..., Any]
    enter: Callable[[], contextlib.AbstractContextManager[Any]]
    grads: bool
    label: str | None = None
    keys: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    input_grads: bool | None = None  # whether float inputs require grad (None: as ``grads``)
    # NOTE: the specializations of ``keys`` with how each was chosen, and the keys the gate's
    # calls ran (only those are reported judged)
    uses: tuple[tuple[Any, str], ...] = ()
    ran: dict[str, set[tuple]] = field(default_factory=dict)


def speaks_protocol(candidate: Any) -> bool:
    return all(callable(getattr(candidate, name, None)) for name in _PROTOCOL)


def contexts(candidate: Any, example: Sequence[Any], grads: bool, report: Report) -> list[Context]:
    """The contexts to judge ``candidate`` in (see the module docstring); ``example``: the
    arguments of the first case, for a candidate no user has called yet."""
    if not speaks_protocol(candidate):
        return [Context(candidate, contextlib.nullcontext, grads)]
    uses = [u for u in candidate.specialization_uses() if u.calls > 0]
    how = "ran {calls} user call(s)"
    if not uses:
        try:
            with torch.enable_grad() if grads else contextlib.nullcontext():
                made = candidate.specialize(*fresh_copy(tuple(example), requires_grad=grads)[0])
        except Exception as exc:  # NOTE: as a raising first call: a finding, not a crash
            msg = f"making the specialization a first call makes raised {type(exc).__name__}: {exc}"
            report.add(Failure("error", "exception", "candidate", "all cases", msg))
            return []
        uses = [made]
        how = "made by this check: the specialization a first call makes under its settings"
        report.note(
            "the compiled program had no call yet: judged the specialization its first call "
            f"makes under this check's settings ({_settings_text(made.settings)}); call it as "
            "your program does before checking, to judge what your calls run"
        )
    groups: dict[str, list[Any]] = {}
    for use in uses:
        groups.setdefault(repr(sorted(use.settings.items(), key=str)), []).append(use)
    out = []
    for members in groups.values():
        settings = members[0].settings
        grad_on = bool(settings.get(GRAD_MODE, True))
        label = "settings " + ", ".join(f"#{u.index}" for u in members)
        keys = tuple(u.key for u in members)
        if grads and not grad_on:
            report.note(
                f"{label}: the user's calls ran with gradients disabled: judged forward only"
            )
        with members[0].applied():
            input_grads = _input_grads(candidate, keys, example, grads and grad_on)
        if grads and grad_on and not input_grads:
            report.note(
                f"{label}: the user's calls passed inputs that do not require grad: gradients "
                "judged for parameters only"
            )
        ran: dict[str, set[tuple]] = {}
        out.append(
            Context(
                _pinned(candidate, keys, ran),
                members[0].applied,
                grads and grad_on,
                label if len(groups) > 1 else None,
                keys,
                settings,
                input_grads,
                tuple((u, how.format(calls=u.calls)) for u in members),
                ran,
            )
        )
    if grads and not any(c.grads for c in out):
        msg = (
            "grads=True, but every user call of the compiled program ran with gradients "
            "disabled: judging gradients would need a specialization those calls never ran "
            "(call it with gradients first, or check with grads=False)"
        )
        report.add(Failure("error", "specialization", "gradients", "all cases", msg))
    return out


def _input_grads(
    candidate: Any, keys: tuple[str, ...], example: Sequence[Any], grads: bool
) -> bool:
    """Whether float inputs require grad in the judged calls: as the gate would have them
    (``grads``) when one of ``keys`` admits that, else as the user's calls had them."""
    for wanted in (grads, not grads):
        copied, _ = fresh_copy(tuple(example), requires_grad=wanted)
        if any(not candidate.guard_failures(key, *copied) for key in keys):
            return wanted
    return grads


def record_judged(contexts: Sequence[Context], report: Report) -> None:
    """Name in ``report.judged`` each specialization the gate's calls ran; a specialization
    the user's calls ran that no case of the check reached (inputs of another shape) is a
    warning: it was not judged, and the report must not say it was."""
    for context in contexts:
        for use, how in context.uses:
            if use.key in context.ran:
                report.judged.append(_judged(use, how))
                if len(context.ran[use.key]) == 1:  # NOTE: the check's cases had one shape
                    _warn_sizes_unjudged(use, how, report)
                continue
            msg = (
                f"specialization #{use.index} (key {use.key[:16]}, {how}) was not judged: no "
                "case of this check ran it (its guards admit none of them, or an earlier "
                "specialization's admit them first); check it with inputs like its calls'"
            )
            report.add(Failure("warning", "specialization", f"#{use.index}", "all cases", msg))


def _warn_sizes_unjudged(use: Any, how: str, report: Report) -> None:
    """A judged specialization with symbolic sizes, which the check's cases ran at one shape
    (drawn at the example's sizes), while its capture saw several: a warning naming them, so a
    pass is not read as covering sizes it never ran."""
    options = getattr(use.manifest, "options", None) or {}
    dims = options.get("dynamic_dims") if isinstance(options, dict) else None
    if not isinstance(dims, dict):
        return
    seen = {
        name: sizes
        for name, record in dims.items()
        if isinstance(record, dict) and len(sizes := record.get("sizes_seen") or []) > 1
    }
    if not seen:
        return
    text = "; ".join(f"{name}: {', '.join(map(str, sizes))}" for name, sizes in seen.items())
    msg = (
        f"specialization #{use.index} ({how}) has symbolic sizes ({text} seen before it was "
        "compiled); this check judged it at the example's sizes only: check it with inputs at "
        "each size you rely on"
    )
    report.add(Failure("warning", "sizes", f"#{use.index}", "symbolic sizes", msg))


def _pinned(
    candidate: Any, keys: tuple[str, ...], ran: dict[str, set[tuple]]
) -> Callable[..., Any]:
    """Call ``candidate`` with the first of ``keys`` whose guards admit the call (added to
    ``ran`` with the shapes of the call's tensors), or raise
    :class:`NeedsAnotherSpecialization` naming what each refused."""

    def call(*args: Any) -> Any:
        refused = []
        for key in keys:
            failed = candidate.guard_failures(key, *args)
            if not failed:
                shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
                ran.setdefault(key, set()).add(shapes)
                return candidate.call_specialization(key, *args)
            refused.append(f"{key[:16]}: {'; '.join(failed)}")
        raise NeedsAnotherSpecialization(
            "this call needs a specialization the user's calls have not run (the compiled "
            "program would compile one for it); refused by " + " | ".join(refused)
        )

    return call


def _judged(use: Any, how: str) -> Judged:
    manifest = use.manifest
    cache = getattr(manifest, "cache", None) or {}
    return Judged(
        index=use.index,
        key=use.key,
        how=how,
        semantic_hash=str(getattr(manifest, "source_hash", "") or ""),
        cache_key=str(cache.get("key") or ""),
        guards=tuple(use.guards),
        settings=dict(use.settings),
    )


def _settings_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in settings.items())


# NOTE: the flags ieee_float32() sets; a context that changes them would judge another float32
_TF32_FLAGS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")


def ieee_problem(settings: Mapping[str, Any], cuda: bool) -> str | None:
    """Why the contract's float32 (IEEE) cannot judge calls made under ``settings``, or None.
    TF32 flags matter on CUDA only."""
    precision = settings.get("torch.get_float32_matmul_precision()", "highest")
    if precision != "highest":
        return f"torch.get_float32_matmul_precision() was {precision!r}"
    if cuda:
        on = [name for name in _TF32_FLAGS if settings.get(name)]
        if on:
            return f"{', '.join(on)} on"
    return None
