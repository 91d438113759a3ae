"""The settings of a call: what a compiled callable's users ran it under, read and re-applied.

:func:`call_state` reads grad mode, the default dtype, autocast and every call setting of
:mod:`plait.guards.ambient` (the guards of every specialization pin each of them, autocast as
on/off). :func:`applied_state` runs a block under such a reading. The artifact protocol
(:class:`plait.api.SpecializationUse`) uses both so that the conformance gate judges a
specialization under the settings of the calls it ran. Nothing here decides what is compiled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from plait.errors import InvalidOptionError
from plait.guards.ambient import call_settings

GRAD_MODE = "torch.is_grad_enabled()"
DEFAULT_DTYPE = "torch.get_default_dtype()"
AUTOCAST = "torch.autocast"
_AUTOCAST_DEVICES = ("cpu", "cuda")


def call_state() -> dict[str, Any]:
    """The settings a call runs under, by name: grad mode, the default dtype, autocast per
    device (enabled, dtype) and every call setting of :mod:`plait.guards.ambient`. The guards
    of every specialization pin each of them (autocast as on/off), so a specialization records
    them once, when it is created, as the settings of every call it runs.

    Example:
        >>> state = call_state()
        >>> state["torch.is_grad_enabled()"], "torch.get_num_threads()" in state
        (True, True)
    """
    autocast = {
        d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES
    }
    return {
        GRAD_MODE: torch.is_grad_enabled(),
        DEFAULT_DTYPE: torch.get_default_dtype(),
        AUTOCAST: autocast,
        **call_settings(),
    }


def _set_precision(backend: str, op: str) -> Callable[[Any], None]:
    def write(value: Any) -> None:
        torch._C._set_fp32_precision_setter(backend, op, str(value))

    return write


def _set_deterministic(value: Any) -> None:
    torch.use_deterministic_algorithms(
        bool(value), warn_only=torch.is_deterministic_algorithms_warn_only_enabled()
    )


def _set_warn_only(value: Any) -> None:
    torch.use_deterministic_algorithms(
        torch.are_deterministic_algorithms_enabled(), warn_only=bool(value)
    )


def _set_flush_denormal(value: Any) -> None:
    torch.set_flush_denormal(bool(value))


def _spread(write: Callable[..., None]) -> Callable[[Any], None]:
    """A writer for a setting read as a tuple (PyTorch's reader returns the setter's arguments)."""
    return lambda value: write(*value) if isinstance(value, tuple) else write(value)


def _set_autocast(value: Any) -> None:
    for device, (enabled, dtype) in value.items():
        torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_enabled(device, enabled)


# NOTE: one writer per setting call_state() reads (tests/test_call_settings.py checks that every
# call setting has one): a setting with no writer could not be put back for a judged call.
_WRITERS: dict[str, Callable[[Any], None]] = {
    GRAD_MODE: torch._C._set_grad_enabled,
    DEFAULT_DTYPE: torch.set_default_dtype,
    AUTOCAST: _set_autocast,
    "torch.get_num_threads()": torch.set_num_threads,
    "torch.get_float32_matmul_precision()": torch.set_float32_matmul_precision,
    "torch.backends.cuda.matmul.allow_tf32": torch._C._set_cublas_allow_tf32,
    "torch.backends.cudnn.allow_tf32": torch._C._set_cudnn_allow_tf32,
    "torch.backends.mkldnn.matmul.fp32_precision": _set_precision("mkldnn", "matmul"),
    "torch.backends.mkldnn.conv.fp32_precision": _set_precision("mkldnn", "conv"),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": _spread(
        torch._C._set_cublas_allow_fp16_reduced_precision_reduction
    ),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": _spread(
        torch._C._set_cublas_allow_bf16_reduced_precision_reduction
    ),
    "torch.are_deterministic_algorithms_enabled()": _set_deterministic,
    "torch.is_deterministic_algorithms_warn_only_enabled()": _set_warn_only,
    "torch.backends.mkldnn.enabled": torch._C._set_mkldnn_enabled,
    "torch.backends.cudnn.enabled": torch._C._set_cudnn_enabled,
    "torch.set_flush_denormal": _set_flush_denormal,
    "torch.backends.cuda.flash_sdp_enabled()": torch._C._set_sdp_use_flash,
    "torch.backends.cuda.mem_efficient_sdp_enabled()": torch._C._set_sdp_use_mem_efficient,
    "torch.backends.cuda.math_sdp_enabled()": torch._C._set_sdp_use_math,
    "torch.backends.cuda.cudnn_sdp_enabled()": torch._C._set_sdp_use_cudnn,
}


def settable(names: Sequence[str]) -> list[str]:
    """The names among ``names`` that :func:`applied_state` cannot write (none, normally)."""
    return [n for n in names if n not in _WRITERS]


@contextlib.contextmanager
def applied_state(state: Mapping[str, Any]) -> Iterator[None]:
    """Run the block under the settings ``state`` names (as :func:`call_state` returns them),
    then put back those it changed, in reverse order. Only settings that differ are written.
    A setting it cannot write raises ``ValueError`` before anything changes.

    Example:
        >>> import torch
        >>> with applied_state({"torch.is_grad_enabled()": False}):
        ...     torch.is_grad_enabled()
        False
        >>> torch.is_grad_enabled()
        True
    """
    missing = settable(list(state))
    if missing:
        raise InvalidOptionError(
            f"cannot apply the settings {missing}: plait has no writer for them"
        )
    now = call_state()
    changed: list[tuple[str, Any]] = []
    try:
        for name, value in state.items():
            if now.get(name) != value:
                _WRITERS[name](value)
                changed.append((name, now.get(name)))
        yield
    finally:
        for name, value in reversed(changed):
            _WRITERS[name](value)
