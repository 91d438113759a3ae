"""L1 capture: run a PyTorch program on tracer tensors and record it as plait IR.

The pieces: ``tracer`` (tracer tensors and the capture context), ``table`` (the torch-function →
IR op table, filled by the ``lower_*`` modules), ``views`` (functionalization of aliasing),
``state`` (parameters and buffers lifted to named graph inputs), ``rng`` (the global random
number generator: replayed or refused), ``pytree`` (the containers of inputs and results),
``guard_plan`` and ``guard_build`` (which guards a trace needs: what the program's behaviour
depended on, as :mod:`plait.guards.guard` data), ``frontend`` (the capture driver) and
``program`` (the calling convention a backend runs).

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> prog = capture_program(lambda x: x.relu() if x.shape[0] > 2 else x.sigmoid(),
    ...                        (torch.randn(4, 8),))
    >>> [n.op for n in prog.graph.nodes]
    ['relu']
    >>> [g.text for g in prog.guards if g.kind == "dim"]
    ['x.shape[0] > 2']
"""

from plait.frontend import (  # noqa: F401  (rules)
    lower_activation,
    lower_attention,
    lower_compose,
    lower_linalg,
    lower_loss,
    lower_math,
    lower_meta,
    lower_movement,
    lower_nn,
    lower_reduction,
    lower_shape,
    lower_statistics,
)
from plait.frontend.frontend import capture_program, preserved_rng
from plait.frontend.inputs import InputAdapter
from plait.frontend.program import CapturedProgram, Executor, InputSlot, OutputLeaf
from plait.frontend.state import ModuleState

__all__ = [
    "CapturedProgram",
    "Executor",
    "InputAdapter",
    "InputSlot",
    "ModuleState",
    "OutputLeaf",
    "capture_program",
    "preserved_rng",
]
