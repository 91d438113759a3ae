"""Random well-typed IR graphs over the op registry, for the fuzzer.

A graph has a few user inputs (random shapes, dtypes and memory layouts: contiguous, permuted or
strided views) and parameters (fixed values the inference pipeline freezes and folds), then nodes
drawn from every category of the registry: pointwise ops with their attributes, reductions and
normalizations, views and movement, constants, and the extern ops (convolution, linear, matmul,
attention, pooling, gathers). Each node is typed by its op's own type rule and run once on a
sample by its reference implementation; a node either refuses is drawn again. Ops left out
are listed in :data:`EXCLUDED` with the reason.

Example:
    >>> case = generate(7)
    >>> case.graph.nodes != [] and len(case.draw(1)) == len(case.user)
    True
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.ir import Category, Graph, GraphBuilder, TensorType, Value, all_ops, get_op

EXCLUDED = {
    "aten": "an ATen call named by string: its operands follow the named overload",
    "aten_check": "an ATen call named by string",
    "aten_datadep": "data-dependent result sizes",
    "aten_factory": "an ATen call named by string",
    "torch_vjp": "a derivative node of the autograd layer",
    "opaque": "a PyTorch callable named by string",
    "random_call": "draws from PyTorch's generator",
    "random_factory": "draws from PyTorch's generator",
    "rng_get_state": "generator state",
    "rng_seed": "generator state",
    "rng_set_state": "generator state",
    "batch_norm_train": "writes running statistics (a training program)",
    "batch_norm_relu": "an ATen call named by string (a training program's, after fuse-bn-relu)",
    "batch_norm_relu_backward": "an ATen call named by string (a training program's backward)",
}
# NOTE: ops whose eager result is not a function of its inputs alone: the generator makes them
# graph outputs only (nothing reads them), where the gate's value comparison holds
LEAF_ONLY = {
    "softshrink": "eager's sign of zero inside the band depends on the element's position "
    "(ATen's vector loop writes +0, its scalar tail x * 0): a reciprocal of it differs by sign",
}
# NOTE: ops that read the sign bit of a NaN, which no kernel defines (libm's log of a negative
# number may be +NaN or -NaN): their sign operand is a graph input (finite by construction)
NAN_SIGN = {"copysign": 1, "signbit": 0}
# NOTE: ops that are discontinuous in their floating operands (a comparison, a rounding, a
# remainder): two correct programs whose inputs to them differ by a rounding give answers that
# differ by a whole step, which no tolerance covers. They read only *exact* values: inputs,
# data movement of exact values, and ops on exact values whose result is exactly determined.
DISCONTINUOUS = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
     "logical_not", "round", "floor", "ceil", "trunc", "frac", "sign", "remainder", "fmod",
     "hardshrink", "threshold", "count_nonzero", "all", "any", "tril", "triu"}
)  # fmt: skip
_EXACT_OPS = frozenset({"neg", "abs", "relu", "maximum", "minimum", "fmax", "fmin", "where",
                        "clamp", "isfinite", "isinf", "isnan", "isneginf", "isposinf"})  # fmt: skip
# NOTE: integer ops whose second operand must be nonzero (or nonnegative): a fresh draw could
# make a computed one zero, and the reference then raises (integer division by zero)
_INT_DIVISORS = frozenset({"remainder", "fmod", "div", "pow"})
_FLOATS = (torch.float32, torch.float32, torch.float32, torch.float64, torch.bfloat16,
           torch.float16)  # fmt: skip
_INTS = (torch.int64, torch.int32)
_LITERALS = (-2.5, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0, 0.25)


@dataclass
class InputSpec:
    """How the fuzzer draws one user input: shape, dtype, the integer range and the layout
    (``contiguous``, ``permuted``: a permutation of a dense tensor, ``strided``: every second
    element of the last dim)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    low: int = -4
    high: int = 5
    layout: str = "contiguous"

    def draw(self, gen: torch.Generator) -> torch.Tensor:
        shape = self.shape
        if self.layout == "strided" and shape:
            shape = (*shape[:-1], shape[-1] * 2)
        perm = list(range(len(shape)))
        if self.layout == "permuted" and len(shape) > 1:
            perm = perm[::-1]
            shape = tuple(shape[i] for i in perm)
        if self.dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=gen).bool()
        elif self.dtype.is_floating_point:
            t = torch.randn(shape, generator=gen).to(self.dtype)
        else:
            t = torch.randint(self.low, self.high, shape, generator=gen).to(self.dtype)
        if self.layout == "permuted" and len(shape) > 1:
            t = t.permute(*perm)
        if self.layout == "strided" and shape:
            t = t[..., ::2]
        return t


@dataclass
class FuzzCase:
    """A generated graph, its user inputs (``user``: how each is drawn) and its parameters
    (fixed values, by name)."""

    seed: int
    graph: Graph
    user: list[InputSpec]
    params: dict[str, torch.Tensor]
    ops: list[str] = field(default_factory=list)

    def draw(self, seed: int) -> list[torch.Tensor]:
        """Fresh user inputs (never all zeros: floats are normal draws)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + seed)
        return [spec.draw(gen) for spec in self.user]

    def inputs(self, user_values: list[Any]) -> list[Any]:
        """The graph's input values, in its input order: user values, then parameters."""
        by_name = {s.name: x for s, x in zip(self.user, user_values)}
        return [by_name[v.name] if v.name in by_name else self.params[v.name]
                for v in self.graph.inputs]  # fmt: skip


class _Refused(Exception):
    pass


class _Builder:
    def __init__(self, rng: random.Random, seed: int) -> None:
        self.rng = rng
        self.b = GraphBuilder()
        self.samples: dict[str, Any] = {}
        self.values: list[Value] = []
        self.user: list[InputSpec] = []
        self.params: dict[str, torch.Tensor] = {}
        self.gen = torch.Generator().manual_seed(seed)
        self.count = 0
        self.exact: set[str] = set()  # NOTE: values two correct programs compute bit for bit

    # --- inputs ---------------------------------------------------------------------------
    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = self.rng.choice((1, 2, 2, 3, 3, 4)) if rank is None else rank
        return tuple(self.rng.choice((1, 2, 3, 4, 5, 6, 8)) for _ in range(rank))

    def user_input(self, shape: tuple[int, ...], dtype: torch.dtype, low: int = -4,
                   high: int = 5) -> Value:  # fmt: skip
        name = f"x{self.count}"
        self.count += 1
        layout = self.rng.choice(("contiguous", "contiguous", "permuted", "strided"))
        spec = InputSpec(name, shape, dtype, low, high, layout)
        v = self.b.input(name, TensorType(shape, dtype))
        self.user.append(spec)
        self.samples[name] = spec.draw(self.gen)
        self.exact.add(name)
        self.values.append(v)
        return v

    def param(self, shape: tuple[int, ...], dtype: torch.dtype, positive: bool = False) -> Value:
        name = f"p{self.count}"
        self.count += 1
        t = torch.randn(shape, generator=self.gen).to(dtype)
        if positive:
            t = t.abs() + 0.5
        v = self.b.param(name, TensorType(shape, dtype))
        self.params[name] = t
        self.samples[name] = t
        self.exact.add(name)
        return v

    # --- nodes ----------------------------------------------------------------------------
    def call(self, op: str, *operands: Any, **attrs: Any) -> Any:
        """Append ``op``, typed by its rule and run on the samples; refused otherwise."""
        before = len(self.b.graph.nodes)
        try:
            out = self.b.call(op, *operands, **attrs)
        except Exception as exc:  # NOTE: a type rule refusing these operands or attributes
            raise _Refused(str(exc)) from exc
        node = self.b.graph.nodes[-1]
        exact = self._exact_operands(node)
        if exact is None:
            self._drop(before)
            raise _Refused("an inexact value would reach an op that amplifies its rounding")
        args = [self.samples[o.name] if isinstance(o, Value) else o for o in node.inputs]
        try:
            with warnings.catch_warnings():
                # NOTE: a reference that warns (var with no degrees of freedom) is refused too
                warnings.simplefilter("error")
                results = get_op(op).run(args, dict(node.attrs))
        except Exception as exc:  # NOTE: the reference refuses these values
            self._drop(before)
            raise _Refused(str(exc)) from exc
        for v, r in zip(node.outputs, results):
            if not isinstance(r, torch.Tensor) or r.numel() > 4096 or r.numel() == 0:
                self._drop(before)
                raise _Refused("empty, scalar or large result")
            self.samples[v.name] = r
            if exact or _integral(v):
                self.exact.add(v.name)
        if op not in LEAF_ONLY:
            self.values.extend(node.outputs)
        return out

    def _exact_operands(self, node: Any) -> bool | None:
        """Whether ``node``'s results are exact (None: the node would amplify rounding).

        A discontinuous op, or one whose floating result is wider than a floating operand
        (float32 arithmetic judged by float64's row), needs exact floating operands."""
        floats = [v for v in node.input_values() if _is_float(v)]
        all_exact = all(v.name in self.exact for v in floats)
        widest = max((_width(v) for v in node.outputs if _is_float(v)), default=0)
        widened = any(_width(v) < widest for v in floats)
        if (node.op in DISCONTINUOUS or widened or _widens(node)) and not all_exact:
            return None
        category = get_op(node.op).category
        structural = category in (Category.VIEW, Category.CONSTANT)
        return all_exact and (structural or node.op in _EXACT_OPS or node.op in DISCONTINUOUS)

    def _drop(self, count: int) -> None:
        del self.b.graph.nodes[count:]

    def mark(self) -> tuple[int, int, int, int, list[str]]:
        g = self.b.graph
        return len(g.nodes), len(g.inputs), len(self.values), len(self.user), list(self.params)

    def restore(self, mark: tuple[int, int, int, int, list[str]]) -> None:
        """Undo everything since ``mark`` (a family refused part-way)."""
        nodes, inputs, values, user, params = mark
        g = self.b.graph
        del g.nodes[nodes:], g.inputs[inputs:], self.values[values:], self.user[user:]
        self.params = {k: self.params[k] for k in params}

    def pick(self, where: Callable[[Value], bool] | None = None) -> Value:
        pool = [v for v in self.values if where is None or where(v)]
        if not pool:
            raise _Refused("no operand fits")
        recent = pool[-4:]
        return self.rng.choice(recent if self.rng.random() < 0.7 else pool)

    def literal(self, dtype: torch.dtype) -> Any:
        if dtype == torch.bool:
            return self.rng.random() < 0.5
        if dtype.is_floating_point:
            return self.rng.choice(_LITERALS)
        return self.rng.choice((1, 2, 3, -1))


def _t(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType)
    return v.type


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in _t(v).shape)


def _is_float(v: Value) -> bool:
    return _t(v).dtype.is_floating_point


def _integral(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and not (t.dtype.is_floating_point or t.dtype.is_complex)


def _width(v: Value) -> int:
    t = _t(v)
    # NOTE: bfloat16 and float16 round differently: neither holds the other
    return 3 if t.dtype == torch.bfloat16 else t.dtype.itemsize


def _widens(node: Any) -> bool:
    """A node that converts a float operand to another float (``to_dtype``, a reduction's
    dtype: judged by the wider row), or to an integer or bool (a truncation, discontinuous; and
    a NaN or an infinity converted to an integer is undefined, in C++ as in PyTorch)."""
    dtype = node.attrs.get("dtype")
    if not isinstance(dtype, torch.dtype):
        return False
    ins = [v for v in node.input_values() if _is_float(v)]
    return any(_t(v).dtype != dtype for v in ins)


def _broadcasts(a: Value, b: Value) -> bool:
    try:
        torch.broadcast_shapes(_shape(a), _shape(b))
    except RuntimeError:
        return False
    return True


# --- op families ---------------------------------------------------------------------------
def _pointwise(bd: _Builder, op: str) -> None:
    opdef = get_op(op)
    dtypes = set(opdef.dtypes)
    first = bd.pick(lambda v: _t(v).dtype in dtypes)
    operands: list[Any] = [first]
    for p in opdef.params[1:]:
        if p.kind == "tensor" or bd.rng.random() < 0.6:
            operands.append(bd.pick(lambda v: _t(v).dtype in dtypes and _broadcasts(first, v)))
        else:
            operands.append(bd.literal(_t(first).dtype))
    if op == "where":
        if not any(_t(v).dtype == torch.bool for v in bd.values):
            bd.call("gt", bd.pick(_is_float), 0.0)
        cond = bd.pick(lambda v: _t(v).dtype == torch.bool)
        a = bd.pick(lambda v: _broadcasts(cond, v) and _t(v).dtype != torch.bool)
        operands = [cond, a, bd.literal(_t(a).dtype)]
    if op in _INT_DIVISORS and _integral(first):
        operands[1] = bd.rng.choice((1, 2, 3))  # NOTE: a nonzero, nonnegative literal
    if op in NAN_SIGN:
        i = NAN_SIGN[op]
        if not isinstance(operands[i], Value) or operands[i].producer is not None:
            raise _Refused(f"{op} reads the sign of a NaN: its operand {i} must be an input")
    attrs: dict[str, Any] = {}
    for attr in opdef.attrs:
        if bd.rng.random() < 0.5 and not attr.required:
            continue
        attrs[attr.name] = _attr(bd, op, attr.name, attr.kind, attr.choices, first)
    bd.call(op, *operands, **attrs)


def _attr(bd: _Builder, op: str, name: str, kind: str, choices: Any, x: Value) -> Any:
    rng = bd.rng
    if choices:
        return rng.choice(choices)
    if name == "dtype":
        return rng.choice((torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16))
    if name in ("diagonal", "decimals"):
        return rng.choice((-1, 0, 1, 2))
    base = kind.rstrip("?")
    if base == "float":
        return rng.choice((0.01, 0.5, 1.0, 2.0, -1.0, 0.1))
    if base == "int":
        return rng.choice((0, 1, 2))
    if base == "bool":
        return rng.random() < 0.5
    if base == "scalar":
        if op == "clamp" and name == "max":
            return rng.choice((0.5, 1.0, 2.0))
        return rng.choice((-1.0, 0.0, 0.5, 1, 2))
    raise _Refused(f"no value for attribute {name} ({kind})")


def _dims(bd: _Builder, rank: int) -> tuple[int, ...]:
    k = bd.rng.randint(1, max(rank, 1))
    return tuple(sorted(bd.rng.sample(range(rank), k)))


def _reduction(bd: _Builder, op: str) -> None:
    rng = bd.rng
    x = bd.pick(lambda v: _t(v).dtype in get_op(op).dtypes and _t(v).rank >= 1)
    rank = _t(x).rank
    if op in ("softmax", "log_softmax"):
        bd.call(op, x, dim=rng.randrange(rank))
    elif op == "logsumexp":
        bd.call(op, x, dims=_dims(bd, rank), keepdim=rng.random() < 0.3)
    elif op == "var":
        bd.call(op, x, dims=_dims(bd, rank), correction=rng.choice((0, 1)))
    elif op == "layer_norm":
        k = rng.randint(1, rank)
        shape = _shape(x)[rank - k :]
        w = bd.param(shape, _t(x).dtype) if rng.random() < 0.7 else None
        bias = bd.param(shape, _t(x).dtype) if rng.random() < 0.7 else None
        bd.call(op, x, w, bias, normalized_shape=shape)
    elif op == "group_norm":
        x = bd.pick(lambda v: _is_float(v) and _t(v).rank >= 2 and _shape(v)[1] % 2 == 0)
        c = _shape(x)[1]
        bd.call(op, x, bd.param((c,), _t(x).dtype), bd.param((c,), _t(x).dtype),
                num_groups=rng.choice((1, 2)))  # fmt: skip
    elif op == "batch_norm":
        x = bd.pick(lambda v: _is_float(v) and _t(v).rank >= 2)
        c, dt = _shape(x)[1], _t(x).dtype
        bd.call(op, x, bd.param((c,), dt), bd.param((c,), dt), bd.param((c,), dt),
                bd.param((c,), dt, positive=True))  # fmt: skip
    elif op == "count_nonzero":
        bd.call(op, x, dims=_dims(bd, rank))
    else:
        dims = _dims(bd, rank) if rng.random() < 0.8 else None
        bd.call(op, x, dims=dims, keepdim=rng.random() < 0.3)


def _view(bd: _Builder, op: str) -> None:
    rng = bd.rng
    x = bd.pick(lambda v: _t(v).rank >= 1)
    shape, rank = _shape(x), _t(x).rank
    if op == "permute":
        order = list(range(rank))
        rng.shuffle(order)
        bd.call(op, x, dims=tuple(order))
    elif op == "transpose":
        bd.call(op, x, dim0=rng.randrange(rank), dim1=rng.randrange(rank))
    elif op in ("reshape", "view", "flatten"):
        if op == "flatten":
            start = rng.randrange(rank)
            bd.call(op, x, start_dim=start, end_dim=rng.randrange(start, rank))
            return
        n = math.prod(shape)
        first = rng.choice([d for d in range(1, n + 1) if n % d == 0])
        bd.call(op, x, shape=(first, n // first))
    elif op in ("squeeze", "unsqueeze"):
        if op == "unsqueeze":
            bd.call(op, x, dim=rng.randrange(rank + 1))
        else:
            ones = tuple(i for i, d in enumerate(shape) if d == 1)
            bd.call(op, x, dims=ones or None)
    elif op == "expand":
        new = tuple(rng.choice((2, 3)) if d == 1 else d for d in shape)
        bd.call(op, x, shape=(rng.choice((1, 2)), *new))
    elif op == "slice":
        dim = rng.randrange(rank)
        start = rng.randrange(shape[dim])
        bd.call(op, x, dim=dim, start=start, end=shape[dim], step=rng.choice((1, 2)))
    elif op == "select":
        dim = rng.randrange(rank)
        bd.call(op, x, dim=dim, index=rng.randrange(shape[dim]))
    elif op in ("cat", "stack"):
        others = [v for v in bd.values if _shape(v) == shape and _t(v).dtype == _t(x).dtype]
        parts = [x, rng.choice(others)]
        bd.call(op, parts, dim=rng.randrange(rank + (op == "stack")))
    elif op in ("split", "chunk"):
        dim = rng.randrange(rank)
        if op == "chunk":
            bd.call(op, x, chunks=rng.choice((1, 2, 3)), dim=dim)
        else:
            k = rng.randint(1, shape[dim])
            bd.call(op, x, sizes=(k, shape[dim] - k) if k < shape[dim] else (k,), dim=dim)
    elif op == "flip":
        bd.call(op, x, dims=_dims(bd, rank))
    elif op == "roll":
        dims = _dims(bd, rank)
        bd.call(op, x, shifts=tuple(rng.choice((-1, 1, 2)) for _ in dims), dims=dims)
    elif op == "diagonal":
        x = bd.pick(lambda v: _t(v).rank >= 2)
        bd.call(op, x, offset=rng.choice((-1, 0, 1)), dim1=0, dim2=1)
    elif op in ("pad", "constant_pad"):
        pad = tuple(rng.choice((0, 1, 2)) for _ in range(2 * min(rank, 2)))
        if op == "pad":
            bd.call(op, x, pad=pad, mode=rng.choice(("constant", "reflect", "replicate")))
        else:
            bd.call(op, x, pad=pad, value=rng.choice((0.0, 1.5)))
    elif op == "unfold":
        dim = rng.randrange(rank)
        bd.call(op, x, dim=dim, size=rng.randint(1, shape[dim]), step=rng.choice((1, 2)))
    else:
        bd.call(op, x)


def _constant(bd: _Builder, op: str) -> None:
    rng = bd.rng
    dtype = rng.choice((torch.float32, torch.int64, torch.float64))
    if op == "arange":
        bd.call(op, start=0, end=rng.randint(2, 8), step=1, dtype=dtype)
    elif op == "full":
        bd.call(op, shape=bd.shape(), dtype=dtype, value=rng.choice((1, 2.5, -1)))
    else:
        bd.call(op, shape=bd.shape(), dtype=dtype)


def _extern(bd: _Builder, op: str) -> None:
    rng = bd.rng
    dt = rng.choice((torch.float32, torch.float32, torch.float64, torch.bfloat16))
    if op in ("linear", "matmul", "bmm"):
        x = bd.pick(lambda v: _is_float(v) and _t(v).rank == (3 if op == "bmm" else 2))
        k, n, dt = _shape(x)[-1], rng.choice((1, 3, 8, 16)), _t(x).dtype
        if op == "linear":
            bias = bd.param((n,), dt) if rng.random() < 0.6 else None
            bd.call(op, x, bd.param((n, k), dt), bias)
        elif op == "matmul":
            bd.call(op, x, bd.param((k, n), dt))
        else:
            bd.call(op, x, bd.param((_shape(x)[0], k, n), dt))
    elif op in ("conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"):
        x = bd.user_input((rng.choice((1, 2)), rng.choice((1, 2, 4)), rng.randint(3, 8),
                           rng.randint(3, 8)), dt)  # fmt: skip
        n, c, h, w = _shape(x)
        k = rng.choice((1, 2, 3))
        if op == "conv2d":
            groups = rng.choice([g for g in (1, 2, 4) if c % g == 0])
            out = groups * rng.choice((1, 2))
            bias = bd.param((out,), dt) if rng.random() < 0.6 else None
            bd.call(op, x, bd.param((out, c // groups, k, k), dt), bias,
                    stride=(rng.choice((1, 2)),) * 2, padding=(rng.choice((0, 1)),) * 2,
                    dilation=(1, 1), groups=groups)  # fmt: skip
        elif op == "adaptive_avg_pool2d":
            bd.call(op, x, output_size=(rng.randint(1, h), rng.randint(1, w)))
        else:
            attrs: dict[str, Any] = {
                "kernel_size": (k, k),
                "stride": (rng.choice((1, 2)),) * 2,
                "padding": (rng.choice((0, k // 2)),) * 2,
                "ceil_mode": rng.random() < 0.3,
            }
            if op == "avg_pool2d":
                attrs["count_include_pad"] = rng.random() < 0.5
            bd.call(op, x, **attrs)  # fmt: skip
    elif op == "scaled_dot_product_attention":
        b, heads, length, e = 1, rng.choice((1, 2)), rng.randint(2, 6), rng.choice((4, 8))
        q = bd.user_input((b, heads, length, e), dt)
        kv = bd.user_input((b, heads, length, e), dt)
        bd.call(op, q, kv, kv, None, is_causal=rng.random() < 0.5)
    elif op == "embedding":
        idx = bd.user_input(bd.shape(rng.choice((1, 2))), torch.int64, 0, 6)
        bd.call(op, idx, bd.param((6, rng.choice((2, 4))), dt))
    elif op == "index_select":
        x = bd.pick(lambda v: _t(v).rank >= 1)
        dim = rng.randrange(_t(x).rank)
        idx = bd.user_input((rng.randint(1, 4),), torch.int64, 0, _shape(x)[dim])
        bd.call(op, x, idx, dim=dim)
    else:
        raise _Refused(f"no generator for {op}")


_FAMILIES: dict[Category, Callable[[_Builder, str], None]] = {
    Category.POINTWISE: _pointwise,
    Category.REDUCTION: _reduction,
    Category.VIEW: _view,
    Category.CONSTANT: _constant,
    Category.EXTERN: _extern,
}
_WEIGHTS = {Category.POINTWISE: 8, Category.REDUCTION: 3, Category.VIEW: 4,
            Category.CONSTANT: 1, Category.EXTERN: 2}  # fmt: skip


def fuzzable_ops() -> dict[Category, list[str]]:
    """The ops the generator draws, by category (every registered op not in EXCLUDED)."""
    out: dict[Category, list[str]] = {}
    for name, opdef in sorted(all_ops().items()):
        if name in EXCLUDED or opdef.category not in _FAMILIES:
            continue
        out.setdefault(opdef.category, []).append(name)
    out.setdefault(Category.VIEW, [])
    if "dropout" in all_ops():
        out[Category.VIEW].append("dropout")  # NOTE: in eval (train=False): the identity
    return out


def generate(seed: int, *, nodes: tuple[int, int] = (3, 10)) -> FuzzCase:
    """The graph of ``seed``: same seed, same graph."""
    rng = random.Random(seed)
    bd = _Builder(rng, seed)
    floats = rng.random() < 0.85
    dtype = rng.choice(_FLOATS) if floats else rng.choice(_INTS)
    for _ in range(rng.randint(1, 3)):
        bd.user_input(bd.shape(), dtype, *((-4, 5) if floats else (1, 6)))
    if rng.random() < 0.5:
        bd.param(_shape(bd.values[0]), dtype)
    table = fuzzable_ops()
    categories = list(table)
    weights = [_WEIGHTS[c] for c in categories]
    target, tries = rng.randint(*nodes), 0
    made: list[str] = []
    while len(made) < target and tries < 20 * target:
        tries += 1
        category = rng.choices(categories, weights)[0]
        op = rng.choice(table[category])
        mark = bd.mark()
        try:
            if op == "dropout":
                bd.call(op, bd.pick(_is_float), p=0.5, train=False)
            else:
                _FAMILIES[category](bd, op)
        except _Refused:
            bd.restore(mark)
            continue
        made.append(op)
    _finish(bd)
    return FuzzCase(seed, bd.b.build(), bd.user, bd.params, made)


def _finish(bd: _Builder) -> None:
    """Outputs: every node value nothing reads (at most three), else the last one."""
    g = bd.b.graph
    read = {v.name for n in g.nodes for v in n.input_values()}
    leaves = [v for n in g.nodes for v in n.outputs if v.name not in read]
    if not leaves and g.nodes:
        leaves = [g.nodes[-1].outputs[0]]
    if not leaves:
        leaves = [bd.b.call("neg" if _is_float(bd.values[0]) else "abs", bd.values[0])]
    bd.b.output(*leaves[-3:])
    used = {v.name for n in g.nodes for v in n.input_values()} | {
        o.name for o in g.outputs if isinstance(o, Value)
    }
    kept = [v for v in g.inputs if v.name in used]
    bd.user = [s for s in bd.user if s.name in used]
    bd.params = {k: t for k, t in bd.params.items() if k in used}
    g.inputs = kept
