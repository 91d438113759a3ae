"""The fallback program, and the graph of the call whose capture was refused only after the
program's Python ran to its end.

Most refusals come while the program runs (a read of tensor data, a call with no capture rule):
its Python stopped there, and the call goes on eagerly from there where it can
(:mod:`plait.frontend.continuation`), else runs eagerly from the start. One comes after it ran to
its end: :meth:`plait.frontend.pyreads.PyReads.finish` refuses a program that changes Python
values it reads (``self.calls += 1``, a list it appends to, a global counter), or reads one no
guard can check. That refusal concerns the calls after this one (a compiled program would not
replay the change, or could not tell when it goes stale); this call's Python side effects are
done (the counter counted once), and what it computed is the captured graph. Running the
Python again eagerly would do them twice: the counter counted 2, the list got two entries.
So :func:`this_call` finishes the graph anyway, the fallback program carries it
(``CapturedProgram.this_call``), and the call that captured runs it (``plait.api``: the
reference interpreter, inputs and buffers written back once) instead of the Python; the
program stays refused, loudly, and later calls run eagerly.

NOTE: not for
- ``fullgraph=True``: the refusal raises;
- a program that left one of the capture's tensors in Python state (a memo, a log of
  outputs): the refusal puts it back (:mod:`plait.frontend.pyrollback`,
  ``ModuleState.restored_on_failure``) and the eager run stores eager's tensor there, which
  running the graph would not;
- a graph :func:`plait.frontend.frontend._finish` refuses (an output plait cannot rebuild, a
  tensor stored in an input object it passes as it is);
- a capture that ran the program's Python before (a restart with sizes made static, or a
  resample computing every call, ``capture_program`` says so with ``first=False``): its side
  effects happened more than once already (docs/capture.md, "Known limitation").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plait import logs
from plait.errors import GraphCaptureError
from plait.frontend.capture_values import Restart, Tracer
from plait.frontend.guard_plan import build_guards, plan_of
from plait.frontend.program import CapturedProgram
from plait.frontend.pyrollback import Originals
from plait.frontend.state import ModuleState, holds_made
from plait.frontend.unsampled import Resample

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext


def this_call(
    cx: CaptureContext,
    ms: ModuleState | None,
    originals: Originals,
    finish: Callable[[], CapturedProgram],
) -> CapturedProgram | None:
    """After the program ran to its end and :meth:`PyReads.finish` refused it: the program of
    this call (``finish`` builds it; its guards are never used), or None where the eager run
    stands (see the module's NOTE)."""
    if cx.fullgraph:
        return None
    originals.restore()  # NOTE: a refusal of a read no guard checks has not put them back yet
    if originals.put_back or (ms is not None and _holds_tracer(ms)):
        return None
    try:
        return finish()
    except (Exception, Restart, Resample) as exc:
        logs.debug("capture", "this_call", f"the graph of the refused call: {exc}")
        return None


def _holds_tracer(ms: ModuleState) -> bool:
    """Whether a module attribute or buffer slot holds a tensor of the capture (what
    ``ModuleState.restored_on_failure`` puts back)."""
    return any(
        holds_made(v, _is_tracer)
        for _, m in ms.modules
        for table in (m.__dict__, m._buffers)
        for v in list(table.values())
    )


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)


def fallback(
    cx: CaptureContext,
    err: GraphCaptureError,
    spec: Any,
    leaves: list[Any],
    paths: list[str],
    ms: ModuleState | None,
    ran: CapturedProgram | None = None,
) -> CapturedProgram:
    """The documented fallback: run eagerly, under the guards read before the failure and the
    Python values the refusal was decided by; ``ran``: the graph of this call, where
    :func:`this_call` made one."""
    plan = plan_of(cx, ms, None, [])
    # NOTE: the Python values the refusal was decided by (plait.frontend.nested_fast_path)
    plan.pyroots = list(cx.refusal_reads) or None
    return CapturedProgram(
        graph=None,
        guards=build_guards(plan, spec, leaves, paths, ms),
        guard_plan=plan,
        semantic_hash=None,
        opaque_counts=dict(cx.opaque_counts),
        opaque_reasons=dict(cx.opaque_reasons),
        fallback_reason=str(err),
        dynamic=cx.dynamic,
        fallback_error=err,
        this_call=ran,
    )
