"""Inputs for the gate: fresh random draws shaped like an example, layouts and devices.

A draw copies the example's structure, shapes, dtypes and devices, never its values: floats are
``mean + std * randn`` of the example (sign kept when the example has one sign), integers are
``randint`` over the example's range, bools are fair coins. A zero example still gets std 1, so a
draw is never all zeros. An integer example of one value ``v`` (a position, a lone index) draws
from ``0..v`` (``v..-1`` when negative): values between zero and a valid index are valid indices,
and two draws of one repeated value could not show a result computed for another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import plait.contract
from plait.conformance.tree import leaves, map_tensors

Args = tuple[Any, ...]
Factory = Callable[[int], Any]

LAYOUTS = plait.contract.LAYOUTS


@dataclass(frozen=True)
class Case:
    """One run configuration: which inputs, in which layout, on which device."""

    label: str
    args: Args
    layout: str
    device: str | None

    @property
    def device_name(self) -> str:
        if self.device is not None:
            return self.device
        found = sorted(devices_of(self.args))
        return "/".join(found) if found else "cpu"

    def __str__(self) -> str:
        return f"{self.label}, layout {self.layout}, device {self.device_name}"


def as_args(value: Any) -> Args:
    """Example inputs as a positional-argument tuple (a lone tensor becomes a 1-tuple)."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


def draw_like(example: Args, seed: int) -> Args:
    """Fresh random inputs with the example's structure, shapes, dtypes and devices.

    Example:
        >>> x = torch.zeros(2, 3)
        >>> (y,) = draw_like((x,), seed=0)
        >>> y.shape == x.shape and bool(y.ne(0).all())
        True
    """
    gen = torch.Generator().manual_seed(seed)
    return tuple(map_tensors(lambda t: _draw_tensor(t, gen), a) for a in example)


def _draw_tensor(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    shape, dtype = t.shape, t.dtype
    src = t.detach()
    if dtype == torch.bool:
        out = torch.randint(0, 2, shape, generator=gen).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        out = _draw_float(src, gen)
    elif dtype in _INT_DTYPES:
        low, high = _int_range(src)
        out = torch.randint(low, high, shape, generator=gen, dtype=torch.int64)
    else:
        return src.clone()  # NOTE: dtypes we cannot draw (float8, quantized) stay as given.
    return out.to(dtype=dtype, device=t.device)


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _int_range(src: torch.Tensor) -> tuple[int, int]:
    """``randint``'s bounds for an integer example: its range, widened towards zero when the
    example holds one value (``[0, v]`` or ``[v, -1]``; a zero stays zero)."""
    if not src.numel():
        return 0, 2
    low, high = int(src.min()), int(src.max()) + 1
    if high - low == 1 and low > 0:
        return 0, high
    if high - low == 1 and low < -1:
        return low, 0
    return low, high


def _draw_float(src: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    values = src.to(torch.complex128 if src.dtype.is_complex else torch.float64).cpu()
    finite = values[torch.isfinite(values)] if values.numel() else values
    mean = finite.mean() if finite.numel() else torch.zeros((), dtype=values.dtype)
    std = float(finite.std()) if finite.numel() > 1 else 0.0
    if not std > 0:
        std = max(float(abs(mean)), 1.0)
    noise = torch.randn(src.shape, generator=gen, dtype=values.dtype)
    out = mean + std * noise
    if not src.dtype.is_complex and finite.numel():
        if float(finite.min()) >= 0:
            out = out.abs()
        elif float(finite.max()) <= 0:
            out = -out.abs()
    return out


def draw_from_factory(factory: Factory, seed: int) -> Args:
    """Call the caller's ``factory(seed)``; it must return fresh inputs for each seed."""
    return as_args(factory(seed))


def stressed(args: Args, scale: float) -> Args:
    """``args`` with every float tensor multiplied by ``scale``, clamped to a quarter of its dtype's
    largest finite value (large inputs expose unstable formulas, e.g. softmax without max)."""

    def scale_one(t: torch.Tensor) -> torch.Tensor:
        if not t.dtype.is_floating_point:
            return t
        bound = torch.finfo(t.dtype).max / 4
        return (t.detach().double() * scale).clamp(-bound, bound).to(t.dtype)

    return tuple(map_tensors(scale_one, a) for a in args)


# NOTE: the special-values draw writes these, in this order, into the first positions of a
# random permutation of each floating-point input (as many as the input has elements)
SPECIAL_VALUES = (math.nan, math.inf, -math.inf, -0.0, 0.0)


def with_special_values(args: Args, seed: int) -> tuple[Args, list[str]]:
    """``args`` with NaN, +inf, -inf, -0.0 and +0.0 written into random positions of every real
    floating-point tensor (integers, bools and complex values unchanged); also where each went.

    Example:
        >>> (y,), where = with_special_values((torch.ones(2, 3),), seed=0)
        >>> int(y.isnan().sum()), int(y.isinf().sum()), where[0].startswith("input[0]: NaN at")
        (1, 2, True)
    """
    gen = torch.Generator().manual_seed(seed)
    written: list[str | None] = []  # NOTE: per tensor leaf, in the order leaves() names them

    def write(t: torch.Tensor) -> torch.Tensor:
        if not t.dtype.is_floating_point or not t.numel():
            written.append(None)
            return t
        new = t.detach().clone()
        picks = torch.randperm(t.numel(), generator=gen)[: len(SPECIAL_VALUES)].tolist()
        spots = []
        for value, pick in zip(SPECIAL_VALUES, picks, strict=False):
            index = tuple(int(k) for k in torch.unravel_index(torch.tensor(pick), t.shape))
            new[index] = value
            spots.append(f"{_special_name(value)} at {index}")
        written.append(", ".join(spots))
        return new

    out = tuple(map_tensors(write, a) for a in args)
    names = [name for name, t in leaves(args, "input") if isinstance(t, torch.Tensor)]
    where = [f"{name}: {spots}" for name, spots in zip(names, written, strict=True) if spots]
    return out, where


def _special_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return "-0.0" if math.copysign(1.0, value) < 0 else "+0.0"


def apply_layout(args: Args, layout: str) -> tuple[Args, bool]:
    """``args`` in ``layout``; also whether any tensor's memory format was changed by it."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    changed = False

    def convert(t: torch.Tensor) -> torch.Tensor:
        nonlocal changed
        if layout == "contiguous":
            return t.contiguous()
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
        if fmt is None or not t.dtype.is_floating_point:
            return t
        out = t.contiguous(memory_format=fmt)
        changed = changed or out.stride() != t.contiguous().stride()
        return out

    return tuple(map_tensors(convert, a) for a in args), changed


def to_device(args: Args, device: str | None) -> Args:
    if device is None:
        return args
    return tuple(map_tensors(lambda t: t.to(device), a) for a in args)


def to_float64(args: Args) -> Args:
    """Float tensors widened to float64 (complex to complex128), everything on the CPU."""

    def widen(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu()
        if t.dtype.is_complex:
            return t.to(torch.complex128)
        return t.to(torch.float64) if t.dtype.is_floating_point else t

    return tuple(map_tensors(widen, a) for a in args)


def fresh_copy(args: Args, requires_grad: bool) -> tuple[Args, list[tuple[str, torch.Tensor]]]:
    """A private copy of ``args`` (same strides); float leaves require grad when asked.

    Returns the copy and its named float leaves (``input[0]``...) that gradients are taken of.
    """

    def copy(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().clone()
        if requires_grad and out.dtype.is_floating_point:
            out.requires_grad_(True)
        return out

    copied = tuple(map_tensors(copy, a) for a in args)
    named = [
        (name, leaf)
        for name, leaf in leaves(copied, "input")
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad
    ]
    return copied, named


def devices_of(args: Sequence[Any]) -> set[str]:
    found: set[str] = set()
    for _, leaf in leaves(tuple(args), ""):
        if isinstance(leaf, torch.Tensor):
            found.add(leaf.device.type)
    return found
