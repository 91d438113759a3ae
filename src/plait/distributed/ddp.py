"""plait under ``torch.nn.parallel.DistributedDataParallel``: the compile-time hook.

DDP calls its wrapped module inside its forward; a plait program compiled there (the first
call of ``DDP(plait.compile(model))``, or the regions of ``plait.compile(DDP(model))``) is a
training program whose backward returns every parameter gradient at once. :func:`release_by_bucket`
(called by ``plait.compile``'s engine after each compile) finds the DDP module running the call,
plans its buckets (:mod:`plait.distributed.buckets`) and replaces the program's autograd node
with :class:`~plait.distributed.release.ReleasedBackward`: one node per bucket, so each bucket's
all-reduce starts while the backward goes on, as in eager. The manifest records the split
(``autograd["gradient_release"]``, and a ``ddp-bucket-split`` entry among the passes, which
``plait.explain`` lists). Outside a DDP forward it does nothing.

Example:
    >>> import torch, plait
    >>> compiled = plait.compile(torch.nn.Linear(4, 2), backend="stax", options={"cache": False})
    >>> compiled(torch.randn(3, 4)).sum().backward()
    >>> manifest = compiled.specializations[0].manifest
    >>> "gradient_release" in manifest.autograd  # compiled outside a DDP forward: not split
    False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from plait.cache.lookup import warn_at_caller
from plait.codegen.errors import CodegenError
from plait.distributed.buckets import active_ddp, bucket_plan, ddp_caps, ddp_parameters
from plait.distributed.release import ReleasedBackward
from plait.errors import PlaitWarning
from plait.runtime.training import TrainingProgram

SPLIT = "ddp-bucket-split"


class GradientReleaseWarning(PlaitWarning):
    """A compiled backward under DDP could not be split at its buckets: its gradients are
    released when the whole backward has run (correct, without communication overlap)."""


def release_by_bucket(compiled: Any, program: Any, state: Sequence[torch.Tensor]) -> None:
    """Split a compiled training program's backward at the buckets of the DDP module running
    it (see the module doc). ``compiled``: what the backend returned (its ``program`` a
    :class:`~plait.runtime.training.TrainingProgram` for a compiled backward); ``program``: the
    captured program (its input slots); ``state``: the module's parameters and buffers."""
    ddp = active_ddp()
    training = getattr(compiled, "program", None)
    if ddp is None or not isinstance(training, TrainingProgram):
        return
    m = compiled.manifest
    inputs = program.interface()[0]
    slots = {v.name: s.ref for v, s in zip(inputs, program.inputs) if s.source == "state"}
    run = training.run
    grad_names = [training.graph.inputs[i].name for i in run.grads]
    tensors = {n: state[slots[n]] for n in grad_names if n in slots}
    reduced = ddp_parameters(ddp)
    params = [n for n in grad_names if n in tensors and id(tensors[n]) in reduced]
    plan = bucket_plan(training.graph, params, tensors, ddp_caps(ddp))
    plan.rest = [n for n in grad_names if n not in params]
    record = plan.record()
    m.autograd["gradient_release"] = record
    if len(plan.buckets) < 2:
        record["split"] = (
            "none: one bucket (its all-reduce starts when the backward ends, as eager's last)"
        )
        return
    try:
        released = ReleasedBackward.of(training, plan)
    except (CodegenError, ValueError) as exc:
        reason = f"the backward could not be split at DDP's buckets: {exc}"
        warn_at_caller(f"plait: {reason}; gradients released at its end", GradientReleaseWarning)
        m.fallbacks.append({"what": "gradient release by DDP bucket", "reason": reason})
        record["split"] = f"none: {exc}"
        return
    training.run = released
    segments = []
    for k, s in enumerate(released.segments):
        program_record = s.program.records() if s.program is not None else {}
        evidence = program_record.get("evidence", {})
        segments.append(
            {
                "bucket": k,
                "nodes": len(s.node_ids),
                "inputs_from_earlier_segments": len(
                    [v for v in s.graph.inputs if v.name not in released.backward_inputs]
                ),
                "evidence": evidence.get("counts", {}),
            }
        )
        for n in evidence.get("nodes", []):
            if n["executor"] == "fallback":
                what = f"backward node {n['id']} ({n['op']}), bucket segment {k}"
                m.fallbacks.append({"what": what, "reason": n["detail"]})
    record["split"] = f"{len(segments)} segments"
    record["segments"] = segments
    m.passes.append(
        {
            "name": SPLIT,
            "changed": True,
            "rewrites": [
                {"rule": "ddp-bucket", "replaced": s.node_ids, "produced": []}
                for s in released.segments
            ],
            "details": {"buckets": [b.names for b in plan.buckets]},
        }
    )
