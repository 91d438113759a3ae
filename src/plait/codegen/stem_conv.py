"""A network's stem convolution (an image's few channels in) as one native kernel that reads the
program's input where it lies, with the zero pad before it and the activation after it folded in.

The first convolution of a vision model reads the caller's NCHW image: three channels, a 3x3
window, stride 2. oneDNN takes it channels_last, so the program first wrote the image again in
that layout, and Hugging Face's MobileNetV2 and EfficientNet pad the image explicitly (a
TensorFlow "same" pad, one more row and column at the end) in the same kernel: on the Intel Xeon
VM at one thread that kernel took 120-150 us and oneDNN's convolution 270 us (MobileNetV2's 3 ->
32 channels at 224x224). Here one kernel (``csrc/stem_conv.h``) reads the image in place, skips
the padded taps, and writes the result channels_last, as the depthwise convolution after it
reads it. It applies where:

- the convolution is float32, one group, no dilation, stride 1 or 2, a window larger than 1x1,
  with at most :data:`MAX_TAPS` taps per output (input channels times window);
- what it reads (through a zero ``constant_pad`` of the last two dims that only it reads) is a
  tensor the caller passes in;
- an activation of the clamp family, ``silu`` or ``hardswish`` that alone reads its result is
  folded in (unless a depthwise call folds it in first).

Each output is its bias plus the products of its in-bounds taps, in the weight's order, by fused
multiply-adds (the contract's conv budget). A weight with a non-finite value runs eager's ops
instead (a padded zero times an infinite weight is NaN in eager's sum).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((1, 3, 16, 16), torch.float32))
    >>> w = gb.input("w", TensorType((32, 3, 3, 3), torch.float32))
    >>> p = gb.call("constant_pad", x, pad=[0, 1, 0, 1], value=0.0)
    >>> y = gb.call("conv2d", p, w, None, stride=[2, 2], padding=[0, 0], dilation=[1, 1],
    ...             groups=1)
    >>> gb.output(gb.call("clamp", y, min=0.0, max=6.0))
    >>> g = gb.build()
    >>> stem = find_stem(g.nodes[1], g.users(), set(), {n.id for n in g.nodes})
    >>> found = ([n.op for n in stem.prologue], stem.pads) if available() else None
    >>> found in ((['constant_pad'], (0, 1, 0, 1)), None)
    True
    >>> xs, ws = torch.randn(1, 3, 16, 16), torch.randn(32, 3, 3, 3)
    >>> want = torch.conv2d(torch.nn.functional.pad(xs, (0, 1, 0, 1)), ws, None, 2).clamp(0, 6)
    >>> got = stem_call(stem, {}).fn(xs, ws, None) if available() else want
    >>> torch.allclose(got, want, atol=1e-5), got.is_contiguous(memory_format=torch.channels_last)
    (True, True)
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from plait.codegen import pointwise_native
from plait.codegen.depthwise_conv import CLAMP, IDENTITY, Activation, activation, zero_pad
from plait.codegen.extern import ExternCall, PreparedWeight, reusable, watched
from plait.codegen.native_entries import build_entries, shipped
from plait.codegen.native_launch import NativeLaunch
from plait.codegen.onednn_postops import single_user
from plait.codegen.pointwise_native import ACTIVATIONS, available, float32_bias, float32_map
from plait.ir.graph import Node, Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType

CL = torch.channels_last
# NOTE: taps per output (input channels x window): an image's 3 channels by a 3x3 window is 27
MAX_TAPS = 32


@dataclass(frozen=True)
class Stem:
    """A stem convolution ``host`` with what its kernel folds in: ``prologue`` (the zero pad),
    ``epilogue`` (the activation), ``pads`` (top, bottom, left, right: the pad's and the
    convolution's own), read from ``source`` (a graph input)."""

    host: Node
    source: Value
    prologue: tuple[Node, ...]
    epilogue: tuple[Node, ...]
    act: Activation
    pads: tuple[int, int, int, int]

    @property
    def output(self) -> Value:
        return (self.epilogue[-1] if self.epilogue else self.host).outputs[0]

    def describe(self) -> str:
        parts = [f"{n.op} (node {n.id})" for n in (*self.prologue, *self.epilogue)]
        return ", ".join(parts) if parts else "nothing"


def _is_stem(node: Node) -> bool:
    if node.op != "conv2d" or len(node.inputs) < 2:
        return False
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    xt, wt = float32_map(x), float32_map(w)
    if xt is None or wt is None or float32_map(node.outputs[0]) is None:
        return False
    if not float32_bias(b):
        return False
    a = node.attrs
    stride = tuple(a["stride"])
    if a["groups"] != 1 or tuple(a["dilation"]) != (1, 1) or stride not in ((1, 1), (2, 2)):
        return False
    window = int(wt.shape[2]) * int(wt.shape[3])  # NOTE: a 1x1 is the pointwise kernel's
    return window > 1 and math.prod(int(d) for d in wt.shape[1:]) <= MAX_TAPS


def find_stem(
    node: Node,
    users: Mapping[Value, list[Node]],
    outputs: set[int],
    live: set[int],
    taken: Container[int] = (),
) -> Stem | None:
    """``node`` as a :class:`Stem`, or None where it is not a stem convolution the kernel
    computes (or the CPU has no AVX-512). A pad or activation is folded only where the
    convolution alone reads it or is read by it (and no other call folds it in: ``taken``)."""
    if not available() or not _is_stem(node):
        return None
    ph, pw = (int(p) for p in node.attrs["padding"])
    pads = (ph, ph, pw, pw)
    x = node.inputs[0]
    assert isinstance(x, Value)
    prologue: tuple[Node, ...] = ()
    pad = x.producer
    folded = zero_pad(pad) if pad is not None else None
    alone = single_user(x, users, outputs, live) is node
    if pad is not None and folded is not None and alone and pad.id not in taken:
        pads = tuple(p + q for p, q in zip(pads, folded))  # type: ignore[assignment]
        prologue = (pad,)
        x = pad.inputs[0]
        assert isinstance(x, Value)
    if x.producer is not None or x.kind != "user":
        return None  # NOTE: only what the caller passes is NCHW where the call reads it
    then = single_user(node.outputs[0], users, outputs, live)
    found = activation(then, outputs_too=True) if then is not None else None
    if then is None or found is None or then.id in taken or then.inputs[0] is not node.outputs[0]:
        return Stem(node, x, prologue, (), IDENTITY, pads)
    return Stem(node, x, prologue, (then,), found, pads)


# --- the kernel -------------------------------------------------------------------------------
@functools.cache
def source() -> str:
    """The kernel's C++ as shipped (``csrc/stem_conv.h``, after ``csrc/pointwise.h``)."""
    return pointwise_native.source() + "\n" + shipped("stem_conv.h")


def symbol(act: int) -> str:
    return f"plait_stem_conv_a{act}"


def kernel(act: int) -> Any:
    """The C entry of one instantiation; all are built in one unit, once per machine, through
    the kernel cache (:func:`plait.codegen.build.build_units`, which raises
    :class:`~plait.codegen.errors.BuildError`)."""
    calls = {symbol(a): f"sc::entry<{a}>(p, f)" for a in ACTIVATIONS}
    return build_entries(source(), calls)[symbol(act)]


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """A ``[O, C, KH, KW]`` weight as ``[C*KH*KW, OP]`` (OP: O rounded up to 16; padding 0)."""
    o = int(w.shape[0])
    taps = w.detach().reshape(o, -1)
    packed = torch.zeros(taps.shape[1], (o + 15) // 16 * 16, dtype=torch.float32)
    packed[:, :o] = taps.t()
    return packed


def eager_ops(stem: Stem) -> Any:
    """What eager computes for ``stem``'s nodes, one reference op after another (a weight with a
    non-finite value)."""
    chain = [*stem.prologue, stem.host, *stem.epilogue]

    def run(x: Any, w: Any, b: Any) -> Any:
        v = x
        for n in chain:
            flat = [v, w, b][: len(n.inputs)] if n is stem.host else [v]
            v = get_op(n.op).run(flat, dict(n.attrs))[0]
        return v

    return run


def stem_call(stem: Stem, consts: Mapping[Any, torch.Tensor]) -> ExternCall:
    """The call of ``stem`` (operands: its source, the weight, the bias or None; ``out``: the
    result's buffer, else a new one). Raises
    :class:`~plait.codegen.errors.BuildError` where the kernel cannot be built."""
    fn = kernel(stem.act[0])
    w = stem.host.inputs[1]
    assert isinstance(w, Value)
    xt, wt, yt = stem.source.type, w.type, stem.output.type
    assert isinstance(xt, TensorType) and isinstance(wt, TensorType)
    assert isinstance(yt, TensorType)
    n, cin, h, wd = (int(d) for d in xt.shape)
    o, _, kh, kw = (int(d) for d in wt.shape)
    oh, ow = int(yt.shape[2]), int(yt.shape[3])
    size, sizes = (n, o, oh, ow), (oh * ow * o, 1, ow * o, o)
    top, _, left, _ = stem.pads
    offsets = torch.tensor(
        [(c * h + i) * wd + j for c in range(cin) for i in range(kh) for j in range(kw)],
        dtype=torch.int64,
    )
    weight = PreparedWeight(pack_weight, track_finite=True, reuse=reusable(w), watch=watched(w))
    fixed = consts.get(w)
    if fixed is not None:
        weight.prepare(fixed)
    s = int(stem.host.attrs["stride"][0])
    op = (o + 15) // 16 * 16
    params = (ctypes.c_int64 * 18)(
        0, 0, 0, 0, offsets.data_ptr(), n, cin, h, wd, o, op, oh, ow, kh, kw, s, top, left
    )
    lo, hi = stem.act[1:] if stem.act[0] == CLAMP else (-math.inf, math.inf)
    bounds = (ctypes.c_float * 2)(lo, hi)
    eager = eager_ops(stem)
    empty = torch.empty_strided

    def call(x: Any, w: Any, b: Any, out: Any = None, _offsets: torch.Tensor = offsets) -> Any:
        packed = weight(w)
        y = empty(size, sizes, dtype=torch.float32) if out is None else out
        if not weight.finite:
            return y.copy_(eager(x, w, b))
        x = x.contiguous()
        bias = b.contiguous() if b is not None else None
        params[0], params[1] = x.data_ptr(), packed.data_ptr()
        params[2] = bias.data_ptr() if bias is not None else 0
        params[3] = y.data_ptr()
        fn(params, bounds)  # NOTE: the call holds every array (the offsets: its default)
        return y

    when = "at compile time" if fixed is not None else "on first use"
    detail = (
        f"native stem conv2d {kh}x{kw}, stride {s}, {cin} channels in, read where the caller "
        f"passes it, written channels_last, padding {stem.pads} (folded: {stem.describe()}; "
        f"weight laid out [taps][O] {when}; a weight with a non-finite value runs eager's ops)"
    )
    entries = (symbol(stem.act[0]),)
    launch = NativeLaunch(fn, params, bounds, (0, 1, 2), 3, weight, ((4, offsets),))
    return ExternCall(call, "conv", detail, "native", sizes, entries, launch)
