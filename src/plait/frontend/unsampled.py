"""Capture without the arithmetic of the heaviest calls.

Capture runs each call on its samples, so that Python sees eager's shapes and values. On a
model's first call that costs about one eager call; most of it is convolutions and matrix
products whose values no later decision reads. With ``arithmetic="skip"``
(:func:`plait.frontend.capture_program`, the default of ``plait.compile``), a call in
:data:`SKIPPED` whose tensor operands are all row-major CPU tensors gets an uninitialized result
of the type its capture rule computes: its values are never computed.

NOTE: invariants.
- Such a result is *unsampled*: it, everything computed from it and every tensor written with
  it hold garbage. Unsampled memory is tracked by storage (:class:`Unsampled`), so a view of
  it, or a tensor an in-place call wrote with it, is unsampled too.
- Its shape, dtype and device are the rule's (the IR's, which the real call would have been
  checked against). Its strides are eager's: for row-major operands on the CPU each call in
  :data:`SKIPPED` returns a fresh row-major tensor. So every metadata read, alias and view
  decision is the one eager makes.
- Nothing reads unsampled values: a data read (``item``, ``bool``, ``torch.equal``), a call
  with no capture rule (an opaque node or an ATen trace, which run Python on the
  values), a size that depends on the values and any rule that cannot lower the call raise
  :class:`Resample`, and ``capture_program`` captures again computing every call (a data read
  or a call with no rule first computes them where it can: :mod:`plait.frontend.late_values`).
  The graph of a capture that finishes is therefore the one a computing capture gives.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> conv = torch.nn.Conv2d(3, 8, 3)
    >>> prog = capture_program(conv, (torch.randn(1, 3, 8, 8),), arithmetic="skip")
    >>> [n.op for n in prog.graph.nodes]
    ['conv2d']
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from plait.frontend.layout_clone import is_dense
from plait.frontend.views import storage_id

if TYPE_CHECKING:
    from plait.frontend.late_values import Replay

# NOTE: each returns a fresh tensor, writes nothing and draws no random numbers; for row-major
# CPU operands its result is row-major (batch_norm only in inference mode, checked below)
SKIPPED = frozenset({F.conv2d, F.linear, F.batch_norm, torch.batch_norm, F.max_pool2d})
# NOTE: and elementwise writes into an unsampled tensor (:func:`overwrites_garbage`)


class Resample(BaseException):
    """A capture that skipped arithmetic reached a read of values it did not compute: capture
    again computing every call. NOTE: a BaseException, so that a user's ``except Exception``
    cannot swallow it."""


class Unsampled:
    """The storages whose values capture did not compute.

    NOTE: a storage is held while one of the tensors it was recorded by lives (weak
    references): every tensor on such a storage is a recorded sample or a tracer that keeps
    its sample alive, so a dead record means a dead storage, whose address a computed tensor
    may take next (it is not garbage)."""

    def __init__(self) -> None:
        self.storages: dict[int, list[weakref.ref[torch.Tensor]]] = {}
        self.calls = 0  # NOTE: how many calls were left uncomputed
        # NOTE: set before a rule runs for a call left uncomputed: a failure from then on may
        # come of skipping (capture_program captures again)
        self.tried = False
        # NOTE: up while a call that read garbage is lowered: what its rule writes is garbage
        self.writing = False
        # NOTE: the calls to run again where the program reads garbage, where capture may
        # compute it then instead of capturing again (plait.frontend.late_values)
        self.replay: Replay | None = None

    def __bool__(self) -> bool:
        return self.tried or bool(self.storages)

    def holds(self, plains: Iterable[torch.Tensor]) -> bool:
        for t in plains:
            refs = self.storages.get(storage_id(t))
            if refs is not None and any(r() is not None for r in refs):
                return True
        return False

    def add(self, out: Any) -> None:
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(t, torch.Tensor):
                sid = storage_id(t)
                refs = [r for r in self.storages.get(sid, ()) if r() is not None]
                self.storages[sid] = [*refs, weakref.ref(t)]


# NOTE: elementwise calls that may write their first argument in place (``relu_``, ``x += y``,
# ``F.relu(x, inplace=True)``): such a write keeps the target's metadata and returns it
_ELEMENTWISE = frozenset(
    {
        "relu", "relu6", "hardtanh", "leaky_relu", "elu", "silu", "hardswish", "hardsigmoid",
        "sigmoid", "tanh", "clamp", "clamp_min", "clamp_max", "neg", "abs", "exp",
        "add", "sub", "mul", "div", "iadd", "isub", "imul", "itruediv",
    }
)  # fmt: skip


def overwrites_garbage(name: str, targets: list[Any], unsampled: Unsampled) -> bool:
    """Whether the call ``name`` is an elementwise write into its one target, an unsampled
    tensor: the result is garbage whatever the operands, so it need not be computed."""
    if len(targets) != 1 or not isinstance(targets[0], torch.Tensor) or not unsampled:
        return False
    base = name.rsplit(".", 1)[-1].strip("_")
    plain = getattr(targets[0], "_plain", None)
    return (
        base in _ELEMENTWISE
        and plain is not None
        and is_dense(plain)  # NOTE: eager refuses a write into an expanded view
        and unsampled.holds([plain])
    )


def skippable(func: Any, plains: list[torch.Tensor], args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` on these operands may be left uncomputed: every tensor operand a
    row-major CPU tensor of the input's dtype (so eager's result is row-major), a batched input,
    a batch norm in inference mode."""
    if func not in SKIPPED or not plains or not args or not isinstance(args[0], torch.Tensor):
        return False
    dtype = plains[0].dtype
    if not all(_row_major_cpu(t) and t.dtype == dtype for t in plains):
        return False
    rank = plains[0].dim()  # NOTE: args[0]'s sample (the first tensor found), read directly
    if func is F.linear:
        return rank >= 2
    if func is F.batch_norm:  # (input, running_mean, running_var, weight, bias, training, ...)
        bound = dict(zip(_F_BATCH_NORM, args), **kwargs)
        ok = bound.get("training", False) is False and bound.get("running_mean") is not None
        return ok and rank >= 2
    if func is torch.batch_norm:  # (input, weight, bias, running_mean, running_var, training, ...)
        return len(args) > 5 and args[5] is False and args[3] is not None and rank >= 2
    return rank == 4  # NOTE: conv2d, max_pool2d: a batch dim (an unbatched input is 3-d)


def probe(func: Any, pargs: Any, pkwargs: dict, target: torch.Tensor | None = None) -> Any:
    """``func`` run for real on an empty batch (dim 0 sliced to nothing): eager's checks of
    the arguments (groups, padding, sizes, dtypes) without its arithmetic. ``target``: the
    tensor an elementwise write goes into; without one, the first argument is the batch.
    Returns the empty result, or None where the call cannot be probed or eager refuses it."""
    batch = target if target is not None else pargs[0]
    if not isinstance(batch, torch.Tensor) or batch.dim() == 0 or batch.shape[0] == 0:
        return None
    rank, rows = batch.dim(), batch.shape[0]
    try:
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            if target is None:
                return func(_empty(pargs[0], rank, rows), *pargs[1:], **pkwargs)
            return func(
                *_empty(tuple(pargs), rank, rows),
                **{k: _empty(v, rank, rows) for k, v in pkwargs.items()},
            )
    except Exception:  # NOTE: eager refuses the call: it runs for real, and raises there
        return None


def _empty(x: Any, rank: int, rows: int) -> Any:
    """``x`` with each tensor of the batch's rank and rows sliced to an empty batch."""
    if isinstance(x, torch.Tensor) and x.dim() == rank and x.shape[0] == rows:
        return x[:0]
    if type(x) in (list, tuple):
        return type(x)(_empty(v, rank, rows) for v in x)
    return x


def _row_major_cpu(t: torch.Tensor) -> bool:
    # NOTE: exact types (a subclass may run Python on its values), dense floats, and exactly
    # row-major strides: is_contiguous() ignores the strides of size-1 dims, by which a
    # channels_last 1x1 weight is contiguous and still makes eager's convolution channels_last
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and t.dtype.is_floating_point
        and t.stride() == _row_major_strides(t.shape)
    )


def _row_major_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


_F_BATCH_NORM = ("input", "running_mean", "running_var", "weight", "bias", "training")
