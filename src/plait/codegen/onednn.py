"""Convolution and linear through oneDNN, with prepacked weights and fused epilogues.

PyTorch exposes oneDNN's fused primitives (``mkldnn._convolution_pointwise`` and
``mkldnn._linear_pointwise``, the ones inductor uses when freezing): the weight is reordered once
into oneDNN's blocked layout, and an epilogue runs as a post-op inside the kernel, on the
accumulator, before the result is written: an activation (gelu, silu, sigmoid, tanh) and,
for a residual, an add of another tensor of the output's shape (conv: add then activation).
An activation whose post-op differs from eager on special values (relu: oneDNN maps NaN to 0;
see :mod:`plait.codegen.onednn_postops`, which decides the post-ops) is never fused: it runs
as a native kernel, and the plan records why.

A weight is prepacked at compile time when it is a constant the compiler owns (frozen; the
frozen-parameter guards make a changed parameter a recompile); when a saved plan is rebuilt
(nothing runs a call before the plan is done), the reorders run in two threads
(:class:`Prepacker`). Otherwise it is prepacked on the first call and reused while the tensor's
identity and version counter are unchanged, so an in-place update is never missed.
Convolutions run channels_last (the input is converted when it is not), which is oneDNN's fast
layout on the CPU.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> w = gb.input("w", TensorType((16, 8), torch.float32))
    >>> gb.output(gb.call("linear", x, w))
    >>> call = onednn_call(gb.build().nodes[0], {}, None, mkl_linear=False)
    >>> call.library, call.op_class
    ('oneDNN', 'matmul')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from plait.codegen import packed
from plait.codegen.extern import ExternCall, PreparedWeight, reusable, watched
from plait.codegen.mkl_rows import mkl_rows_call
from plait.codegen.onednn_postops import (
    Epilogue,
    runs_mkl,
)
from plait.ir.graph import Node, Value
from plait.ir.types import TensorType
from plait.symbolic.poly import evaluate, from_dim


def _attr(ep: Epilogue | None) -> tuple[str, list[Any], str]:
    if ep is None or ep.unary is None:
        return "none", [], ""
    return ep.unary, [], ep.algorithm


def linear_binary(x: Any, other: Any, w: Any, b: Any) -> Any:
    """oneDNN linear with a fused residual add post-op (the entry point of the binary call)."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, w, b, "add")


def conv_binary(
    x: Any,
    other: Any,
    w: Any,
    b: Any,
    padding: list[int],
    stride: list[int],
    dilation: list[int],
    groups: int,
    unary: str | None,
    scalars: list[Any],
    algorithm: str | None,
) -> Any:
    """oneDNN conv with a fused residual add (then ``unary``) post-op: the binary entry point.
    Some oneDNN builds (torch 2.11) refuse it ("could not create a memory"); the planner's dry
    run then falls back to the unfused conv and a native epilogue kernel."""
    op = torch.ops.mkldnn._convolution_pointwise.binary
    return op(x, other, w, b, padding, stride, dilation, groups, "add", 1.0, unary, scalars,
              algorithm)  # fmt: skip


class Prepacker:
    """Runs weight prepacking (oneDNN reorders; PyTorch releases the GIL in them) in
    ``threads`` threads, so they overlap each other, the planner's Python work and what follows
    it. Only where nothing calls an extern while the plan is made: the rebuild of a saved plan
    (the compile's dry runs call them, so it prepacks inline). Each job's future goes to the
    weight it prepares (``PreparedWeight.pending``): its first use waits for it and re-raises
    its failure. ``close(finish=True)`` lets the queued jobs run out; ``close()`` cancels them
    (on the way out of an error).

    NOTE: measured on ResNet-18 (20 conv reorders, 45 MB) on a 2-core machine shared with
    other work: sequential, 170 to 480 ms (the reorders' OpenMP regions wait on busy cores);
    two threads, 70 to 130 ms. On an idle machine the two are equal (about 45 ms).
    """

    def __init__(self, threads: int = 2, gate: Callable[[], Any] | None = None) -> None:
        # NOTE: a fixed count, not the machine's (two already keep the reorders off one
        # another's waits; each reorder is itself parallel); the results do not depend on it.
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None
        # NOTE: ``gate()`` returns before a job reads its weight (a cache entry's hash check,
        # when the weights are views of an entry still being checked); its failure is the job's
        self._gate = gate

    def __call__(self, fn: Callable[[], Any]) -> Future[Any]:
        gate = self._gate
        job = fn if gate is None else lambda: (gate(), fn())[1]
        if self._pool is not None:
            return self._pool.submit(job)
        done: Future[Any] = Future()
        try:
            done.set_result(job())
        except Exception as exc:  # NOTE: raised where a pooled job's would be: at its use
            done.set_exception(exc)
        return done

    def close(self, finish: bool = False) -> None:
        """End the threads: ``finish`` lets the queued jobs run to the end first (their users
        wait on them), else they are cancelled (on the way out of an error)."""
        if self._pool is not None:
            self._pool.shutdown(wait=not finish, cancel_futures=not finish)
            self._pool = None


@dataclass(frozen=True)
class SavedPack:
    """A prepacked weight as a cache entry holds it (:mod:`plait.codegen.packed`)."""

    data: torch.Tensor
    md: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    # NOTE: what ``data`` reads without owning (the prepacked tensor it was exported from).
    owner: Any = None
    # NOTE: whether the constant it was prepared from is all finite (None: not tracked). An
    # entry is found by its constants' hash, so the flag holds for the constant it loads for.
    finite: bool | None = None


# NOTE: how a call's detail says its weight came from the entry (replaced, for a deferred import
# that fails, by what :meth:`PackedWeights.import_deferred` did instead)
LOADED = "at compile time, its bytes loaded from the cache entry"


class PackedWeights:
    """The prepacked constant weights of one plan, by key (the constant's name and what its
    layout depends on: the op, its geometry and input shape). ``saved``: those a saved plan
    carries, imported instead of reordered; ``made``: those this plan prepared, for
    :meth:`export` (each with its constant). ``unusable``: why a saved one was not used
    (reported in the call's detail; the weight is then reordered).

    ``deferred``: :meth:`load` only queues the import (its bytes are in a cache entry whose hash
    is still being checked: oneDNN must not read a descriptor before that), and
    :meth:`import_deferred` runs the queue once the entry is verified."""

    def __init__(
        self, saved: Mapping[str, SavedPack] | None = None, deferred: bool = False
    ) -> None:
        self.saved = dict(saved or {})
        self.made: dict[str, tuple[PreparedWeight, torch.Tensor]] = {}
        self.unusable: dict[str, str] = {}
        self.deferred = deferred
        self.queued: list[tuple[str, PreparedWeight, torch.Tensor, int | None]] = []

    def load(
        self, key: str, weight: PreparedWeight, fixed: torch.Tensor, node: int | None = None
    ) -> bool:
        """Give ``weight`` the saved bytes of ``key`` for the constant ``fixed``, if saved (when
        deferred: queue it; ``node``, the id of the node that uses it, for the report)."""
        pack = self.saved.get(key)
        if pack is None:
            return False
        if self.deferred:
            self.queued.append((key, weight, fixed, node))
            return True
        try:
            value = packed.import_packed(pack.data, pack.md, pack.shape, pack.dtype)
        except (packed.PackedUnavailable, ValueError) as exc:
            self.unusable[key] = str(exc)
            return False
        weight.adopt(fixed, value, keep=pack.data, finite=pack.finite)
        return True

    def import_deferred(self) -> dict[int, str]:
        """Import the queued weights (call it once their entry is verified). One that cannot be
        imported is reordered here instead; returns, by node id, the detail text that says so
        (it replaces :data:`LOADED` in that node's detail)."""
        queued, self.queued, self.deferred = self.queued, [], False
        redone: dict[int, str] = {}
        for key, weight, fixed, node in queued:
            if self.load(key, weight, fixed):
                continue
            weight(fixed)
            if node is not None:
                redone[node] = f"at load; the entry's bytes were unusable: {self.unusable[key]}"
        return redone

    def export(self) -> dict[str, SavedPack]:
        """The prepared weights as bytes (views of the prepacked tensors, which each
        :class:`SavedPack` keeps alive), those prepared from their constant only."""
        out = {}
        for key in sorted(self.made):
            w, fixed = self.made[key]
            # NOTE: only a weight prepared from its constant (a call given another tensor for it
            # prepared that one instead).
            if w.source is fixed and w.portable and w.value is not None and w.value.is_mkldnn:
                try:
                    data, md = packed.export_packed(w.value)
                except packed.PackedUnavailable:
                    continue  # NOTE: not saved: a rebuild reorders it (its detail says so)
                # NOTE: the owner keeps alive the value and, for an imported one, the memory it
                # borrows (the entry's mapping), so the view stays valid as long as the pack.
                owner = (w.value, w.keep)
                shape, dtype = tuple(w.value.shape), w.value.dtype
                out[key] = SavedPack(data, md, shape, dtype, owner, w.finite)
        return out


def _pack_key(node: Node, *geometry: Any) -> str:
    w = node.inputs[1]
    assert isinstance(w, Value)
    return f"{w.name}:{node.op}:" + ":".join(str(g) for g in geometry)


def linear_call(
    node: Node,
    consts: Mapping[Any, torch.Tensor],
    ep: Epilogue | None,
    channels_last: bool = True,
    prepack: Prepacker | None = None,
    packs: PackedWeights | None = None,
    mkl_linear: bool = False,
    hints: Mapping[str, int] | None = None,
    weight: PreparedWeight | None = None,
) -> ExternCall:
    """``weight``: the :func:`linear_weight` of this call, if one was made already (prepared
    when a timing ran the call: not reordered again)."""
    op = torch.ops.mkldnn._linear_pointwise
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    rows, spelled = _rows(x.type, hints)
    mkl = ep is None and runs_mkl(node, mkl_linear)
    if mkl and not x.type.is_static:
        return mkl_rows_call(node, consts, rows)
    weight = linear_weight(node, mkl, hints) if weight is None else weight
    assert weight is not None
    if mkl:
        return mkl_linear_call(node, consts, rows, prepack, packs, weight)
    key = _pack_key(node, spelled)
    when = _prepare(weight, consts.get(node.inputs[1]), prepack, packs, key, node.id)
    detail = f"oneDNN linear (weight prepacked {when})"
    if ep is not None and ep.other is not None:

        def with_add(x: Any, w: Any, b: Any, other: Any) -> Any:
            return linear_binary(x, other, weight(w), b)

        return ExternCall(with_add, "matmul", f"{detail} + fused {ep.describe()}", "oneDNN")
    attr, scalars, algorithm = _attr(ep)
    default = op.default

    def fn(x: Any, w: Any, b: Any) -> Any:
        return default(x, weight(w), b, attr, scalars, algorithm)

    suffix = f" + fused {ep.describe()}" if ep is not None else ""
    return ExternCall(fn, "matmul", detail + suffix, "oneDNN")


def linear_weight(
    node: Node, mkl: bool, hints: Mapping[str, int] | None = None
) -> PreparedWeight | None:
    """The prepared weight of a linear ``node``: packed by MKL (``mkl``) or reordered by oneDNN
    for its rows (None: MKL with symbolic rows, packed per row count by the call itself)."""
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    rows = _rows(x.type, hints)[0]
    reuse, watch = reusable(node.inputs[1]), watched(node.inputs[1])
    if not mkl:
        reorder = torch.ops.mkldnn._reorder_linear_weight
        # NOTE: oneDNN's linear also takes the weight unconverted (PyTorch's [out, in] layout)
        return PreparedWeight(
            lambda w: reorder(w.contiguous(), rows), reuse=reuse, plain=_contiguous, watch=watch
        )
    if not x.type.is_static:
        return None
    pack = torch.ops.mkl._mkl_reorder_linear_weight
    # NOTE: MKL's own format for this CPU, no descriptor: never in a cache entry. Its plain
    # form is the weight itself, for eager's linear (mkl_linear_call).
    return PreparedWeight(
        lambda w: pack(w.contiguous(), rows),
        portable=False, reuse=reuse, plain=_contiguous, watch=watch,
    )  # fmt: skip


def _contiguous(w: torch.Tensor) -> torch.Tensor:
    return w.contiguous()


def _rows(t: TensorType, hints: Mapping[str, int] | None) -> tuple[int, str]:
    """The rows of a linear's input (a representative count for symbolic ones, at ``hints``),
    and how a pack key spells them (symbolic rows by their expression: the key must not depend
    on the hint)."""
    rows = 1
    for d in t.shape[:-1]:
        rows *= int(d) if isinstance(d, int) else evaluate(from_dim(d), hints or {})
    if t.is_static:
        return rows, str(rows)
    spelled = "*".join(str(d) for d in t.shape[:-1])
    return rows, f"rows={spelled}"


def mkl_linear_call(
    node: Node,
    consts: Mapping[Any, torch.Tensor],
    rows: int,
    prepack: Prepacker | None = None,
    packs: PackedWeights | None = None,
    weight: PreparedWeight | None = None,
) -> ExternCall:
    """A linear without post-ops through MKL's packed GEMM: the weight packed once for the
    call's ``rows`` (the input's rows are fixed by the plan), then each call runs MKL's compute
    on the packed panels, the same sgemm kernel eager's linear runs (tests hold it to eager). The
    packed bytes are MKL's own format for this CPU, so a cache entry never carries them
    (``portable=False``): a rebuilt plan packs again. ``weight``: as in :func:`linear_call`."""
    weight = linear_weight(node, True) if weight is None else weight
    assert weight is not None
    key = _pack_key(node, "mkl", rows)
    when = _prepare(weight, consts.get(node.inputs[1]), prepack, packs, key, node.id)
    compute = torch.ops.mkl._mkl_linear.default
    linear = torch._C._nn.linear

    def fn(x: Any, w: Any, b: Any) -> Any:
        packed = weight(w)
        if weight.varies:  # NOTE: written between calls: eager's linear, no pack per call
            return linear(x, w, b)
        return compute(x, packed, w, b, rows)

    return ExternCall(fn, "matmul", f"MKL packed linear (weight prepacked {when})", "MKL")


def conv_call(
    node: Node,
    consts: Mapping[Any, torch.Tensor],
    ep: Epilogue | None,
    channels_last: bool = True,
    prepack: Prepacker | None = None,
    packs: PackedWeights | None = None,
    hints: Mapping[str, int] | None = None,
) -> ExternCall:
    a = node.attrs
    stride, padding, dilation, groups = (
        list(a["stride"]),
        list(a["padding"]),
        list(a["dilation"]),
        a["groups"],
    )
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    # NOTE: with symbolic sizes, the weight is prepacked for a representative input size: oneDNN
    # runs it for any size (reordering it again only where its chosen format differs)
    size = [int(d) if isinstance(d, int) else evaluate(from_dim(d), hints or {})
            for d in x.type.shape]  # fmt: skip
    reorder = torch.ops.mkldnn._reorder_convolution_weight
    weight = PreparedWeight(
        lambda w: reorder(w.contiguous(), padding, stride, dilation, groups, size),
        track_finite=True,
        reuse=reusable(node.inputs[1]),
        watch=watched(node.inputs[1]),
    )
    spelled = size if x.type.is_static else [str(d) for d in x.type.shape]
    key = _pack_key(node, padding, stride, dilation, groups, spelled)
    when = _prepare(weight, consts.get(node.inputs[1]), prepack, packs, key, node.id)
    cl = torch.channels_last if channels_last else torch.contiguous_format
    layout = "channels_last" if channels_last else "contiguous"
    detail = f"oneDNN conv2d {layout} (weight prepacked {when}; {NONFINITE_NOTE})"
    if weight.finite is False:
        detail += f"; the constant weight is not all finite: every call runs {EAGER_CONV}"
    op = torch.ops.mkldnn._convolution_pointwise
    attr, scalars, algorithm = _attr(ep)
    eager = _eager_conv(stride, padding, dilation, groups, ep, cl)
    if ep is not None and ep.other is not None:
        unary = ep.unary

        def with_add(x: Any, w: Any, b: Any, other: Any) -> Any:
            packed_w = weight(w)
            if not weight.finite:
                return eager(x, w, b, other)
            return conv_binary(x.contiguous(memory_format=cl), other.contiguous(memory_format=cl),
                               packed_w, b, padding, stride, dilation, groups, unary, scalars,
                               algorithm or None)  # fmt: skip

        return ExternCall(with_add, "conv", f"{detail} + fused {ep.describe()}", "oneDNN")
    default = op.default

    def fn(x: Any, w: Any, b: Any) -> Any:
        packed_w = weight(w)
        if not weight.finite:
            return eager(x, w, b, None)
        return default(x.contiguous(memory_format=cl), packed_w, b, padding, stride, dilation,
                       groups, attr, scalars, algorithm)  # fmt: skip

    suffix = f" + fused {ep.describe()}" if ep is not None else ""
    return ExternCall(fn, "conv", detail + suffix, "oneDNN")


# NOTE: a weight with an inf or NaN: oneDNN skips the zero padding where eager's default algorithm
# for a contiguous input multiplies it (0 * inf = NaN), so such a weight runs eager's dispatch.
EAGER_CONV = "aten.conv2d on a contiguous input, as eager does"
NONFINITE_NOTE = f"a weight with a non-finite value runs {EAGER_CONV}"
_EAGER_UNARY: dict[str, Callable[[torch.Tensor, str], torch.Tensor]] = {
    "sigmoid": lambda y, _: torch.sigmoid(y),
    "tanh": lambda y, _: torch.tanh(y),
    "swish": lambda y, _: torch.nn.functional.silu(y),
    "gelu": lambda y, algorithm: torch.nn.functional.gelu(y, approximate=algorithm or "none"),
}


def _eager_conv(
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    ep: Epilogue | None,
    layout: torch.memory_format,
) -> Callable[[Any, Any, Any, Any], Any]:
    """The conv (then the epilogue: add ``other``, then the activation) as eager computes it for
    a contiguous input, the result in ``layout`` (the fused call's)."""
    unary = None if ep is None or ep.unary is None else _EAGER_UNARY[ep.unary]
    algorithm = "" if ep is None else ep.algorithm

    def run(x: Any, w: Any, b: Any, other: Any) -> Any:
        y = torch.conv2d(x.contiguous(), w, b, stride, padding, dilation, groups)
        if other is not None:
            y = y + other
        if unary is not None:
            y = unary(y, algorithm)
        return y.contiguous(memory_format=layout)

    return run


def _prepare(
    weight: PreparedWeight,
    fixed: torch.Tensor | None,
    prepack: Prepacker | None,
    packs: PackedWeights | None,
    key: str,
    node: int | None = None,
) -> str:
    if fixed is None:
        if weight.plain is not None:
            return (
                "on first use, reused while identity and version hold; once written between "
                "calls, used unconverted"
            )
        return "on first use, reused while identity and version hold"
    note = ""
    if packs is not None:
        earlier = packs.made.get(key)
        packs.made[key] = (weight, fixed)
        if packs.load(key, weight, fixed, node):
            return LOADED
        if earlier is not None and earlier[0].source is fixed and earlier[0].value is not None:
            # NOTE: the same constant prepacked for another call of this node (a fused call
            # oneDNN refused): the same layout, no second reorder.
            weight.adopt(fixed, earlier[0].value, keep=earlier[0].keep)
            return "at compile time"
        if key in packs.unusable:
            note = f"; the entry's bytes were unusable: {packs.unusable[key]}"
    if prepack is not None:
        weight.pending = prepack(lambda: weight.prepare(fixed))
        return f"at load, in the background (the first use waits for it){note}"
    weight(fixed)
    return "at compile time"


def onednn_call(
    node: Node,
    consts: Mapping[Any, torch.Tensor],
    ep: Epilogue | None,
    channels_last: bool = True,
    prepack: Prepacker | None = None,
    packs: PackedWeights | None = None,
    mkl_linear: bool = False,
    hints: Mapping[str, int] | None = None,
    weight: PreparedWeight | None = None,
) -> ExternCall:
    """The oneDNN call of a conv2d or linear ``node`` with epilogue ``ep``; ``channels_last``:
    convolutions convert their activations to channels_last (else to contiguous NCHW);
    ``prepack``: where the constant weight's prepacking runs (None: here, now); ``packs``: the
    plan's prepacked weights (saved ones are loaded, not reordered; new ones are recorded);
    ``mkl_linear``: a float32 linear without ``ep`` runs MKL's packed GEMM (:func:`runs_mkl`);
    ``hints``: representative values of the symbols of symbolic shapes (weights are prepacked
    for those sizes); ``weight``: a linear's, as in :func:`linear_call`."""
    if node.op == "linear":
        args = (channels_last, prepack, packs, mkl_linear, hints, weight)
        return linear_call(node, consts, ep, *args)
    return conv_call(node, consts, ep, channels_last, prepack, packs, hints)
