"""Which gradients DDP reduces together: buckets of a compiled program's parameters.

DDP (``torch.nn.parallel.DistributedDataParallel``) all-reduces gradients in buckets: the
first ``first_bucket_bytes_cap`` bytes (1 MiB by default) of gradients in the order they became
ready in the first backward, then ``bucket_bytes_cap`` (25 MiB) at a time (its reducer rebuilds
the buckets after the first iteration from that order). A bucket's all-reduce starts when its
last gradient is ready, while the backward goes on: the overlap that makes DDP scale.

:func:`bucket_plan` predicts that order for a compiled program as Dynamo's DDP optimizer does
(parameters by their first use in the forward graph, latest first: the backward reaches them in
that order) and groups them with PyTorch's own ``_compute_bucket_assignment_by_size`` under the
caps of the DDP module running the call. :mod:`plait.distributed.release` then splits the
compiled backward at the bucket boundaries.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((2, 4), torch.float32))
    >>> w1, w2 = (b.param(n, TensorType((4, 4), torch.float32)) for n in ("w1", "w2"))
    >>> b.output(b.call("matmul", b.call("matmul", x, w1), w2))
    >>> g = b.build()
    >>> tensors = {"w1": torch.randn(4, 4), "w2": torch.randn(4, 4)}
    >>> plan = bucket_plan(g, ["w1", "w2"], tensors, caps=(64, 64))
    >>> [bucket.names for bucket in plan.buckets]
    [['w2'], ['w1']]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.autograd.partition import value_bytes
from plait.ir.graph import Graph


@dataclass
class Bucket:
    """Gradients released together: graph input names (parameters) and their bytes."""

    names: list[str]
    bytes: int


@dataclass
class BucketPlan:
    """Buckets in release order (the first is reduced first); ``caps``: the first bucket's
    byte cap and the others'; ``rest``: differentiable inputs DDP does not reduce (user inputs,
    parameters it ignores), released with the last bucket."""

    buckets: list[Bucket]
    caps: tuple[int, int]
    rest: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "first_bucket_cap_bytes": self.caps[0],
            "bucket_cap_bytes": self.caps[1],
            "buckets": [{"params": b.names, "bytes": b.bytes} for b in self.buckets],
            "released_with_the_last_bucket": self.rest,
        }


def active_ddp() -> Any:
    """The ``DistributedDataParallel`` module whose forward is running now (DDP sets it around
    its wrapped module's call, for Dynamo's DDP optimizer and for this), or None."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel._get_active_ddp_module()


def ddp_caps(ddp: Any) -> tuple[int, int]:
    """``(first bucket cap, bucket cap)`` in bytes of a DDP module, as its reducer rebuilds
    buckets with them."""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:  # NOTE: PyTorch 2.12 and later
        return int(config.first_bucket_bytes_cap), int(config.bucket_bytes_cap)
    cap = int(ddp.bucket_bytes_cap)
    default = getattr(ddp, "bucket_bytes_cap_default", False)
    first = int(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES) if default else cap
    return min(first, cap), cap


def ddp_parameters(ddp: Any) -> set[int]:
    """The ids of the parameters ``ddp`` reduces (those requiring grad, not ignored)."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    return {id(p) for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored}


def release_order(graph: Graph, names: Sequence[str]) -> list[str]:
    """``names`` (inputs of ``graph``) by their first use in the forward, latest first: the
    order the backward completes their gradients in (an input's gradient is complete once the
    backward has passed its earliest use). Inputs first used by the same node go smallest
    first (a linear layer's bias, then its weight: a bucket then closes on the large one, as
    eager's do), then in ``names``' order; unused inputs last."""
    first: dict[str, int] = {}
    wanted = set(names)
    for position, node in enumerate(graph.nodes):
        for v in node.input_values():
            if v.name in wanted and v.name not in first:
                first[v.name] = position
    size = {v.name: value_bytes(v) for v in graph.inputs}
    return sorted(names, key=lambda n: (-first.get(n, -1), size.get(n, 0)))


def bucket_plan(
    graph: Graph,
    names: Sequence[str],
    tensors: Mapping[str, torch.Tensor],
    caps: tuple[int, int],
) -> BucketPlan:
    """Buckets of the inputs ``names`` of the forward ``graph`` (``tensors``: each one's
    parameter), grouped as DDP's reducer groups gradients ready in :func:`release_order`."""
    ordered = release_order(graph, names)
    params = [tensors[n] for n in ordered]
    if not params:
        return BucketPlan([], caps)
    indices, _ = torch.distributed._compute_bucket_assignment_by_size(
        params, list(caps), [False] * len(params)
    )
    # NOTE: PyTorch orders buckets by their smallest index: release order, since it fills each
    # one from consecutive gradients (a bucket holds one dtype and device: a mixed model's
    # buckets interleave, still each one in order)
    buckets = []
    for bucket in indices:
        members = [ordered[i] for i in bucket]
        size = sum(tensors[n].numel() * tensors[n].element_size() for n in members)
        buckets.append(Bucket(members, size))
    return BucketPlan(buckets, caps)
