"""L4 AOT autograd: joint forward+backward graphs from the ops' derivative rules, partitioned
into a forward graph and a backward graph, tied into PyTorch's autograd.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.autograd import build_joint
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float64))
    >>> b.output(b.call("exp", x))
    >>> build_joint(b.build(), wrt=["x"]).grads
    [0]
"""

from plait.autograd.function import CompiledAutograd, DoubleBackwardError
from plait.autograd.joint import Joint, JointGraphError, build_joint
from plait.autograd.partition import PARTITIONERS, Partition, PartitionError, partition

__all__ = [
    "PARTITIONERS",
    "CompiledAutograd",
    "DoubleBackwardError",
    "Joint",
    "JointGraphError",
    "Partition",
    "PartitionError",
    "build_joint",
    "partition",
]
