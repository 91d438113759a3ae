"""Extern calls: heavy ops whose best CPU kernels PyTorch already has.

Each rule turns an IR node into a plain callable over the node's operands (tensors, literals,
None for an absent optional tensor), with the attributes bound, calling the ATen op directly.
The op class names the contract row a conformance check of that node uses.

Float32 and bfloat16 convolution and linear go through oneDNN with prepacked weights and fused
epilogues instead (:mod:`plait.codegen.onednn`); the rules here cover the rest.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> a = gb.input("a", TensorType((2, 3), torch.float32))
    >>> w = gb.input("w", TensorType((4, 3), torch.float32))
    >>> y = gb.call("linear", a, w)
    >>> call = make_call(y.producer)
    >>> call.fn(torch.ones(2, 3), torch.ones(4, 3), None).shape
    torch.Size([2, 4])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import torch

from plait.codegen import causal_attention
from plait.codegen.cuda_batch_norm import batch_norm_call
from plait.codegen.extern_call import ExternCall
from plait.codegen.pool_layout import channels_last_pool
from plait.guards.sampled import values_now
from plait.ir.graph import Node, Value
from plait.ir.types import TensorType

Consts = Mapping[Any, torch.Tensor]


def reusable(w: object) -> bool:
    """Whether a weight operand's prepared copy may be reused while the tensor's identity and
    version counter hold: a graph input or a constant, whose contents change only through
    PyTorch (which counts the writes). A weight the program computes is rewritten at every call
    in a buffer the plan reuses, by kernels PyTorch does not see: the same tensor at the same
    version with new values, so it is prepared again at every call."""
    return isinstance(w, Value) and w.producer is None


def watched(w: object) -> bool:
    """Whether a reusable weight operand is the caller's tensor (a graph input, not a constant
    the compiler owns and guards), whose prepared copy is then also checked against sampled
    elements of it (:func:`written`'s ``watch``)."""
    return isinstance(w, Value) and w.producer is None and w.kind != "const"


def written(w: torch.Tensor, watch: bool = False) -> tuple[int, int, bytes | None]:
    """What says ``w``'s contents may have changed while it stays the same tensor: its version
    counter, its address (``w.data = other`` gives it other memory and bumps no counter) and,
    with ``watch``, its first elements (a write through ``w.data`` bumps no counter
    of ``w``: :mod:`plait.guards.sampled`; NOTE: one that changes none of them is not seen).

    Example:
        >>> import torch
        >>> w = torch.ones(2)
        >>> before = written(w)
        >>> w.data = torch.zeros(2)
        >>> written(w) != before
        True
        >>> before = written(w, watch=True)
        >>> _ = w.data.add_(1)
        >>> written(w) == before[:2] + (None,), written(w, watch=True) != before
        (True, True)

    An inference tensor (made under ``torch.inference_mode()``) has no version counter: -1
    stands for it, and :class:`PreparedWeight` prepares such a weight at every call.
    """
    version = -1 if w.is_inference() else w._version
    return version, w.data_ptr(), values_now(w) if watch else None


class PreparedWeight:
    """A weight in the layout an extern wants, rebuilt when the source tensor is replaced or
    written in place (identity, version counter and address, and with ``watch`` the first
    elements: :func:`written`), and at every call where it is not ``reuse``-able
    (:func:`reusable`).

    ``plain``, where the extern also takes the weight as it is: what a weight that changes
    between calls is given instead of a conversion at every call. A training step's optimizer
    writes every weight in place, and converting the weight again before each forward cost
    more than the library's use of the plain weight (oneDNN's linear: 0.2-0.3 ms more per
    call at the GPT-2 block's shapes, one thread). Such a weight is seen when the source
    tensor of the last conversion comes back written (its version counter moved), or when it
    is not ``reuse``-able at all; from then on this weight stays plain."""

    def __init__(
        self,
        convert: Callable[[torch.Tensor], torch.Tensor],
        track_finite: bool = False,
        portable: bool = True,
        reuse: bool = True,
        plain: Callable[[torch.Tensor], torch.Tensor] | None = None,
        watch: bool = False,
    ) -> None:
        self.convert = convert
        self.reuse = reuse
        self.watch = watch
        self.plain = plain
        # NOTE: set once the weight was seen changing between calls (see the class docstring)
        self.varies = plain is not None and not reuse
        # NOTE: whether the converted bytes read the same on another CPU (oneDNN's carry their
        # descriptor); a cache entry saves only portable ones.
        self.portable = portable
        # NOTE: with ``track_finite``, ``finite`` says whether the source holds only finite
        # values (read once per identity and version, with the conversion): a convolution whose
        # weight is not all finite runs eager's algorithm (oneDNN skips zero padding; eager's
        # default algorithm multiplies it, 0 * inf = NaN). None: not read (yet).
        self.track_finite = track_finite
        self.finite: bool | None = None
        self.source: torch.Tensor | None = None
        # NOTE: the source's version counter and address when converted: ``w.data = other``
        # (and ``set_``) replace its memory and may bump no version counter
        self.version: tuple[int, int, bytes | None] = (-1, 0, None)
        self.value: torch.Tensor | None = None
        # NOTE: a prepacking started elsewhere (a thread of the rebuild's pool); the first use
        # waits for it (and re-raises its failure) before reading the fields it sets.
        self.pending: Future[None] | None = None
        # NOTE: memory the value reads without owning (an imported prepacked weight's bytes).
        self.keep: torch.Tensor | None = None

    def adopt(
        self,
        w: torch.Tensor,
        value: torch.Tensor,
        keep: torch.Tensor | None,
        finite: bool | None = None,
    ) -> None:
        """Take ``value`` (read from ``keep``'s memory) as ``w`` converted, unconverted;
        ``finite``: whether ``w`` is all finite, if known (a cache entry's record, for the very
        bytes its key hashed), else read here."""
        self.value, self.keep = value, keep
        self.source, self.version = w, written(w, self.watch)
        if finite is None or not self.track_finite:
            self._read_finite(w)
        else:
            self.finite = finite

    def prepare(self, w: torch.Tensor) -> None:
        """Convert ``w`` now (what a pending prepacking runs)."""
        self.value, self.keep = self.convert(w), None
        self.source, self.version = w, written(w, self.watch)
        self._read_finite(w)

    def _read_finite(self, w: torch.Tensor) -> None:
        if self.track_finite:
            self.finite = bool(torch.isfinite(w).all())

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()
        if self.varies:
            assert self.plain is not None
            return self.plain(w)
        now = written(w, self.watch)
        # NOTE: version -1, an inference tensor: written in place with no counter to say so
        stale = w is not self.source or now[0] < 0 or now != self.version or self.value is None
        if stale and self.plain is not None and w is self.source and self.value is not None:
            # NOTE: the converted tensor's own source, written since: it changes between calls
            self.varies, self.value, self.keep = True, None, None
            return self.plain(w)
        if stale or not self.reuse:
            self.prepare(w)
        assert self.value is not None
        return self.value


def _conv2d(n: Node, consts: Consts) -> ExternCall:
    """Convolutions of dtypes oneDNN's fused path does not take (float64, float16)."""
    a = n.attrs
    stride, padding, dilation, groups = a["stride"], a["padding"], a["dilation"], a["groups"]
    conv = torch.conv2d

    def fn(x: Any, w: Any, b: Any) -> Any:
        return conv(x, w, b, stride, padding, dilation, groups)

    return ExternCall(fn, "conv", "aten.conv2d")


def _linear(n: Node, consts: Consts) -> ExternCall:
    return ExternCall(torch._C._nn.linear, "matmul", "aten.linear")


def _matmul(n: Node, consts: Consts) -> ExternCall:
    return ExternCall(torch.matmul, "matmul", "aten.matmul")


def _bmm(n: Node, consts: Consts) -> ExternCall:
    return ExternCall(torch.bmm, "matmul", "aten.bmm")


def _sdpa(n: Node, consts: Consts) -> ExternCall:
    a = n.attrs
    sdpa = torch._C._nn.scaled_dot_product_attention
    dropout_p, is_causal, scale = a["dropout_p"], a["is_causal"], a["scale"]
    gqa = a["enable_gqa"]
    if causal_attention.applies(n):
        detail = (
            f"aten._scaled_dot_product_flash_attention_for_cpu (causal, in blocks of "
            f"{causal_attention.ROWS} query rows at {causal_attention.MIN_LEN}-"
            f"{causal_attention.MAX_LEN} tokens)"
        )
        return ExternCall(causal_attention.causal_in_row_blocks(scale), "attention", detail)

    def fn(q: Any, k: Any, v: Any, mask: Any) -> Any:
        return sdpa(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=gqa)

    return ExternCall(fn, "attention", "aten.scaled_dot_product_attention")


def _embedding(n: Node, consts: Consts) -> ExternCall:
    pad = n.attrs["padding_idx"]
    pad = -1 if pad is None else pad

    def fn(indices: Any, weight: Any) -> Any:
        return torch.embedding(weight, indices, pad)

    return ExternCall(fn, "data_movement", "aten.embedding")


def _index_select(n: Node, consts: Consts) -> ExternCall:
    dim = n.attrs["dim"]

    def fn(x: Any, index: Any) -> Any:
        return torch.index_select(x, dim, index)

    return ExternCall(fn, "data_movement", "aten.index_select")


def _cumsum(n: Node, consts: Consts) -> ExternCall:
    dim, dtype = n.attrs["dim"], n.attrs["dtype"]
    return ExternCall(
        lambda x: torch.cumsum(x, dim, dtype=dtype), "reduction", "aten.cumsum (a scan)"
    )


def _max_pool2d(n: Node, consts: Consts) -> ExternCall:
    a = n.attrs
    k, s, p, d, c = (
        a["kernel_size"],
        a["stride"] or a["kernel_size"],
        a["padding"],
        a["dilation"],
        a["ceil_mode"],
    )
    pool = channels_last_pool(torch.max_pool2d)

    def fn(x: Any) -> Any:
        return pool(x, k, s, p, d, c)

    return ExternCall(fn, "data_movement", "aten.max_pool2d")


def _avg_pool2d(n: Node, consts: Consts) -> ExternCall:
    a = n.attrs
    k, s, p = a["kernel_size"], a["stride"] or a["kernel_size"], a["padding"]
    c, inc, div = a["ceil_mode"], a["count_include_pad"], a["divisor_override"]
    pool = torch._C._nn.avg_pool2d

    def fn(x: Any) -> Any:
        return pool(x, k, s, p, c, inc, div)

    return ExternCall(fn, "reduction", "aten.avg_pool2d")


def _adaptive_avg_pool2d(n: Node, consts: Consts) -> ExternCall:
    size = n.attrs["output_size"]
    pool = torch._C._nn.adaptive_avg_pool2d

    def fn(x: Any) -> Any:
        return pool(x, size)

    return ExternCall(fn, "reduction", "aten.adaptive_avg_pool2d")


def _aten_op_class(op: torch._ops.OpOverload) -> str:
    """The contract row of an ATen extern: PyTorch's own kernel, judged as its kind of op."""
    if torch.Tag.pointwise in op.tags:
        return "pointwise"
    if op._schema.name.endswith("_copy"):
        return "data_movement"
    return "reduction"


def _aten(n: Node, consts: Consts) -> ExternCall:
    """A typed ATen node: its ``OpOverload`` called directly (``aten.<name>`` in the evidence).
    The operands arrive as the variadic param's list (none for ``aten_factory``)."""
    from plait.ir.ops.aten import bind_call
    from plait.ir.ops.aten_overloads import resolve_overload

    a = n.attrs
    name, overload = a["name"], a["overload"]
    call = bind_call(name, overload, a["literals"], a["kwliterals"], len(n.inputs))
    op_class = _aten_op_class(resolve_overload(name, overload))
    detail = f"aten.{name}" + ("" if overload == "default" else f".{overload}")
    if n.op == "aten_factory":
        return ExternCall(lambda: call([]), op_class, detail)
    if name == "max_pool2d_with_indices" and overload == "default":
        pool = channels_last_pool(lambda x: call([x]))
        return ExternCall(lambda args: pool(*args), op_class, detail)
    return ExternCall(call, op_class, detail)


def _aten_check(n: Node, consts: Consts) -> ExternCall:
    """A runtime check (``_linalg_check_errors``): PyTorch's kernel raises eager's error on bad
    values; the node's result is a token."""
    from plait.ir.ops.aten import bind_check

    a = n.attrs
    name, overload = a["name"], a["overload"]
    call = bind_check(name, overload, a["literals"], a["kwliterals"], len(n.inputs))
    detail = f"aten.{name}" + ("" if overload == "default" else f".{overload}")
    return ExternCall(call, "data_movement", detail)


def _torch_vjp(n: Node, consts: Consts) -> ExternCall:
    """Gradients from PyTorch's autograd over an op's reference (``plait.ir.ops.vjp``): the
    operands arrive as the variadic param's list."""
    from plait.ir.ops import get_op

    ref, attrs = get_op("torch_vjp").reference, dict(n.attrs)
    single = len(n.outputs) == 1  # NOTE: the runner takes a one-output node's tensor as such

    def call(args: list[Any]) -> Any:
        out = ref(args, **attrs)
        return out[0] if single else out

    return ExternCall(call, "reduction", f"torch autograd of {attrs['of']}")


def _binary_aten(name: str) -> Callable[[Node, Consts], ExternCall]:
    fn = getattr(torch, name)

    def rule(n: Node, consts: Consts) -> ExternCall:
        return ExternCall(lambda a, b: fn(a, b), "pointwise", f"aten.{name}")

    return rule


# NOTE: pointwise ops Stax runs through ATen for floating results: glibc's exact fmod has no
# vector form, so the generated loop ran 14-20x slower than ATen's (integer ones stay native).
FLOAT_EXTERNS = frozenset({"fmod", "remainder"})
# NOTE: the smallest kept inner block an outer sum runs through ATen for (see outer_sum)
OUTER_SUM_MIN_INNER = 64


def outer_sum(n: Node) -> bool:
    """A float ``sum`` over leading dims only, keeping an inner block of at least
    OUTER_SUM_MIN_INNER elements (a bias gradient): Stax's reduction templates walk each output's
    column with a stride, 17x slower than ATen's vectorized column sum at 512 x 1024, so ATen
    runs it. The summed dims may be symbolic (a batch, a sequence), the kept ones are static."""
    if n.op != "sum" or n.attrs.get("dtype") is not None:
        return False
    x = n.inputs[0]
    t = getattr(x, "type", None)
    if not isinstance(t, TensorType) or not t.dtype.is_floating_point:
        return False
    dims = n.attrs.get("dims")
    if not dims or not t.rank:
        return False
    axes = sorted({int(d) % t.rank for d in dims})
    if axes != list(range(len(axes))) or len(axes) == t.rank:
        return False
    if not all(isinstance(d, int) for d in t.shape[len(axes) :]):
        return False
    inner = 1
    for d in t.shape[len(axes) :]:
        inner *= int(d)
    return inner >= OUTER_SUM_MIN_INNER


def _sum(n: Node, consts: Consts) -> ExternCall:
    dims, keepdim = tuple(n.attrs["dims"]), bool(n.attrs["keepdim"])
    return ExternCall(
        lambda x: torch.sum(x, dims, keepdim=keepdim), "reduction", "aten.sum (outer dims)"
    )


def _batch_norm_relu(n: Node, consts: Consts) -> ExternCall:
    """A training batch norm fused with its ReLU (``fuse-bn-relu``): plait's Triton kernels
    where they take the call, else ATen's kernel and the ReLU (codegen.cuda_batch_norm)."""
    call = batch_norm_call(n)
    assert call is not None  # NOTE: a fused node always gets a call, ATen's at least
    return call


EXTERN_RULES: dict[str, Callable[[Node, Consts], ExternCall]] = {
    "fmod": _binary_aten("fmod"),
    "remainder": _binary_aten("remainder"),
    "aten": _aten,
    "aten_factory": _aten,
    "aten_check": _aten_check,
    "batch_norm_relu": _batch_norm_relu,
    "batch_norm_relu_backward": _batch_norm_relu,
    "torch_vjp": _torch_vjp,
    "sum": _sum,  # NOTE: outer sums only (outer_sum); the others are native reductions
    "conv2d": _conv2d,
    "linear": _linear,
    "matmul": _matmul,
    "bmm": _bmm,
    "scaled_dot_product_attention": _sdpa,
    "embedding": _embedding,
    "index_select": _index_select,
    "cumsum": _cumsum,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "adaptive_avg_pool2d": _adaptive_avg_pool2d,
}


def make_call(node: Node, consts: Consts | None = None) -> ExternCall:
    """The extern call for ``node`` (an op in :data:`EXTERN_RULES`); ``consts`` maps the graph's
    constant inputs to their values (weights that can be prepared at compile time)."""
    return EXTERN_RULES[node.op](node, consts or {})
