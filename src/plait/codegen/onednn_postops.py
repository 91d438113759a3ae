"""Which pointwise nodes after a convolution or linear become oneDNN post-ops (an
:class:`Epilogue`), and which stay native kernels: an activation whose post-op differs from
eager on special values (:data:`INEXACT`), or any after a linear that runs MKL's packed GEMM
(:func:`runs_mkl`). The calls themselves are :mod:`plait.codegen.onednn`'s.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> w = gb.input("w", TensorType((16, 8), torch.float32))
    >>> y = gb.call("tanh", gb.call("linear", x, w))
    >>> gb.output(y)
    >>> g = gb.build()
    >>> ep = find_epilogue(g.nodes[0], g.users(), set(), {0, 1})
    >>> ep.unary, [n.op for n in ep.nodes]
    ('tanh', ['tanh'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

import torch

from plait.ir.graph import Node, Value
from plait.ir.types import TensorType

DTYPES = (torch.float32, torch.bfloat16)
# NOTE: the activations oneDNN runs as post-ops with PyTorch's special values (NaN, +-inf, signed
# zeros) on every input; tests/codegen/test_special_values.py holds each one to eager.
UNARY = {"sigmoid": "sigmoid", "tanh": "tanh", "silu": "swish", "gelu": "gelu"}
# NOTE: activations never fused, with the reason (recorded as the node's kernel decision):
# oneDNN's post-op differs from eager on special values, so the activation runs natively.
INEXACT: dict[tuple[str, str], str] = {
    ("*", "relu"): "oneDNN's relu post-op maps NaN to 0 (PyTorch's relu keeps NaN)",
    ("linear", "gelu:none"): (
        "oneDNN's matmul gelu(erf) post-op maps -100 to +0 and +inf to +inf (eager: -0, NaN)"
    ),
}


@dataclass(frozen=True)
class Epilogue:
    """Pointwise nodes fused into an extern's oneDNN post-ops, and the value they produce."""

    nodes: tuple[Node, ...]
    unary: str | None
    algorithm: str
    other: Value | None
    output: Value

    def describe(self) -> str:
        parts = (["add"] if self.other is not None else []) + ([self.unary] if self.unary else [])
        return "+".join(parts)


def eager_gelu_uses_onednn(x: object) -> bool:
    """Whether eager computes gelu(erf) of ``x`` (an IR value) with oneDNN, PyTorch's
    ``use_mkldnn``: a CPU float32 tensor, or bfloat16 or float16 where this CPU's oneDNN has
    it, of more than one element (assumed dense, as every pointwise result is in eager).
    oneDNN's gelu(+inf) is NaN; ATen's loop gives +inf. NOTE: the build's oneDNN (a cache key
    part), not the user's switch for it: a program that turns oneDNN off gets ATen's +inf."""
    if not isinstance(x, Value) or not isinstance(x.type, TensorType):
        return False
    if x.type.device != "cpu" or not torch.backends.mkldnn.is_available():
        # NOTE: on CUDA eager's gelu is ATen's kernel: gelu(+inf) = +inf
        return False
    if not _onednn_gelu_dtype(x.type.dtype):
        return False
    if not x.type.is_static:
        return True  # NOTE: a symbolic size is at least 2 where plait captured it
    numel = 1
    for d in x.type.shape:
        numel *= int(d)
    return numel > 1


def _onednn_gelu_dtype(dtype: torch.dtype) -> bool:
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        check = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", None)
        return check is not None and bool(check())
    return dtype == torch.float32


def supported(node: Node) -> bool:
    """Whether ``node`` (conv2d or linear) can run through oneDNN's fused primitives."""
    if node.op not in ("conv2d", "linear") or not torch.backends.mkldnn.is_available():
        return False
    out = node.outputs[0].type
    x, w = node.inputs[0], node.inputs[1]
    if not (isinstance(out, TensorType) and out.dtype in DTYPES):
        return False
    if not (isinstance(x, Value) and isinstance(w, Value) and isinstance(x.type, TensorType)):
        return False
    if any(_empty(t) for t in (x.type, w.type, out)):
        return False  # NOTE: oneDNN creates no primitive with a dim of size 0
    return node.op == "linear" or x.type.rank == 4


def _empty(t: object) -> bool:
    """Whether tensor type ``t`` has a dim that is the static size 0."""
    return isinstance(t, TensorType) and any(isinstance(d, int) and d == 0 for d in t.shape)


def _same(a: Value, b: Value) -> bool:
    return isinstance(a.type, TensorType) and a.type == b.type


def single_user(
    v: Value, users: Mapping[Value, list[Node]], outputs: set[int], live: set[int]
) -> Node | None:
    """The one live node reading ``v``; None where ``v`` is a program output or has no reader
    or several (a value fused into its reader must have no other)."""
    if id(v) in outputs:
        return None
    found = {u.id: u for u in users.get(v, []) if u.id in live}
    return next(iter(found.values())) if len(found) == 1 else None


def inexact_reason(host: str, n: Node) -> str | None:
    """Why activation ``n`` after a ``host`` (conv2d or linear) is not a oneDNN post-op, if it
    is one oneDNN would compute differently from eager on special values."""
    key = f"{n.op}:{n.attrs.get('approximate', 'none')}" if n.op == "gelu" else n.op
    return INEXACT.get((host, key)) or INEXACT.get(("*", key))


def _unary(n: Node, v: Value, host: str) -> tuple[str, str] | None:
    if n.op not in UNARY or n.inputs[0] is not v or not _same(v, n.outputs[0]):
        return None
    if inexact_reason(host, n) is not None:
        return None
    return UNARY[n.op], str(n.attrs.get("approximate", "")) if n.op == "gelu" else ""


def runs_mkl(node: Node, mkl_linear: bool) -> bool:
    """Whether ``node`` runs MKL's packed GEMM (then with no post-op: what follows it is a native
    kernel). NOTE: measured on the zoo's transformers (one thread), MKL's packed GEMM and a
    native kernel for the activation or add (fused with its neighbours: silu with Llama's gate
    product, the residual add into the layer norm) beat oneDNN's linear with the post-op by
    3-8% per model."""
    if not (mkl_linear and supported(node) and mkl_packed_available(node)):
        return False
    if node.op == "conv2d":
        rows = pointwise_rows(node)
        return rows is not None and rows <= FEW_ROWS
    # NOTE: with symbolic rows, one pack per row count (codegen.mkl_rows)
    return node.op == "linear"


# NOTE: a 1x1 convolution of at most this many rows (a squeeze-and-excitation block's, on a 1x1
# map) runs MKL's packed GEMM and its activation as a native kernel: measured on the 2-core AMD
# EPYC at one thread with cold caches (as in a model), 17 us a call, against 38 us for oneDNN's
# linear with the activation as a post-op and 55 us for oneDNN's convolution.
FEW_ROWS = 16


def pointwise_rows(node: Node) -> int | None:
    """The rows (``N*H*W``) of a static convolution ``node`` that is a linear of its pixels: a 1x1
    kernel, stride 1, no padding, no dilation, one group (:mod:`plait.codegen.pointwise_conv`);
    None for any other node."""
    if node.op != "conv2d" or len(node.inputs) < 2:
        return None
    x, w = node.inputs[0], node.inputs[1]
    if not (isinstance(x, Value) and isinstance(w, Value)):
        return None
    xt, wt = x.type, w.type
    if not (isinstance(xt, TensorType) and isinstance(wt, TensorType)):
        return None
    if not (xt.is_static and wt.is_static and xt.rank == 4 and wt.rank == 4):
        return None
    a = node.attrs
    if tuple(wt.shape[2:]) != (1, 1) or list(a["stride"]) != [1, 1] or a["groups"] != 1:
        return None
    if list(a["padding"]) != [0, 0] or list(a["dilation"]) != [1, 1]:
        return None
    return int(xt.shape[0]) * int(xt.shape[2]) * int(xt.shape[3])


def unfused_activation(
    node: Node,
    users: Mapping[Value, list[Node]],
    outputs: set[int],
    live: set[int],
    mkl_linear: bool = False,
) -> tuple[Node, str] | None:
    """The activation after ``node`` (directly, or after its residual add) that is not fused
    because oneDNN's post-op is inexact, with the reason: the decision the manifest records."""
    if not supported(node) or runs_mkl(node, mkl_linear):
        return None
    v = node.outputs[0]
    for _ in range(2):
        user = single_user(v, users, outputs, live)
        if user is None:
            return None
        reason = inexact_reason(node.op, user)
        if reason is not None:
            return user, reason
        if user.op != "add":
            return None
        v = user.outputs[0]
    return None


def find_epilogue(
    node: Node,
    users: Mapping[Value, list[Node]],
    outputs: set[int],
    live: set[int],
    mkl_linear: bool = False,
) -> Epilogue | None:
    """The pointwise nodes after ``node`` that oneDNN can run as post-ops: an activation, or a
    residual add of a same-shaped tensor (conv: optionally followed by an activation). None
    for a linear that runs MKL's packed GEMM (:func:`runs_mkl`)."""
    if not supported(node) or runs_mkl(node, mkl_linear):
        return None
    v = node.outputs[0]
    first = single_user(v, users, outputs, live)
    if first is None:
        return None
    unary = _unary(first, v, node.op)
    if unary is not None:
        return Epilogue((first,), unary[0], unary[1], None, first.outputs[0])
    if first.op != "add" or first.attrs.get("alpha", 1) != 1:
        return None
    a, b = first.inputs
    other = b if a is v else a
    if not (isinstance(other, Value) and other is not v and (a is v or b is v)):
        return None
    if not (_same(other, v) and _same(v, first.outputs[0])):
        return None
    added = first.outputs[0]
    then = single_user(added, users, outputs, live) if node.op == "conv2d" else None
    after = _unary(then, added, node.op) if then is not None else None
    if then is not None and after is not None:
        return Epilogue((first, then), after[0], after[1], other, then.outputs[0])
    return Epilogue((first,), None, "", other, added)


@cache
def mkl_linear_available() -> bool:
    """Whether this PyTorch build has MKL and its packed-linear ops."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def mkl_packed_available(node: Node) -> bool:
    """Whether a linear ``node`` can run MKL's packed GEMM: float32, on a build that has it."""
    out = node.outputs[0].type
    return isinstance(out, TensorType) and out.dtype == torch.float32 and mkl_linear_available()
