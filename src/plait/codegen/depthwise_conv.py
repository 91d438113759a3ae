"""A depthwise convolution as one native kernel, with the zero pad before it, its bias and its
activations folded in.

A float32 convolution whose groups equal its input and output channels (one 3x3 or 5x5 filter
per channel, stride 1 or 2, no dilation) reads each channel alone. oneDNN runs it well, but
around it a MobileNet-V2 block ran two more native kernels: the ReLU6 of the expansion's result
written into Hugging Face's explicit zero pad (``constant_pad``), and the ReLU6 of the
depthwise result. oneDNN's clip post-op maps NaN to 0 (eager's clamp keeps it), so neither
could be a post-op. Here one kernel (``csrc/depthwise.h``, compiled through the kernel cache)
does all of it, on channels_last maps, NaN kept as eager keeps it:

- a zero ``constant_pad`` of the last two dims read only by the convolution is folded into its
  padding (a padded tap is skipped: its product is zero for a finite weight);
- an activation of the clamp family (``clamp``, ``relu``; ``hardtanh`` and ``relu6`` capture as
  ``clamp``) read only by that pad or by the convolution is applied to each input element as it
  is loaded (the activated map is never written);
- an activation (the clamp family, ``silu`` or ``hardswish``) that alone reads the
  convolution's result is applied to each output before it is stored;
- a global average pool of that result (squeeze-and-excitation's squeeze: :func:`global_pool`)
  is computed as the rows are stored (:class:`PooledMeans`; its step only hands the means
  over, or pools the map where the call ran eager's ops).

Each output is its bias plus the products of its in-bounds taps, summed with fused
multiply-adds in another order than oneDNN's (the contract's conv budget). A weight with a
non-finite value runs eager's ops instead (a padded zero times an infinite weight is NaN in
eager's sum), as :func:`plait.codegen.onednn.conv_call` does. The weight is re-laid out once as
``[kh][kw][C]`` (a tap of 16 channels is one vector load).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((1, 16, 8, 8), torch.float32))
    >>> w = gb.input("w", TensorType((16, 1, 3, 3), torch.float32))
    >>> y = gb.call("conv2d", gb.call("clamp", x, min=0.0, max=6.0), w, None, stride=[1, 1],
    ...             padding=[1, 1], dilation=[1, 1], groups=16)
    >>> gb.output(gb.call("clamp", y, min=0.0, max=6.0))
    >>> g = gb.build()
    >>> dw = find_depthwise(g.nodes[1], g.users(), set(), {n.id for n in g.nodes})
    >>> [n.op for n in dw.prologue], [n.op for n in dw.epilogue], dw.pads
    (['clamp'], ['clamp'], (1, 1, 1, 1))
    >>> xs, ws = torch.randn(1, 16, 8, 8), torch.randn(16, 1, 3, 3)
    >>> got = depthwise_call(dw, {}).fn(xs, ws, None)
    >>> want = torch.conv2d(xs.clamp(0, 6), ws, None, 1, 1, 1, 16).clamp(0, 6)
    >>> torch.allclose(got, want, atol=1e-5), got.is_contiguous(memory_format=torch.channels_last)
    (True, True)
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.codegen.extern import ExternCall, PreparedWeight, reusable, watched
from plait.codegen.native_entries import build_entries, entry_text, shipped
from plait.codegen.native_launch import NativeLaunch
from plait.codegen.onednn_postops import single_user
from plait.ir.graph import Node, Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType

CL = torch.channels_last
KERNELS = (3, 5)
STRIDES = (1, 2)
# NOTE: activation codes of csrc/depthwise.h (and of csrc/pointwise.h, csrc/stem_conv.h)
NONE, CLAMP, SILU, HARDSWISH = 0, 1, 2, 3
Activation = tuple[int, float, float]
IDENTITY: Activation = (NONE, -math.inf, math.inf)


@dataclass(frozen=True)
class Depthwise:
    """A depthwise convolution ``host`` with what its kernel folds in: ``prologue`` (the input
    activation and the zero pad, in graph order) read from ``source``, ``epilogue`` (the output
    activation), ``pads`` (top, bottom, left, right: the pad's and the convolution's own)."""

    host: Node
    source: Value
    prologue: tuple[Node, ...]
    epilogue: tuple[Node, ...]
    in_act: Activation
    out_act: Activation
    pads: tuple[int, int, int, int]
    # NOTE: a global average pool of the result (squeeze-and-excitation's squeeze) whose means
    # the call writes too (:class:`Pooled`): the pool's step only hands them over
    pool: Node | None = None

    @property
    def output(self) -> Value:
        return (self.epilogue[-1] if self.epilogue else self.host).outputs[0]

    def describe(self) -> str:
        parts = [f"{n.op} (node {n.id})" for n in (*self.prologue, *self.epilogue)]
        return ", ".join(parts) if parts else "nothing"


def float32_static(v: object, rank: int | None = None) -> TensorType | None:
    """``v``'s type where it is a static float32 CPU tensor (of ``rank``, if given)."""
    if not isinstance(v, Value) or not isinstance(v.type, TensorType):
        return None
    t = v.type
    if t.dtype != torch.float32 or t.device != "cpu" or not t.is_static:
        return None
    return t if rank is None or t.rank == rank else None


def _bound(value: object, default: float) -> float | None:
    """A clamp bound as float32 (None: a bound the kernel does not take, NaN or a tensor)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(torch.tensor(float(value), dtype=torch.float32))


def activation(n: Node, outputs_too: bool) -> Activation | None:
    """``n`` as a kernel activation of a same-typed float32 value (``silu`` and ``hardswish``
    only on outputs)."""
    x = n.inputs[0] if n.inputs else None
    if float32_static(x) is None or not isinstance(x, Value) or x.type != n.outputs[0].type:
        return None
    if n.op == "relu":
        return CLAMP, 0.0, math.inf
    if n.op == "clamp":
        lo, hi = _bound(n.attrs.get("min"), -math.inf), _bound(n.attrs.get("max"), math.inf)
        return None if lo is None or hi is None else (CLAMP, lo, hi)
    if n.op == "silu" and outputs_too:
        return SILU, 0.0, 0.0
    if n.op == "hardswish" and outputs_too:
        return HARDSWISH, 0.0, 0.0
    return None


def _shape(node: Node) -> tuple[int, int] | None:
    """The (kernel size, stride) of a depthwise convolution the kernel computes, else None."""
    if node.op != "conv2d" or len(node.inputs) < 2:
        return None
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    xt, wt, yt = float32_static(x, 4), float32_static(w, 4), float32_static(node.outputs[0], 4)
    if xt is None or wt is None or yt is None or (b is not None and float32_static(b, 1) is None):
        return None
    a = node.attrs
    c, k = int(xt.shape[1]), int(wt.shape[2])
    if a["groups"] != c or tuple(wt.shape) != (c, 1, k, k) or int(yt.shape[1]) != c:
        return None
    stride = tuple(a["stride"])
    if k not in KERNELS or stride not in ((1, 1), (2, 2)) or tuple(a["dilation"]) != (1, 1):
        return None
    if any(int(d) == 0 for d in (*xt.shape, *yt.shape)):
        return None
    return k, int(stride[0])


def zero_pad(n: Node) -> tuple[int, int, int, int] | None:
    """A zero ``constant_pad`` of the last two dims only: its (top, bottom, left, right)."""
    if n.op != "constant_pad" or float32_static(n.inputs[0], 4) is None:
        return None
    pad, value = list(n.attrs["pad"]), n.attrs.get("value", 0)
    if value != 0 or len(pad) % 2 or not all(isinstance(p, int) and p >= 0 for p in pad):
        return None
    pad += [0] * (4 - len(pad))
    if any(pad[4:]):
        return None
    return pad[2], pad[3], pad[0], pad[1]


def find_depthwise(
    node: Node, users: Mapping[Value, list[Node]], outputs: set[int], live: set[int]
) -> Depthwise | None:
    """``node`` as a :class:`Depthwise` with everything it can fold in, or None where it is not
    a depthwise convolution the kernel computes. A pad or input activation is folded only where
    the convolution alone reads its result (and it is no program output): the kernel never
    writes it."""
    shape = _shape(node)
    if shape is None:
        return None
    ph, pw = (int(p) for p in node.attrs["padding"])
    pads = (ph, ph, pw, pw)
    x = node.inputs[0]
    assert isinstance(x, Value)
    prologue: list[Node] = []
    pad = x.producer
    folded = zero_pad(pad) if pad is not None else None
    if pad is not None and folded is not None and single_user(x, users, outputs, live) is node:
        pads = tuple(p + q for p, q in zip(pads, folded))  # type: ignore[assignment]
        prologue.append(pad)
        x = pad.inputs[0]
        assert isinstance(x, Value)
    in_act = IDENTITY
    act = x.producer
    reader = prologue[0] if prologue else node
    if act is not None and single_user(x, users, outputs, live) is reader:
        found = activation(act, outputs_too=False)
        if found is not None:
            in_act = found
            prologue.insert(0, act)
            x = act.inputs[0]
            assert isinstance(x, Value)
    epilogue: tuple[Node, ...] = ()
    out_act = IDENTITY
    then = single_user(node.outputs[0], users, outputs, live)
    found = activation(then, outputs_too=True) if then is not None else None
    if then is not None and found is not None and then.inputs[0] is node.outputs[0]:
        epilogue, out_act = (then,), found
    result = (epilogue[-1] if epilogue else node).outputs[0]
    pool = next((u for u in users.get(result, []) if u.id in live and global_pool(u)), None)
    return Depthwise(node, x, tuple(prologue), epilogue, in_act, out_act, pads, pool)


def global_pool(n: Node) -> bool:
    """Whether ``n`` averages a float32 map over all of its pixels into ``[N, C, 1, 1]`` (as
    squeeze-and-excitation blocks squeeze: ``adaptive_avg_pool2d`` to 1x1, or ``mean`` over
    the last two dims keeping them)."""
    a = n.attrs
    if n.op == "adaptive_avg_pool2d":
        pooled = tuple(a.get("output_size", ())) == (1, 1)
    elif n.op == "mean":
        dims = sorted(d % 4 for d in a.get("dims") or ())
        pooled = dims == [2, 3] and a.get("keepdim") is True and a.get("dtype") is None
    else:
        return False
    return (
        pooled
        and float32_static(n.inputs[0], 4) is not None
        and float32_static(n.outputs[0], 4) is not None
    )


# --- the kernel -------------------------------------------------------------------------------
def source() -> str:
    """The kernel's C++ as shipped (``csrc/depthwise.h``)."""
    return shipped("depthwise.h")


def symbol(k: int, s: int, ia: int, oa: int) -> str:
    return f"plait_depthwise_k{k}_s{s}_i{ia}_o{oa}"


def entry(k: int, s: int, ia: int, oa: int) -> str:
    """The ``extern "C"`` entry of one instantiation of ``csrc/depthwise.h``."""
    return entry_text(symbol(k, s, ia, oa), _call(k, s, ia, oa))


def _call(k: int, s: int, ia: int, oa: int) -> str:
    return f"dw::entry<{k}, {s}, {ia}, {oa}>(p, f)"


def kernel(k: int, s: int, ia: int, oa: int) -> Any:
    """The C entry of one instantiation, built once per machine through the kernel cache
    (:func:`plait.codegen.build.build_units`, which raises
    :class:`~plait.codegen.errors.BuildError`)."""
    name = symbol(k, s, ia, oa)
    return build_entries(source(), {name: _call(k, s, ia, oa)})[name]


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """A ``[C, 1, K, K]`` weight as ``[K, K, C]`` (contiguous)."""
    c, _, k, _ = w.shape
    return w.detach().reshape(c, k * k).t().contiguous()


def eager_ops(dw: Depthwise) -> Any:
    """What eager computes for ``dw``'s nodes, one reference op after another (a weight with a
    non-finite value), the result channels_last as the kernel's."""
    chain = [*dw.prologue, dw.host, *dw.epilogue]

    def run(x: Any, w: Any, b: Any) -> Any:
        v = x.contiguous()
        for n in chain:
            flat = [v, w, b][: len(n.inputs)] if n is dw.host else [v]
            v = get_op(n.op).run(flat, dict(n.attrs))[0]
        return v.contiguous(memory_format=CL)

    return run


@dataclass
class PooledMeans:
    """The means a depthwise call writes for its pool (:attr:`Depthwise.pool`): ``rows`` the
    kernel's scratch ``[N*OH, C]``; ``means`` the pool's result ``[N, C, 1, 1]`` (channels_last
    strides) from the call that wrote it to the pool step that hands it over as it is, else
    None (the runner's lock keeps one program call's steps together and in order: the
    convolution's, then the pool's). ``kept``: one tensor every call writes, where the pool's
    result dies within the call (:func:`means_die_in_call`), else None and a new tensor per
    call."""

    rows: torch.Tensor
    kept: torch.Tensor | None = None
    means: torch.Tensor | None = None

    @classmethod
    def of(cls, dw: Depthwise, keep: bool) -> PooledMeans:
        yt = dw.output.type
        assert isinstance(yt, TensorType)
        n, c, oh, _ = (int(d) for d in yt.shape)
        # NOTE: float32 whatever the default dtype: the kernel writes float32
        f32 = torch.float32
        kept = torch.empty_strided((n, c, 1, 1), (c, 1, c, c), dtype=f32) if keep else None
        return cls(torch.empty(n * oh, c, dtype=f32), kept)


def means_die_in_call(
    dw: Depthwise, users: Mapping[Value, list[Node]], outputs: set[int], live: set[int]
) -> bool:
    """Whether the pool's result is read by one convolution alone and is no program output: a
    convolution's result never shares its input's memory, so nothing holds the means after
    the call and the next call may write them in the same tensor."""
    assert dw.pool is not None
    reader = single_user(dw.pool.outputs[0], users, outputs, live)
    return reader is not None and reader.op == "conv2d"


def depthwise_call(
    dw: Depthwise, consts: Mapping[Any, torch.Tensor], pooled: PooledMeans | None = None
) -> ExternCall:
    """The call of ``dw`` (operands: its source, the weight, the bias or None; ``out``: the
    result's buffer, else a new one); with ``pooled``, it writes its pool's means there too.
    Raises :class:`~plait.codegen.errors.BuildError` where the kernel cannot be built."""
    shape = _shape(dw.host)
    assert shape is not None
    k, s = shape
    fn = kernel(k, s, dw.in_act[0], dw.out_act[0])
    xt, yt = dw.source.type, dw.output.type
    assert isinstance(xt, TensorType) and isinstance(yt, TensorType)
    n, c, h, wd = (int(d) for d in xt.shape)
    oh, ow = int(yt.shape[2]), int(yt.shape[3])
    top, _, left, _ = dw.pads
    sizes = (oh * ow * c, 1, ow * c, c)
    w = dw.host.inputs[1]
    weight = PreparedWeight(pack_weight, track_finite=True, reuse=reusable(w), watch=watched(w))
    fixed = consts.get(w)
    if fixed is not None:
        weight.prepare(fixed)
    params = (ctypes.c_int64 * 14)(0, 0, 0, 0, n, h, wd, c, oh, ow, top, left, 0, 0)
    if pooled is not None:
        params[12] = pooled.rows.data_ptr()
        means_shape, means_strides = (n, c, 1, 1), (c, 1, c, c)
    bounds = (ctypes.c_float * 4)(*dw.in_act[1:], *dw.out_act[1:])
    eager = eager_ops(dw)
    empty = torch.empty_strided
    pool = pool_ops(dw.pool) if dw.pool is not None else None

    def call(x: Any, w: Any, b: Any, out: Any = None) -> Any:
        packed = weight(w)
        y = empty((n, c, oh, ow), sizes, dtype=torch.float32) if out is None else out
        if not weight.finite:
            y.copy_(eager(x, w, b))
            if pooled is not None:
                pooled.means = None
                if pooled.kept is not None and pool is not None:
                    # NOTE: the kept means are this call's to write, natively or not: the
                    # pool step may not run (plait.runtime.native_run)
                    pooled.kept.copy_(pool(y))
            return y
        x = x.contiguous(memory_format=CL)
        bias = b.contiguous() if b is not None else None
        params[0], params[1] = x.data_ptr(), packed.data_ptr()
        params[2], params[3] = (bias.data_ptr() if bias is not None else 0), y.data_ptr()
        if pooled is not None:
            means = pooled.kept
            if means is None:
                means = empty(means_shape, means_strides, dtype=torch.float32)
            params[13] = means.data_ptr()
        fn(params, bounds)  # NOTE: the call holds both arrays (the kernel reads their memory)
        if pooled is not None:
            pooled.means = means
        return y

    when = "at compile time" if fixed is not None else "on first use"
    means = f"; the means of node {dw.pool.id} written too" if pooled and dw.pool else ""
    detail = (
        f"native depthwise {k}x{k} conv2d, stride {s}, channels_last, padding {dw.pads} "
        f"(folded: {dw.describe()}; weight laid out [kh][kw][C] {when}; a weight with a "
        f"non-finite value runs eager's ops{means})"
    )
    entries = (symbol(k, s, dw.in_act[0], dw.out_act[0]),)
    # NOTE: means written into a new tensor per call are no array's to run again
    launch = None
    if pooled is None:
        launch = NativeLaunch(fn, params, bounds, (0, 1, 2), 3, weight)
    elif pooled.kept is not None:
        owned = ((12, pooled.rows), (13, pooled.kept))
        launch = NativeLaunch(fn, params, bounds, (0, 1, 2), 3, weight, owned)
    return ExternCall(call, "conv", detail, "native", sizes, entries, launch)


def pool_ops(pool: Node) -> Any:
    """Eager's op for a :func:`global_pool` node, on its map."""
    if pool.op == "mean":
        return lambda y: torch.mean(y, (2, 3), keepdim=True)
    return lambda y: torch._C._nn.adaptive_avg_pool2d(y, (1, 1))


def pooled_call(dw: Depthwise, pooled: PooledMeans) -> ExternCall:
    """The call of ``dw.pool`` (operand: the map): the means ``dw``'s call wrote in this
    program call (in the kept tensor, whichever way it ran), else (the call ran eager's ops
    and keeps no tensor) eager's pool of the map."""
    assert dw.pool is not None
    fallback = pool_ops(dw.pool)
    kept = pooled.kept

    def call(y: Any) -> Any:
        if kept is not None:
            # NOTE: the depthwise call wrote them there, natively or by eager's ops: this
            # step's result at every call (NativeLaunch.result)
            return kept
        means = pooled.means
        if means is None:
            return fallback(y)
        pooled.means = None
        return means

    detail = (
        f"global average pool written by node {dw.host.id}'s native depthwise call (its "
        f"result's means; eager's {dw.pool.op} where that call ran eager's ops)"
    )
    launch = None
    if kept is not None:
        launch = NativeLaunch(None, None, None, (0,), -1, result=kept)
    return ExternCall(call, "reduction", detail, "native", launch=launch)


def fused_nodes(dws: Sequence[Depthwise]) -> set[int]:
    """The ids of the nodes the calls of ``dws`` compute besides their convolutions."""
    return {n.id for dw in dws for n in (*dw.prologue, *dw.epilogue)}
