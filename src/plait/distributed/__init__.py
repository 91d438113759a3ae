"""plait.distributed: compiled programs under PyTorch's own distributed engine.

plait does not bring a distributed runtime of its own: ``torch.nn.parallel.DistributedDataParallel``
wraps a compiled module (``DDP(plait.compile(model))``) and all-reduces its gradients as it
does an eager module's. What plait adds is the order: a compiled backward split at DDP's bucket
boundaries, so each bucket's all-reduce overlaps the rest of the backward
(:mod:`plait.distributed.ddp`). docs/distributed.md says how to run on several GPUs and hosts,
and what FSDP2 (``fully_shard``) does with compiled blocks.

Example:
    >>> from plait.distributed import active_ddp
    >>> active_ddp() is None  # no DDP forward is running
    True
"""

from plait.distributed.buckets import Bucket, BucketPlan, active_ddp, bucket_plan
from plait.distributed.ddp import GradientReleaseWarning, release_by_bucket
from plait.distributed.release import Release, ReleasedBackward, releases
from plait.distributed.segments import Segment, split_backward

__all__ = [
    "Bucket",
    "BucketPlan",
    "GradientReleaseWarning",
    "Release",
    "ReleasedBackward",
    "Segment",
    "active_ddp",
    "bucket_plan",
    "release_by_bucket",
    "releases",
    "split_backward",
]
