"""Options of the Stax backend (codegen and executor), with defaults that suit the CPU.

Example:
    >>> StaxOptions(strict=True).strict, StaxOptions(kernels="tvm").kernels
    (True, 'tvm')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from plait.errors import InvalidOptionError

KERNEL_PRINTERS = ("cpp", "tvm")


@dataclass(frozen=True)
class StaxOptions:
    """``strict``: raise :class:`~plait.codegen.CodegenError` when a node would fall back to
    PyTorch (``fullgraph=True``). ``parallel_threshold``: elements (times phases) from which a
    kernel's outer loop runs OpenMP-parallel. ``jobs``: parallel compiler processes (default: CPU
    count). ``kernels_per_unit``: kernels per translation unit. ``check_inputs``: check each
    call's input dtypes and shapes (kernels read raw memory: a wrong shape must never reach
    them). ``inplace``: allow epilogue kernels to write over a dying input. ``infer_layouts``: run
    each extern once on zeros at compile time to learn the layout of its result.

    Ablation knobs (each on by default; off turns one optimisation off, the program still
    conforms): ``fuse``: fuse pointwise chains, reduction producers and epilogues into kernels and
    oneDNN post-ops (off: every pointwise, constant and reduction node is its own kernel, every
    extern its own call). ``memory_plan``: kernel intermediates live in one arena reused across
    calls, epilogues in place (off: each is allocated fresh per call, nothing in place).
    ``channels_last``: convolutions run on channels_last activations and stored values keep
    the layout of what they are computed from (off: every stored value is contiguous,
    convolutions read NCHW; an extern's result keeps the layout PyTorch gives it either way,
    with ``infer_layouts``, on any device). ``mkl_linear``: float32 linears run MKL's packed GEMM
    (weight packed once for the call's rows) and the activation or residual add after one runs
    in a native kernel, fused with its neighbours (off: oneDNN linears with the activation or add
    as a post-op, as bfloat16 linears and builds without MKL always run). ``onednn``:
    convolutions and linears of the C++ target run oneDNN (and MKL) with prepacked weights and
    fused post-ops (off: PyTorch's own kernels, called as eager calls them; training programs
    turn it off, their weights change every step and a prepack per step cost more than it saved).
    ``timed_matmul``: a float32 product without a prepacked weight (a training program's) runs
    oneDNN's matmul where it timed faster than PyTorch's kernel at compile time, on the call's
    own shapes, and a linear that would run MKL's packed GEMM runs oneDNN's prepacked linear
    where that timed faster (off: PyTorch's kernel, MKL's packed GEMM; see
    :mod:`plait.codegen.timed_matmul`). ``gemm_conv``: a float32 convolution's backward (a
    training program's ``convolution_backward``) runs as an im2col, GEMMs and a col2im where
    that timed faster than PyTorch's kernel at compile time, on the call's own shapes (off:
    PyTorch's kernel; see :mod:`plait.codegen.gemm_conv`). ``depthwise``: a float32 depthwise
    convolution (3x3 or 5x5, stride 1 or 2) of the C++ target runs plait's native kernel, with
    the zero pad and the activation before it and the activation after it folded in where
    nothing else reads them
    (off: oneDNN's convolution, the pad and activations native kernels; see
    :mod:`plait.codegen.depthwise_conv`). ``pointwise``: a float32 1x1 convolution (stride 1,
    no padding, one group) of the C++ target on a CPU with AVX-512 runs plait's native kernel,
    with the residual add and the activation after it folded in where nothing else reads the
    convolution's result, and so does a float32 linear of at most 8 rows whose weight is a
    parameter, buffer or constant (off: oneDNN's convolution, MKL's or oneDNN's linear; see
    :mod:`plait.codegen.pointwise_native`).
    ``stem``: a float32 convolution of few input channels (at most 32 taps per output) reading a
    tensor the caller passes, as a network's first convolution reads the image, runs plait's
    native kernel on the CPU with AVX-512, reading it in place, with the zero pad before it and
    the activation after it folded in (off: oneDNN's convolution on a channels_last copy; see
    :mod:`plait.codegen.stem_conv`). ``global_pool``: a float32 ``adaptive_avg_pool2d`` to 1x1
    (a classifier's head) of the C++ target runs plait's native kernel (off: ATen's; see
    :mod:`plait.codegen.global_pool`).

    ``target``: ``auto`` (C++ kernels for CPU tensors, Triton kernels for CUDA tensors),
    ``cpu`` or ``triton`` (Triton on CPU tensors runs through Triton's interpreter: what CI tests
    the Triton printer with). ``cuda_graphs``: on CUDA, capture the whole program as one CUDA
    graph when nothing in it syncs with the host, and replay it on each call (off: launch each
    kernel and extern from Python). ``cuda_handoff``: a training step's backward graph reads
    the saved values in the forward graph's own buffers instead of copies of them
    (:mod:`plait.runtime.cuda_handoff`; off: copied out of the one and into the other on every
    step, an ablation). ``cuda_shared_pool``: that backward graph is captured into the forward
    graph's memory pool, so its temporaries and outputs take the memory the forward's temporaries
    left free (off: a pool of its own, held beside the forward's; an ablation).
    ``triton_autotune``: time a few block shapes of each Triton kernel on the device at compile
    time and keep the fastest (the choice is cached with the kernel, by its source and the GPU:
    a later compile times nothing); off: the heuristic's.

    ``kernels``: which printer prints the CPU kernels: ``cpp`` (the C++ printer) or ``tvm``
    (Apache TVM, ``pip install plait[tvm]``: each kernel lowered to TensorIR and built by TVM's
    LLVM backend, run by the same executor; a kernel the TVM printer refuses is printed by the
    C++ printer, recorded per kernel). ``tvm_tune``: MetaSchedule trials per TVM kernel (0: the
    default schedule; the tuning log is kept beside the kernel in the kernel cache and reused)."""

    strict: bool = False
    parallel_threshold: int = 1 << 17
    jobs: int | None = None
    kernels_per_unit: int = 24
    check_inputs: bool = True
    inplace: bool = True
    infer_layouts: bool = True
    fuse: bool = True
    memory_plan: bool = True
    channels_last: bool = True
    mkl_linear: bool = True
    onednn: bool = True
    timed_matmul: bool = True
    gemm_conv: bool = True
    depthwise: bool = True
    pointwise: bool = True
    stem: bool = True
    global_pool: bool = True
    target: str = "auto"
    cuda_graphs: bool = True
    cuda_handoff: bool = True
    cuda_shared_pool: bool = True
    triton_autotune: bool = False
    kernels: str = "cpp"
    tvm_tune: int = 0

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_PRINTERS:
            raise InvalidOptionError(f"kernels={self.kernels!r}: one of {list(KERNEL_PRINTERS)}")
        if type(self.tvm_tune) is not int or self.tvm_tune < 0:
            raise InvalidOptionError(
                f"tvm_tune={self.tvm_tune!r}: a count of trials (0: no tuning)"
            )

    def record(self) -> dict[str, Any]:
        return asdict(self)
