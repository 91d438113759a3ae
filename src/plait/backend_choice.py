"""Which backend a compiled program gets when the caller names none; the choice and its reason
are recorded in each specialization's manifest (``options.backend_choice``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch

from plait.frontend import CapturedProgram
from plait.ir import TensorType


def default_backend(prog: CapturedProgram, state: Sequence[torch.Tensor]) -> tuple[str, str]:
    """``stax``: C++ kernels on the CPU, Triton kernels on CUDA (where Triton is installed),
    static and symbolic shapes alike (a symbolic CUDA program runs kernel by kernel: no CUDA
    graph). The reference interpreter runs the others (tensors on several devices, or on CUDA
    without Triton); the choice and its reason are recorded in the manifest
    (``options.backend_choice``)."""
    devices = {str(t.device) for t in state if isinstance(t, torch.Tensor)}
    static = True
    for v in prog.interface()[0]:
        t = v.type
        if isinstance(t, TensorType):
            devices.add(t.device)
            static = static and t.is_static
    if devices <= {"cpu"}:
        return "stax", "default for CPU tensors" + ("" if static else " (symbolic shapes)")
    if len(devices) > 1 or not all(d.startswith("cuda") for d in devices):
        return "eager", f"default for {sorted(devices)}: Stax compiles one CPU or CUDA device"
    if importlib.util.find_spec("triton") is None:
        return (
            "eager",
            f"default for {sorted(devices)}: Triton is not installed (pip install triton)",
        )
    shapes = "" if static else " (symbolic shapes: kernel by kernel, no CUDA graph)"
    return "stax", f"default for {sorted(devices)}: Triton kernels{shapes}"
