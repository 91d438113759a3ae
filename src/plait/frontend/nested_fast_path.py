"""``nn.TransformerEncoder``'s nested-tensor fast path, which a capture cannot take.

In eval mode, without grad and given a ``src_key_padding_mask`` (and no ``mask``), eager's
``TransformerEncoder.forward`` packs its input into a nested tensor by the mask, when the mask is
left-aligned (its values decide: ``mask_check``), and pads the result back with zeros: the
padded positions of its output are 0. A capture takes the slow path (its tensors carry
``__torch_function__``, and under ``torch.compiler.is_compiling()`` the mask check is skipped),
whose padded positions hold computed values, so a graph would differ from eager there.

The two checks the slow path stops at during capture (``is_compiling()`` with ``mask_check``,
``torch.overrides.has_torch_function`` without it) call :func:`refuse_if_encoder_fast_path`
with the encoder's frame: where eager's remaining conditions hold, the capture is refused
(:class:`~plait.errors.GraphCaptureError`), and the program runs eagerly with a warning (its
layers may still compile as regions).

Example:
    >>> import sys
    >>> refuse_if_encoder_fast_path(sys._getframe())  # not the encoder's frame: nothing
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from plait.errors import GraphCaptureError
from plait.frontend.thread_patch import ThreadPatch

_ENCODER_FORWARD = torch.nn.TransformerEncoder.forward.__code__
_SUPPORTED_DEVICES = ("cpu", "cuda", "xpu")


def refuse_if_encoder_fast_path(frame: types.FrameType | None, mask_check: bool = True) -> None:
    """Raise where ``frame`` is ``TransformerEncoder.forward`` at one of its fast-path checks
    and eager would pack its input by the padding mask (see the module doc)."""
    if frame is None or frame.f_code is not _ENCODER_FORWARD:
        return
    loc = frame.f_locals
    src, output, first = loc.get("src"), loc.get("output"), loc.get("first_layer")
    if loc.get("src_key_padding_mask") is None or loc.get("mask") is not None:
        return
    if getattr(output, "is_nested", False) or torch.is_autocast_enabled() or first is None:
        return
    if not isinstance(src, torch.Tensor) or src.device.type not in _SUPPORTED_DEVICES:
        return
    weights = [t for t in _first_layer_tensors(first) if isinstance(t, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in [src, *weights]):
        return
    how = "by the mask's values (left-aligned)" if mask_check else "(mask_check=False)"
    raise GraphCaptureError(
        "nested tensor",
        "nn.TransformerEncoder in eval mode with a src_key_padding_mask takes PyTorch's "
        f"nested-tensor fast path {how}, which pads its output with zeros; a capture takes "
        "the slow path, whose padded positions differ. Pass enable_nested_tensor=False to the "
        "encoder to compile it",
        kind="data-dependent" if mask_check else "limitation",
    )


def _first_layer_tensors(layer: Any) -> list[Any]:
    attn = layer.self_attn
    return [
        attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight, attn.out_proj.bias,
        layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias,
        layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias,
    ]  # fmt: skip


def _has_torch_function(args: Any) -> bool:
    if _HAS_TORCH_FUNCTION.active():
        refuse_if_encoder_fast_path(sys._getframe(1), mask_check=False)
    return bool(_HAS_TORCH_FUNCTION.original(args))


_HAS_TORCH_FUNCTION = ThreadPatch(torch.overrides, "has_torch_function", _has_torch_function)


@contextmanager
def watching() -> Iterator[None]:
    """While a capture runs on this thread: ``torch.overrides.has_torch_function`` called by
    ``TransformerEncoder.forward`` refuses its fast path (the ``mask_check=False`` case)."""
    with _HAS_TORCH_FUNCTION.on():
        yield
