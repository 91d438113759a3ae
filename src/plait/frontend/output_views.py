"""Outputs that view another output: one memory, as in eager.

An output that shares memory with another output the graph computes (``y`` and ``y.view(-1)``,
``y[0]`` and ``y[1]`` of a ``y`` not returned) comes back as a view of one tensor the graph
returns, the *base*: the storage's owner at capture (the root of the views' chain). The graph
returns the base once; each view is made again after the call with ``as_strided``, with the
geometry capture saw relative to the base, so a write to one output shows in the others.

The geometry holds while the compiled base has the layout eager gave it: a base of another
layout is copied into that layout first (:func:`base_layout`), so the views still read it
element for element. A view outside its base's memory, or a base that is not dense, keeps
memory of its own (the graph returns it, as before).

Example:
    >>> import torch, plait
    >>> out = plait.compile(lambda x: ((y := x.sin()), y.view(-1)))(torch.zeros(2, 3))
    >>> _ = out[0].add_(1)
    >>> bool((out[1] == 1).all())
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from plait.errors import InternalValueError
from plait.frontend.layout_clone import is_dense
from plait.frontend.views import storage_id

# NOTE: ("view", (base output index, tracer id, size, stride, offset, requires_grad, base size,
# base stride[, dtype])): the ref of an output leaf made from the graph's base output


def computed_root(tr: Any) -> Any | None:
    """The tracer whose memory ``tr`` views, when it is one the program computed (no input,
    parameter, buffer or constant): ``tr`` itself when it owns its memory."""
    root = tr._root if tr._root is not None else tr
    if root._lift is not None or storage_id(tr._plain) != storage_id(root._plain):
        return None
    return root


def shared_roots(tracers: Sequence[Any]) -> set[int]:
    """The ids of the computed roots that two or more distinct output tracers view."""
    seen: dict[int, set[int]] = {}
    for tr in tracers:
        root = computed_root(tr)
        if root is not None:
            seen.setdefault(id(root), set()).add(id(tr))
    return {r for r, members in seen.items() if len(members) > 1}


def _extent(size: Sequence[int], stride: Sequence[int], offset: int) -> tuple[int, int]:
    """The first and last element a geometry reaches (``(0, -1)`` for no element)."""
    if any(s == 0 for s in size):
        return (0, -1)
    lo = offset + sum((s - 1) * st for s, st in zip(size, stride) if st < 0)
    hi = offset + sum((s - 1) * st for s, st in zip(size, stride) if st > 0)
    return (lo, hi)


def geometry(tr: Any, root: Any) -> tuple[Any, ...] | None:
    """``(size, stride, offset, requires_grad, base size, base stride[, dtype])`` of ``tr``
    relative to ``root``, or None where it cannot be made again of the compiled base (a base
    that is not dense, a view reaching outside its base's elements, no reading as its dtype)."""
    plain, base = tr._plain, root._plain
    if not is_dense(base) or base.numel() == 0:
        return None
    reread: tuple[str, ...] = ()
    if plain.dtype != base.dtype:
        try:
            base = base.view(plain.dtype)
        except RuntimeError:
            return None
        reread = (str(plain.dtype).removeprefix("torch."),)
    offset = plain.storage_offset() - base.storage_offset()
    lo, hi = _extent(plain.shape, plain.stride(), offset)
    blo, bhi = _extent(base.shape, base.stride(), 0)
    if lo < blo or hi > bhi:
        return None
    return (
        tuple(plain.shape),
        tuple(plain.stride()),
        offset,
        bool(tr._rg),
        tuple(root._plain.shape),
        tuple(root._plain.stride()),
        *reread,
    )


def base_layout(t: Any, size: Sequence[int], stride: Sequence[int]) -> Any:
    """The compiled base as eager laid it out: ``t`` itself, or a copy in that layout."""
    if not isinstance(t, torch.Tensor):
        raise InternalValueError(f"an output view's base is a {type(t).__name__}")
    if tuple(t.shape) != tuple(size):
        raise InternalValueError(f"an output view's base has shape {tuple(t.shape)}")
    if tuple(t.stride()) == tuple(stride):
        return t
    out = torch.empty_strided(tuple(size), tuple(stride), dtype=t.dtype, device=t.device)
    return out.copy_(t)  # NOTE: differentiable: a gradient reaches t through the copy


def make_view(base: torch.Tensor, ref: Sequence[Any]) -> torch.Tensor:
    """The view ``ref`` describes, made of the (laid out) base output."""
    _, _, size, stride, offset, requires_grad, _, _, *reread = ref
    if not requires_grad:
        base = base.detach()  # NOTE: shares memory and version counter; no gradient, as eager
    if reread:
        dtype = getattr(torch, str(reread[0]), None)
        if not isinstance(dtype, torch.dtype):
            raise InternalValueError(f"an output view names no dtype: {reread[0]!r}")
        base = base.view(dtype)
    return base.as_strided(tuple(size), tuple(stride), base.storage_offset() + offset)


class Bases:
    """The tensors a call hands out for the graph outputs that outputs view, made once."""

    def __init__(
        self,
        refs: Sequence[Sequence[Any]],
        results: Sequence[Any],
        inputs: set[int],
        handed_out: set[int],
    ) -> None:
        self.layouts = {int(r[0]): (r[6], r[7]) for r in refs}
        self.results, self.inputs, self.handed_out = results, inputs, handed_out  # NOTE: ids
        self.made: dict[int, Any] = {}
        self.views: dict[int, torch.Tensor] = {}

    def base(self, index: int) -> Any:
        if index not in self.made:
            t = self.results[index]
            if isinstance(t, torch.Tensor) and id(t) in self.inputs | self.handed_out:
                t = t.clone()  # NOTE: the base owns its memory in eager
            t = base_layout(t, *self.layouts[index])
            self.handed_out.add(id(t))
            self.made[index] = t
        return self.made[index]

    def view(self, ref: Sequence[Any]) -> torch.Tensor:
        tracer = int(ref[1])
        if tracer not in self.views:
            self.views[tracer] = make_view(self.base(int(ref[0])), ref)
        return self.views[tracer]


# NOTE: the memory formats an output keeps as eager gave it (else the program's layout stands)
LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def eager_layout(t: torch.Tensor) -> str | None:
    """The memory format eager gave output sample ``t``: ``"contiguous"``, ``"channels_last"``
    (a 4-D tensor), or None (another layout: the program's result is returned as it is)."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return None


# NOTE: the reason a plan pins strides for an output's memory format (a guard an exported
# program does not carry: it returns the example's format, as it runs one specialization)
FORMAT_READ = "the memory format of an output (eager's follows its operands' layouts)"


def follows_layouts(t: torch.Tensor) -> bool:
    """Whether eager laid output sample ``t`` out other than row-major, as its operands' layouts
    decided: a 4-D tensor, not row-major, of a shape that tells row-major from channels_last (a
    convolution, pooling or elementwise result of a channels_last operand). That format holds
    only for operands laid out as the samples were: for row-major operands eager's result is
    row-major, so returning the capture's format would make ``y.view(n, -1)`` raise."""
    if t.layout != torch.strided or t.dim() != 4 or t.is_contiguous():
        return False
    return not torch.empty(t.shape, device="meta").is_contiguous(memory_format=torch.channels_last)


def in_eager_layout(t: Any, layout: str | None) -> Any:
    """``t`` in the memory format eager gave it, copied where the program's differs (a
    convolution plait runs channels_last returns a row-major result as eager does, so that
    ``y.view(n, -1)`` after the call works as in eager)."""
    if layout is None or not isinstance(t, torch.Tensor):
        return t
    fmt = LAYOUTS[layout]
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)
