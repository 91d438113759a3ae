"""A 1x1 convolution as one native kernel, with its residual add and activation folded in.

A float32 convolution with a 1x1 kernel (stride 1, no padding, no dilation, one group) of a
channels_last map is a matrix product of the map's pixel rows with the weight. oneDNN's
convolution runs it through a general primitive whose cost shows on the narrow maps of mobile
networks: on MobileNet-V2's 19 pointwise shapes at one thread (the Intel Xeon VM, hot caches)
it took 2.6-3.0 ms in all, and this kernel (``csrc/pointwise.h``: pixels by output channels
held in registers, each input element broadcast from its row) 2.0-2.3 ms, faster on every
shape. It folds in what follows the convolution where nothing else reads the convolution's
result:

- a residual ``add`` of a same-shaped float32 tensor (MobileNet's and EfficientNet's
  projections; the residual is read channels_last);
- then an activation of the clamp family (``relu``, ``clamp``; ``hardtanh`` and ``relu6``
  capture as ``clamp``), ``silu`` or ``hardswish``, NaN kept as eager keeps it (oneDNN's clip
  post-op maps NaN to 0, so a ReLU after a convolution was a separate kernel).

Each output is its bias plus its products summed with fused multiply-adds in channel order
(the contract's conv budget), then its residual, then its activation. A weight with a
non-finite value runs eager's ops instead, as :func:`plait.codegen.onednn.conv_call` does. The
kernel needs AVX-512 (:func:`available`); elsewhere the convolution stays oneDNN's.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((1, 24, 8, 8), torch.float32))
    >>> r = gb.input("r", TensorType((1, 40, 8, 8), torch.float32))
    >>> w = gb.input("w", TensorType((40, 24, 1, 1), torch.float32))
    >>> y = gb.call("conv2d", x, w, None, stride=[1, 1], padding=[0, 0], dilation=[1, 1],
    ...             groups=1)
    >>> gb.output(gb.call("relu", gb.call("add", y, r)))
    >>> g = gb.build()
    >>> pw = find_pointwise(g.nodes[0], g.users(), set(), {n.id for n in g.nodes})
    >>> [n.op for n in pw.epilogue] if available() else ['add', 'relu']
    ['add', 'relu']
    >>> xs, ws, rs = torch.randn(1, 24, 8, 8), torch.randn(40, 24, 1, 1), torch.randn(1, 40, 8, 8)
    >>> got = pointwise_call(pw, {}).fn(xs, ws, None, rs) if available() else (
    ...     torch.relu(torch.conv2d(xs, ws) + rs))
    >>> bool(torch.allclose(got, torch.relu(torch.conv2d(xs, ws) + rs), atol=1e-4))
    True
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from plait.codegen.depthwise_conv import (
    CLAMP,
    HARDSWISH,
    IDENTITY,
    NONE,
    SILU,
    Activation,
    activation,
    float32_static,
)
from plait.codegen.extern import ExternCall, PreparedWeight, reusable, watched
from plait.codegen.native_entries import build_entries, shipped
from plait.codegen.native_launch import NativeLaunch
from plait.codegen.onednn_postops import single_user
from plait.ir.graph import Node, Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType

CL = torch.channels_last
# NOTE: the activation codes of csrc/pointwise.h, as csrc/depthwise.h's
ACTIVATIONS = (NONE, CLAMP, SILU, HARDSWISH)


# NOTE: a float32 linear of at most this many rows runs the kernel too: its weight is read once
# per call from memory, where the blocked stream is read at twice MKL's speed (a 960 x 1280
# weight, one row, one thread: 190 us against 437 us for torch's linear, the caches flushed)
MAX_LINEAR_ROWS = 8
STATE = ("param", "buffer", "const")  # NOTE: the kinds of weight a linear's call packs once


@dataclass(frozen=True)
class Pointwise:
    """A 1x1 convolution (or a linear of few rows) ``host`` with what its kernel folds in:
    ``epilogue`` (the residual add, then the activation, in graph order), ``other`` (the add's
    other operand), ``act``."""

    host: Node
    epilogue: tuple[Node, ...]
    other: Value | None
    act: Activation

    @property
    def source(self) -> Value:
        x = self.host.inputs[0]
        assert isinstance(x, Value)
        return x

    @property
    def prologue(self) -> tuple[Node, ...]:
        return ()

    @property
    def extra(self) -> tuple[Value, ...]:
        return (self.other,) if self.other is not None else ()

    @property
    def output(self) -> Value:
        return (self.epilogue[-1] if self.epilogue else self.host).outputs[0]

    @property
    def linear(self) -> bool:
        return self.host.op == "linear"

    def describe(self) -> str:
        parts = [f"{n.op} (node {n.id})" for n in self.epilogue]
        return ", ".join(parts) if parts else "nothing"


@cache
def available() -> bool:
    """Whether this CPU runs the kernel (AVX-512F, as PyTorch's dispatch sees the CPU)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")


def float32_map(v: object) -> TensorType | None:
    """``v``'s type where it is a static, non-empty float32 CPU tensor of rank 4, else None."""
    t = float32_static(v, 4)
    return t if t is not None and all(int(d) > 0 for d in t.shape) else None


def float32_bias(b: object) -> bool:
    """Whether a convolution's bias operand is absent or a float32 tensor value."""
    return b is None or (
        isinstance(b, Value) and isinstance(b.type, TensorType) and b.type.dtype == torch.float32
    )


def few_rows_linear(node: Node) -> bool:
    """Whether ``node`` is a float32 linear of at most :data:`MAX_LINEAR_ROWS` rows (the
    product of its input's leading sizes) the kernel computes: its weight a parameter, buffer
    or constant (packed once; a weight passed in at each call stays the library's, which reads
    it as it is)."""
    if node.op != "linear" or len(node.inputs) < 2:
        return False
    w = node.inputs[1]
    if not isinstance(w, Value) or w.producer is not None or w.kind not in STATE:
        return False
    xt, wt = float32_static(node.inputs[0]), float32_static(node.inputs[1], 2)
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if xt is None or wt is None or xt.rank < 1 or not float32_bias(b):
        return False
    rows = math.prod(int(d) for d in xt.shape[:-1])
    c, o = int(wt.shape[1]), int(wt.shape[0])
    return 0 < rows <= MAX_LINEAR_ROWS and int(xt.shape[-1]) == c and c > 0 and o > 0


def is_pointwise(node: Node) -> bool:
    """Whether ``node`` is a float32 1x1 convolution, or a linear of few rows
    (:func:`few_rows_linear`), the kernel computes."""
    if few_rows_linear(node):
        return True
    if node.op != "conv2d" or len(node.inputs) < 2:
        return False
    x, w, yt = node.inputs[0], node.inputs[1], float32_map(node.outputs[0])
    b = node.inputs[2] if len(node.inputs) > 2 else None
    wt = float32_map(w)
    if float32_map(x) is None or wt is None or yt is None:
        return False
    if not float32_bias(b):
        return False
    a = node.attrs
    geometry = (tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), a["groups"])
    return tuple(wt.shape[2:]) == (1, 1) and geometry == ((1, 1), (0, 0), (1, 1), 1)


def find_pointwise(
    node: Node,
    users: Mapping[Value, list[Node]],
    outputs: set[int],
    live: set[int],
    taken: Container[int] = (),
) -> Pointwise | None:
    """``node`` as a :class:`Pointwise` with the residual add and activation after it that only
    it feeds (and no other call folds in: ``taken``), or None where it is not a convolution of
    :func:`is_pointwise` (or the CPU has no AVX-512)."""
    if not available() or not is_pointwise(node):
        return None
    v = node.outputs[0]
    epilogue: list[Node] = []
    other: Value | None = None
    then = single_user(v, users, outputs, live)
    then = None if then is None or then.id in taken else then
    if then is not None and then.op == "add" and then.attrs.get("alpha", 1) == 1:
        a, b = then.inputs
        o = b if a is v else a
        same = isinstance(o, Value) and o is not v and (a is v or b is v)
        if same and float32_static(o) == v.type and then.outputs[0].type == v.type:
            epilogue, other = [then], o  # type: ignore[assignment]
            v = then.outputs[0]
            then = single_user(v, users, outputs, live)
            then = None if then is None or then.id in taken else then
    act = IDENTITY
    found = activation(then, outputs_too=True) if then is not None else None
    if then is not None and found is not None and then.inputs[0] is v:
        epilogue.append(then)
        act = found
    return Pointwise(node, tuple(epilogue), other, act)


# --- the kernel -------------------------------------------------------------------------------
def source() -> str:
    """The kernel's C++ as shipped (``csrc/pointwise.h``)."""
    return shipped("pointwise.h")


def symbol(act: int, res: bool) -> str:
    return f"plait_pointwise_a{act}_r{int(res)}"


def kernel(act: int, res: bool) -> Any:
    """The C entry of one instantiation; all six are built in one unit, once per machine,
    through the kernel cache (:func:`plait.codegen.build.build_units`, which raises
    :class:`~plait.codegen.errors.BuildError`)."""
    keys = [(a, r) for a in ACTIVATIONS for r in (False, True)]
    calls = {symbol(a, r): f"pw::entry<{a}, {str(r).lower()}>(p, f)" for a, r in keys}
    return build_entries(source(), calls)[symbol(act, res)]


BLOCK = 64  # output channels a block of the packed weight holds (csrc/pointwise.h's)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """A ``[O, C, 1, 1]`` weight blocked as the kernel reads it: ``[C, OP]`` (OP: O rounded up to
    16; the padding zero) cut into blocks of 64 columns (the last one OP's rest), each stored
    whole (``[C, 64]``), one after another; flat.

    >>> w = torch.arange(6.0).reshape(3, 2, 1, 1)  # O = 3, C = 2
    >>> pack_weight(w).reshape(2, 16)[:, :4].tolist()  # one block: [C][16], O padded
    [[0.0, 2.0, 4.0, 0.0], [1.0, 3.0, 5.0, 0.0]]
    """
    o, c = int(w.shape[0]), int(w.shape[1])
    rows = torch.zeros(c, (o + 15) // 16 * 16, dtype=torch.float32)
    rows[:, :o] = w.detach().reshape(o, c).t()
    return torch.cat([block.flatten() for block in rows.split(BLOCK, dim=1)])


def eager_ops(pw: Pointwise) -> Any:
    """What eager computes for ``pw``'s nodes, one reference op after another (a weight with a
    non-finite value), the result laid out as the kernel's (a convolution's channels_last)."""
    layout = torch.contiguous_format if pw.linear else CL

    def run(x: Any, w: Any, b: Any, *extra: Any) -> Any:
        env: dict[int, Any] = {id(pw.other): extra[0]} if extra else {}
        flat = [x.contiguous(), w, b][: len(pw.host.inputs)]
        v = get_op(pw.host.op).run(flat, dict(pw.host.attrs))[0]
        env[id(pw.host.outputs[0])] = v
        for n in pw.epilogue:
            v = get_op(n.op).run([env[id(u)] for u in n.inputs], dict(n.attrs))[0]
            env[id(n.outputs[0])] = v
        return v.contiguous(memory_format=layout)

    return run


def pointwise_call(pw: Pointwise, consts: Mapping[Any, torch.Tensor]) -> ExternCall:
    """The call of ``pw`` (operands: its source, the weight, the bias or None, then the
    residual where it adds one; ``out``: the result's buffer, else a new one). Raises
    :class:`~plait.codegen.errors.BuildError` where the kernel cannot be built."""
    fn = kernel(pw.act[0], pw.other is not None)
    w = pw.host.inputs[1]
    assert isinstance(w, Value)
    xt, wt = pw.source.type, w.type
    assert isinstance(xt, TensorType) and isinstance(wt, TensorType)
    o, c = int(wt.shape[0]), int(wt.shape[1])
    if pw.linear:
        # NOTE: x [..., C] and y [..., O], both contiguous: [P][C] and [P][O] rows
        size = (*(int(d) for d in xt.shape[:-1]), o)
        sizes = tuple(math.prod(size[i + 1 :]) for i in range(len(size)))
        layout, rows = torch.contiguous_format, math.prod(size[:-1])
    else:
        n, _, h, wd = (int(d) for d in xt.shape)
        size, sizes = (n, o, h, wd), (h * wd * o, 1, wd * o, o)
        layout, rows = CL, n * h * wd
    weight = PreparedWeight(pack_weight, track_finite=True, reuse=reusable(w), watch=watched(w))
    fixed = consts.get(w)
    if fixed is not None:
        weight.prepare(fixed)
    params = (ctypes.c_int64 * 10)(0, 0, 0, 0, 0, rows, c, o, (o + 15) // 16 * 16, 1)
    lo, hi = pw.act[1:] if pw.act[0] == CLAMP else (-math.inf, math.inf)
    bounds = (ctypes.c_float * 2)(lo, hi)
    eager = eager_ops(pw)
    empty = torch.empty_strided

    def call(x: Any, w: Any, b: Any, *extra: Any, out: Any = None) -> Any:
        packed = weight(w)
        y = empty(size, sizes, dtype=torch.float32) if out is None else out
        if not weight.finite:
            return y.copy_(eager(x, w, b, *extra))
        x = x.contiguous(memory_format=layout)
        bias = b.contiguous() if b is not None else None
        res = extra[0].contiguous(memory_format=layout) if extra else None
        params[0], params[1] = x.data_ptr(), packed.data_ptr()
        params[2] = bias.data_ptr() if bias is not None else 0
        params[3] = res.data_ptr() if res is not None else 0
        params[4] = y.data_ptr()
        fn(params, bounds)  # NOTE: the call holds every array (the kernel reads their memory)
        return y

    when = "at compile time" if fixed is not None else "on first use"
    what = f"native linear of {rows} rows" if pw.linear else "native 1x1 conv2d, channels_last"
    detail = (
        f"{what} (folded: {pw.describe()}; weight laid out [C][O] in blocks of 64 {when}; a "
        "weight with a non-finite value runs eager's ops)"
    )
    op_class = "matmul" if pw.linear else "conv"
    entries = (symbol(pw.act[0], pw.other is not None),)
    launch = NativeLaunch(fn, params, bounds, slots=(0, 1, 2, 3), out=4, weight=weight)
    return ExternCall(call, op_class, detail, "native", sizes, entries, launch)
