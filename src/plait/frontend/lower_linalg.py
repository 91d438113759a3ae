"""Capture rules that write PyTorch's composite linear-algebra calls as plait's own ops.

``einsum``, ``baddbmm``, ``addbmm``, ``addmv``, ``addr``, ``outer``/``ger``, ``mv``, ``diff`` and
``rms_norm`` have no IR op of their own: each is written with the ops PyTorch itself reduces it to
(permutes, reshapes, ``bmm``/``matmul``, sums, elementwise arithmetic), so the matrix products run
as extern kernels and the elementwise rest fuses. A form a rule does not cover raises
:class:`~plait.frontend.table.NoIROp` before emitting anything (the call then becomes an opaque
node, announced): einsum's sublist form, repeated indices within one operand (a diagonal),
broadcasting of size-1 dims, integer operands of products, scaled forms whose BLAS semantics
(``beta=0`` ignores NaN in ``input``) need care.

Example:
    >>> import torch, plait
    >>> f = plait.compile(lambda a, b: torch.einsum("bij,bjk->bik", a, b), backend="eager")
    >>> a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    >>> torch.allclose(f(a, b), a @ b, atol=1e-6)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from plait.frontend.symints import is_intlike
from plait.frontend.table import NoIROp, Viewed, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep
from plait.ir import TensorType, Value

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _type(cx: CaptureContext, t: Any) -> TensorType:
    ty = cx.value(t).type
    if not isinstance(ty, TensorType):
        raise NoIROp(f"expected a tensor operand, got {ty}")
    return ty


def _static(cx: CaptureContext, t: Any, what: str) -> tuple[int, ...]:
    shape = _type(cx, t).shape
    if not all(isinstance(d, int) for d in shape):
        raise NoIROp(f"{what} with symbolic sizes has no IR op")
    return tuple(int(d) for d in shape)


def _floats(cx: CaptureContext, what: str, *ts: Any) -> None:
    dtypes = {_type(cx, t).dtype for t in ts}
    if len(dtypes) != 1 or not dtypes <= set(FLOATS):
        raise NoIROp(f"{what} of {sorted(map(str, dtypes))} operands has no IR op")


def _scale(x: Any) -> float | None:
    """A Python number as a float (None for anything else: a tensor scale has no IR form)."""
    return float(x) if type(x) in (int, float, bool) else None


def _blas(cx: CaptureContext, what: str, input: Any, product: Value, beta: Any, alpha: Any) -> Any:
    """``beta * input + alpha * product`` with BLAS's rule: ``beta == 0`` ignores ``input``
    (NaN there does not propagate)."""
    b, a = _scale(beta), _scale(alpha)
    if b is None or a is None:
        raise NoIROp(f"{what} with a tensor beta or alpha has no IR op")
    if a != 1:
        product = cx.call("mul", product, cx.operand(a))
    if b == 0:
        return product
    term = cx.value(input) if b == 1 else cx.call("mul", cx.value(input), cx.operand(b))
    return cx.call("add", term, product, alpha=1)


def _blas_rule(name: str, product: Callable[[CaptureContext, Value, Value], Value]) -> Any:
    """The rule of ``torch.<name>(input, a, b, *, beta, alpha)``."""

    def rule(
        cx: CaptureContext, out: Any, input: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1
    ) -> Any:
        _floats(cx, name, input, a, b)
        return _blas(cx, name, input, product(cx, cx.value(a), cx.value(b)), beta, alpha)

    return rule


def _summed_bmm(cx: CaptureContext, a: Value, b: Value) -> Value:
    v: Value = cx.call("sum", cx.call("bmm", a, b), dims=(0,), keepdim=False, dtype=None)
    return v


op(torch.baddbmm, torch.Tensor.baddbmm)(
    _blas_rule("baddbmm", lambda cx, a, b: cx.call("bmm", a, b))
)
op(torch.addbmm, torch.Tensor.addbmm)(_blas_rule("addbmm", _summed_bmm))
op(torch.addmv, torch.Tensor.addmv)(_blas_rule("addmv", lambda cx, a, b: cx.call("matmul", a, b)))


@op(torch.mv, torch.Tensor.mv)
def _mv(cx: CaptureContext, out: Any, mat: Any, vec: Any) -> Any:
    _floats(cx, "mv", mat, vec)
    return cx.call("matmul", cx.value(mat), cx.value(vec))


def _outer_product(cx: CaptureContext, a: Value, b: Value) -> Value:
    """``a[:, None] * b[None, :]``: one product per element, as eager's."""
    if any(not isinstance(v.type, TensorType) or v.type.rank != 1 for v in (a, b)):
        raise NoIROp("outer of operands that are not vectors")
    column = cx.call("unsqueeze", a, dim=1)
    row = cx.call("unsqueeze", b, dim=0)
    v: Value = cx.call("mul", column, row)
    return v


@op(torch.outer, torch.Tensor.outer, torch.ger, torch.Tensor.ger)
def _outer(cx: CaptureContext, out: Any, a: Any, b: Any) -> Any:
    return _outer_product(cx, cx.value(a), cx.value(b))


op(torch.addr, torch.Tensor.addr)(_blas_rule("addr", lambda cx, a, b: _outer_product(cx, a, b)))


# --- diff ------------------------------------------------------------------------------------
@op(torch.diff, torch.Tensor.diff)
def _diff(
    cx: CaptureContext,
    out: Any,
    x: Any,
    n: Any = 1,
    dim: Any = -1,
    prepend: Any = None,
    append: Any = None,
) -> Any:
    """``x[1:] - x[:-1]`` along ``dim``, ``n`` times (``!=`` for bool), after concatenating
    ``prepend`` and ``append``: what eager computes."""
    n, rank = cx.int(n), _type(cx, x).rank
    if n < 1 or rank == 0:
        raise NoIROp("diff with n < 1 or of a 0-d tensor")
    d = cx.int(dim) % rank
    parts = [p for p in (prepend, x, append) if p is not None]
    if any(not isinstance(cx.operand(p), Value) for p in parts):
        raise NoIROp("diff with a scalar prepend or append")
    v = cx.value(x)
    if len(parts) > 1:
        v = cx.call("cat", [cx.value(p) for p in parts], dim=d)
    boolean = _type(cx, x).dtype == torch.bool
    for _ in range(n):
        later = cx.call("slice", v, dim=d, start=1, end=None, step=1)
        earlier = cx.call("slice", v, dim=d, start=0, end=-1, step=1)
        v = cx.call("ne", later, earlier) if boolean else cx.call("sub", later, earlier, alpha=1)
    return v


# --- rms_norm --------------------------------------------------------------------------------
if hasattr(F, "rms_norm"):

    @op(F.rms_norm, torch.rms_norm)
    def _rms_norm(
        cx: CaptureContext,
        out: Any,
        x: Any,
        normalized_shape: Any,
        weight: Any = None,
        eps: Any = None,
    ) -> Any:
        """PyTorch's reference: in float (float64 stays float64), ``x * rsqrt(mean(x**2) +
        eps) * weight``, then back to ``x``'s dtype."""
        ty = _type(cx, x)
        if ty.dtype not in FLOATS:
            raise NoIROp(f"rms_norm of {ty.dtype}")
        shape = (normalized_shape,) if is_intlike(normalized_shape) else normalized_shape
        count = len(tuple(shape))
        if count == 0 or count > ty.rank:
            raise NoIROp("rms_norm over no dims, or more dims than the input has")
        compute = torch.float64 if ty.dtype == torch.float64 else torch.float32
        if eps is None:
            eps = torch.finfo(compute).eps
        v = cx.value(x)
        if ty.dtype != compute:
            v = cx.call("to_dtype", v, dtype=compute)
        dims = tuple(range(ty.rank - count, ty.rank))
        square = cx.call("pow", v, cx.operand(2))
        mean = cx.call("mean", square, dims=dims, keepdim=True, dtype=None)
        shifted = cx.call("add", mean, cx.operand(float(eps)), alpha=1)
        result = cx.call("mul", v, cx.call("rsqrt", shifted))
        if weight is not None:
            result = cx.call("mul", result, cx.value(weight))
        if _dtype(result) != ty.dtype:
            result = cx.call("to_dtype", result, dtype=ty.dtype)
        return result


def _dtype(v: Value) -> torch.dtype:
    assert isinstance(v.type, TensorType)
    return v.type.dtype


# --- einsum ----------------------------------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's indices and the output's, with ``...`` spelled as fresh letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise NoIROp("einsum: the equation names another number of operands")
    used = set(eq) - {".", ",", "-", ">"}
    fresh = [c for c in _LETTERS if c not in used]
    ell_rank = max(
        (r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0
    )
    ellipsis = "".join(fresh[:ell_rank])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - len(t.replace("...", ""))
            if k != ell_rank:
                raise NoIROp("einsum: ellipses of different ranks (broadcasting)")
            t = t.replace("...", ellipsis)
        if len(t) != r or not t.isalpha():
            raise NoIROp(f"einsum: term {t!r} does not fit an operand of rank {r}")
        if len(set(t)) != len(t):
            raise NoIROp("einsum: an index repeated within one operand (a diagonal)")
        out_terms.append(t)
    if arrow:
        output = rhs.replace("...", ellipsis)
    else:
        counts = {c: "".join(out_terms).count(c) for c in set("".join(out_terms))}
        output = ellipsis + "".join(
            sorted(c for c, k in counts.items() if k == 1 and c not in ellipsis)
        )
    if not output.isalpha() and output:
        raise NoIROp(f"einsum: output {output!r}")
    return out_terms, output


class _Operand:
    def __init__(self, value: Value, indices: str, sizes: dict[str, int]) -> None:
        self.value, self.indices, self.sizes = value, indices, sizes


def _sum_out(cx: CaptureContext, a: _Operand, keep: set[str]) -> _Operand:
    """Sum ``a`` over its indices that nothing later needs."""
    drop = tuple(i for i, c in enumerate(a.indices) if c not in keep)
    if not drop:
        return a
    v = cx.call("sum", a.value, dims=drop, keepdim=False, dtype=None)
    return _Operand(v, "".join(c for c in a.indices if c in keep), a.sizes)


def _arrange(cx: CaptureContext, a: _Operand, order: str) -> Value:
    if a.indices == order:
        return a.value
    v: Value = cx.call("permute", a.value, dims=tuple(a.indices.index(c) for c in order))
    return v


def _contract(cx: CaptureContext, a: _Operand, b: _Operand, keep: set[str]) -> _Operand:
    """The product of two operands over the indices they share and ``keep`` does not name,
    as one ``bmm``: ``[batch, left, shared] x [batch, shared, right]``."""
    a, b = _sum_out(cx, a, keep | set(b.indices)), _sum_out(cx, b, keep | set(a.indices))
    batch = "".join(c for c in a.indices if c in b.indices and c in keep)
    shared = "".join(c for c in a.indices if c in b.indices and c not in keep)
    left = "".join(c for c in a.indices if c not in b.indices)
    right = "".join(c for c in b.indices if c not in a.indices)
    sizes = a.sizes

    def numel(idx: str) -> int:
        return math.prod(sizes[c] for c in idx)

    lhs = cx.call("reshape", _arrange(cx, a, batch + left + shared),
                  shape=(numel(batch), numel(left), numel(shared)))  # fmt: skip
    rhs = cx.call("reshape", _arrange(cx, b, batch + shared + right),
                  shape=(numel(batch), numel(shared), numel(right)))  # fmt: skip
    # NOTE: with nothing contracted, one product per element, as eager multiplies (a GEMM
    # adds it to a zero accumulator: 0.0 + -0.0 is +0.0, eager's product keeps -0.0)
    product = cx.call("mul", lhs, rhs) if not shared else cx.call("bmm", lhs, rhs)
    indices = batch + left + right
    v = cx.call("reshape", product, shape=tuple(sizes[c] for c in indices))
    return _Operand(v, indices, sizes)


@op(torch.einsum)
def _einsum(cx: CaptureContext, out: Any, equation: Any, *operands: Any) -> Any:
    if not isinstance(equation, str):
        raise NoIROp("einsum's sublist form has no IR op")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise NoIROp("einsum of no operands")
    shapes = [_static(cx, t, "einsum") for t in operands]
    _floats(cx, "einsum", *operands)
    terms, output = _einsum_terms(equation, [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for t, shape in zip(terms, shapes):
        for c, n in zip(t, shape):
            if sizes.setdefault(c, n) != n:
                raise NoIROp("einsum: an index with different sizes (broadcasting)")
    if set(output) - set(sizes) or len(set(output)) != len(output):
        raise NoIROp(f"einsum: output {output!r} names an unknown or repeated index")
    if len(operands) == 1 and sorted(terms[0]) == sorted(output):
        # NOTE: eager returns a view of its operand here (a permute): so does the rule
        dims = tuple(terms[0].index(c) for c in output)
        v = cx.value(operands[0])
        step = ViewStep.of("permute", dims=dims)
        return Viewed(step.apply(cx, v), operands[0], (step,))
    ops = [_Operand(cx.value(t), term, sizes) for t, term in zip(operands, terms)]
    acc = _sum_out(cx, ops[0], set(output).union(*(o.indices for o in ops[1:])))
    for i, nxt in enumerate(ops[1:], start=1):
        later = set(output).union(*(o.indices for o in ops[i + 1 :]))
        acc = _contract(cx, acc, nxt, later)
    acc = _sum_out(cx, acc, set(output))
    return _arrange(cx, acc, output)
