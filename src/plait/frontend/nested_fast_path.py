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

``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` have fast paths of their own in
eval mode without grad (``torch._native_multi_head_attention``,
``torch._transformer_encoder_layer_fwd``), which a capture does not take either
(``has_torch_function``). Without a mask they compute what the slow path does, within the
contract. With one, a row whose every key is masked is NaN on the fast path, where the slow
path's scaled dot-product attention (which the layer and ``need_weights=False`` use) gives 0:
such a call is refused (:func:`refuse_if_attention_fast_path`), unless
``torch.backends.mha.set_fastpath_enabled(False)`` turned eager's fast path off (a flag that
capture guards, :mod:`plait.frontend.library_reads`). Each refusal here is decided by that flag
too: the eager fallback's guards hold it, so turning the fast path off after a refused call
captures again, and compiles. One tensor of the call passed as query, key and value is traced as
one tensor (:mod:`plait.frontend.lifting`), so the capture's ``query is key`` holds as eager's
does, and such a masked call reaches the ``has_torch_function`` check, refused there.

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
import torch.backends.mha

from plait.errors import GraphCaptureError
from plait.frontend.capture_values import CaptureValues
from plait.frontend.library_reads import fastpath_root
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
    raise _decided_by_flag(
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


_ATTENTION = torch.nn.MultiheadAttention.forward.__code__
_LAYER = torch.nn.TransformerEncoderLayer.forward.__code__


def refuse_if_attention_fast_path(frame: types.FrameType | None) -> None:
    """Raise where ``frame`` is ``MultiheadAttention.forward`` or
    ``TransformerEncoderLayer.forward`` at its ``has_torch_function`` check (the fast path's
    other conditions held) and eager would take its fast path with a mask (see the module
    doc)."""
    if frame is None or frame.f_code not in (_ATTENTION, _LAYER):
        return
    loc = frame.f_locals
    layer = frame.f_code is _LAYER
    masks = ("src_mask", "src_key_padding_mask") if layer else ("attn_mask", "key_padding_mask")
    # NOTE: the layer's fast path checks CUDA's autocast only: under the CPU's it still runs,
    # and its fused kernel returns autocast's dtype where the slow path ends in float32
    cpu_autocast = layer and torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled()
    masked = not all(loc.get(m) is None for m in masks)
    if not (masked or cpu_autocast) or (not layer and loc.get("need_weights")):
        return
    attn = loc.get("self")
    attn = getattr(attn, "self_attn", None) if layer else attn
    if not _runs_fast(loc.get("tensor_args", ()), attn):
        return
    what = "nn.TransformerEncoderLayer" if layer else "nn.MultiheadAttention (need_weights=False)"
    why = (
        "given a mask, takes PyTorch's fast path, whose rows with every key masked are NaN "
        "where the slow path a capture takes gives 0"
        if masked
        else "under the CPU's autocast, takes PyTorch's fast path, whose result has autocast's "
        "dtype where the slow path a capture takes ends in float32"
    )
    raise _decided_by_flag(
        "attention fast path",
        f"{what} in eval mode without grad, {why}. {_OFF}",
        kind="limitation",
    )


_OFF = "Call torch.backends.mha.set_fastpath_enabled(False) to compile it (the next call captures)"


def _runs_fast(tensors: Any, attn: Any) -> bool:
    """The fast path's last conditions on its tensor arguments (``tensors``: the call's and
    the attention's projections): devices it runs on, no gradient, both input projections."""
    args = [t for t in tensors if isinstance(t, torch.Tensor)]
    devices = (*_SUPPORTED_DEVICES, torch.utils.backend_registration._privateuse1_backend_name)
    if any(t.device.type not in devices for t in args):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in args):
        return False
    weight, bias = getattr(attn, "in_proj_weight", None), getattr(attn, "in_proj_bias", None)
    return weight is not None and bias is not None


def _decided_by_flag(operation: str, reason: str, kind: str) -> GraphCaptureError:
    """The refusal, whose fallback the fast-path flag is read by: eager takes the fast path
    only while ``torch.backends.mha.get_fastpath_enabled()``, so the fallback's guards hold the
    flag, and turning it off captures again (the slow path, which compiles)."""
    cx = CaptureValues.active
    if cx is not None:
        cx.refusal_reads.append(fastpath_root())
    return GraphCaptureError(operation, reason, kind=kind)


def _has_torch_function(args: Any) -> bool:
    if _HAS_TORCH_FUNCTION.active():
        frame = sys._getframe(1)
        refuse_if_encoder_fast_path(frame, mask_check=False)
        refuse_if_attention_fast_path(frame)
    return bool(_HAS_TORCH_FUNCTION.original(args))


_HAS_TORCH_FUNCTION = ThreadPatch(torch.overrides, "has_torch_function", _has_torch_function)


@contextmanager
def watching() -> Iterator[None]:
    """While a capture runs on this thread: ``torch.overrides.has_torch_function`` called by
    ``TransformerEncoder.forward`` refuses its fast path (the ``mask_check=False`` case), and
    called by ``MultiheadAttention.forward`` or ``TransformerEncoderLayer.forward``, their
    fast paths with a mask."""
    with _HAS_TORCH_FUNCTION.on():
        yield
