"""Float32 matrix products whose library is chosen by timing them at compile time, on the call's
own shapes and layouts on this CPU:

- without a prepacked weight (a training program's, whose weights change every step): oneDNN's
  matmul or PyTorch's kernel (MKL);
- a linear of a constant weight without post-ops (an inference program's): oneDNN's prepacked
  linear or MKL's packed GEMM (:func:`choose_linear`; MKL's is the timed step's rival,
  ``ExternStep.rival``).

Neither wins everywhere: on a 2-core AMD EPYC oneDNN took 0.76-0.86 of MKL's time for
``x @ W^T`` and ``g @ W`` of a GPT-2 block, and 1.5-1.9x for the weight gradient ``g^T @ x``;
on Intel Xeons MKL's packed GEMM led. With prepacked weights, at one thread on the same AMD
host, oneDNN's linear took 0.69-0.85 of MKL's packed GEMM for the GPT-2 block's shapes (512 rows;
768 x 768 to 768 x 3072). The probing oracle times both on the dry run's samples
(:data:`STAGE`) and refuses oneDNN with the two times when PyTorch's kernel was faster; the
saved plan replays that decision, so a warm start runs what the compile chose. Both compute
float32 products in float32 (strict: no reduced-precision math mode, checked at compile time
and guarded as ambient settings), judged by the contract's matmul budget.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> a = gb.input("a", TensorType((8, 4), torch.float32))
    >>> b = gb.input("b", TensorType((4, 3), torch.float32))
    >>> gb.output(gb.call("matmul", a, b))
    >>> node = gb.build().nodes[0]
    >>> eligible(node) == strict_float32()
    True
    >>> onednn_call(node).fn(torch.randn(8, 4), torch.randn(4, 3)).shape
    torch.Size([8, 3])
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from plait.codegen import onednn
from plait.codegen.extern import ExternCall, PreparedWeight
from plait.codegen.onednn_postops import runs_mkl
from plait.codegen.plan import ExternStep
from plait.ir.graph import Node, Value
from plait.ir.types import TensorType

if TYPE_CHECKING:
    from plait.codegen.layout_oracle import LayoutOracle, PlanFacts
    from plait.codegen.placement import Loc

# NOTE: the oracle stage whose refusal (PyTorch's kernel was faster) the saved plan keeps
STAGE = "timed"
REPEATS = 5  # NOTE: interleaved timed runs of each call, after one untimed run of each
# NOTE: calls whose untimed run took LONG_S or more get FEW_REPEATS: the compile's timing
# costs (1 + repeats) runs of each call per distinct shape, and a long call's median is steady
LONG_S, FEW_REPEATS = 5e-3, 3
LIBRARY = "oneDNN"


def strict_float32() -> bool:
    """Whether float32 products run in float32 (no TF32 or bfloat16 math mode) for both
    libraries: PyTorch's matmul precision "highest" and oneDNN's matmul precision strict."""
    try:
        if torch.get_float32_matmul_precision() != "highest":
            return False
    except RuntimeError:  # NOTE: set through both APIs (PyTorch raises): not known strict
        return False
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    return getattr(matmul, "fp32_precision", "none") in ("none", "ieee")


def eligible(node: Node) -> bool:
    """A float32 CPU ``matmul`` of an operand of rank 2 or more by a matrix, or a ``linear``,
    of static shapes, where both libraries compute in strict float32."""
    if node.op not in ("matmul", "linear") or len(node.inputs) < 2:
        return False
    x, w = node.inputs[0], node.inputs[1]
    if not (isinstance(x, Value) and isinstance(w, Value)):
        return False
    types = [x.type, w.type]
    if not all(isinstance(t, TensorType) and t.is_static for t in types):
        return False
    tx, tw = types[0], types[1]
    assert isinstance(tx, TensorType) and isinstance(tw, TensorType)
    if tx.dtype != torch.float32 or tw.dtype != torch.float32 or tx.device != "cpu":
        return False
    if tx.rank < 2 or tw.rank != 2 or 0 in tx.shape or 0 in tw.shape:
        return False
    return torch.backends.mkldnn.is_available() and strict_float32()


def onednn_call(node: Node) -> ExternCall:
    """``node`` as oneDNN's matmul (``mkldnn._linear_pointwise``, the weight not prepacked):
    rows of the first operand times the transposed weight (a matmul's matrix, transposed)."""
    lp = torch.ops.mkldnn._linear_pointwise

    def rows(x: torch.Tensor, w: torch.Tensor, bias: Any) -> torch.Tensor:
        if x.dim() == 2:
            return lp(x, w, bias, "none", [], "")
        out = lp(x.reshape(-1, x.shape[-1]), w, bias, "none", [], "")
        return out.view(*x.shape[:-1], w.shape[0])

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return rows(a, b.t(), None)

    def linear(x: torch.Tensor, w: torch.Tensor, bias: Any = None) -> torch.Tensor:
        return rows(x, w, bias)

    fn = product if node.op == "matmul" else linear
    return ExternCall(fn, "matmul", f"mkldnn._linear_pointwise ({node.op}, timed)", LIBRARY)


def times_linear(node: Node, mkl_linear: bool) -> bool:
    """Whether ``node`` is a linear that would run MKL's packed GEMM (no post-op; strict
    float32): its library is then timed (:func:`choose_linear`). A 1x1 convolution that runs
    MKL's packed GEMM (:mod:`plait.codegen.pointwise_conv`) is not timed."""
    return node.op == "linear" and runs_mkl(node, mkl_linear) and strict_float32()


def choose_linear(
    node: Node,
    oracle: LayoutOracle,
    locs: Mapping[Value, Loc],
    facts: PlanFacts,
    channels_last: bool,
) -> tuple[bool, PreparedWeight | None, str]:
    """For a linear of :func:`times_linear`: whether MKL's packed GEMM runs it (else oneDNN's
    prepacked linear, timed faster), the winner's weight (prepared already where the timing ran:
    not packed again), and the note that says why. Both candidates prepare their weight on
    first use: the timing's untimed run reads the constant itself (constants are their own
    samples), and nothing is prepared where a saved plan's decision is replayed."""
    weights = {mkl: onednn.linear_weight(node, mkl, facts.hints) for mkl in (True, False)}
    mkl_call, dnn_call = (
        onednn.linear_call(
            node, {}, None, channels_last, None, None, mkl, facts.hints, weights[mkl]
        )
        for mkl in (True, False)
    )
    timed = ExternStep(node, dnn_call, [], rival=mkl_call)
    if oracle.decide(timed, STAGE, locs) is not None:
        return True, weights[True], ""
    return False, weights[False], f"timed faster than {rival_name(mkl_call)}"


def timings(
    candidate: Callable[..., Any], default: Callable[..., Any], args: Sequence[Any]
) -> tuple[float, float]:
    """Median seconds of ``candidate`` and ``default`` over :data:`REPEATS` interleaved runs on
    ``args`` (:data:`FEW_REPEATS` for a long call), after one untimed run of each."""
    times: tuple[list[float], list[float]] = ([], [])
    with torch.no_grad():
        candidate(*args)
        start = time.perf_counter()
        default(*args)
        repeats = REPEATS if time.perf_counter() - start < LONG_S else FEW_REPEATS
        for _ in range(repeats):
            for k, fn in enumerate((candidate, default)):
                start = time.perf_counter()
                fn(*args)
                times[k].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def rival_name(rival: ExternCall | None) -> str:
    """How a refusal names what oneDNN was timed against."""
    return "PyTorch's kernel" if rival is None else f"{rival.library}'s packed GEMM"


def refusal(
    candidate_s: float,
    default_s: float,
    rival: str = "PyTorch's kernel",
    candidate: str = LIBRARY,
) -> str | None:
    """The reason ``candidate`` (oneDNN) is refused (``rival`` was not slower), or None."""
    if candidate_s < default_s:
        return None
    return (
        f"{rival} was faster at compile time ({default_s * 1e6:.0f} us against "
        f"{candidate}'s {candidate_s * 1e6:.0f} us)"
    )
