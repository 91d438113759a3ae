"""Judging values under the numerical contract: which contract row a node is held to, one value
against its reference by the gate's own comparison, and whole graphs through the gate.

Every budget comes from :func:`plait.contract.load`; nothing here writes a tolerance.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4,), torch.float32))
    >>> y = gb.call("exp", x)
    >>> gb.output(y)
    >>> op_class_of(y.producer)
    'pointwise'
    >>> judge_value(torch.ones(4), torch.ones(4) * 2, ["pointwise"], "%y").check
    'tolerance'
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import plait.conformance
import plait.contract
from plait.conformance.compare import Budget, compare
from plait.conformance.report import Failure, Report
from plait.ir import Category, Graph, Node, Value, get_op, interpret

_EXTERN_CLASSES = {
    "conv2d": "conv",
    "linear": "matmul",
    "matmul": "matmul",
    "bmm": "matmul",
    "scaled_dot_product_attention": "attention",
    "embedding": "data_movement",
    "index_select": "data_movement",
    "max_pool2d": "data_movement",
    "avg_pool2d": "reduction",
    "adaptive_avg_pool2d": "reduction",
}
_NORMALIZATION = frozenset(
    {"logsumexp", "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm",
     "batch_norm_train"}
)  # fmt: skip
_BY_CATEGORY = {
    Category.POINTWISE: "pointwise",
    Category.REDUCTION: "reduction",
    Category.VIEW: "data_movement",
    Category.CONSTANT: "data_movement",
}


@functools.cache
def _contract() -> plait.contract.Contract:
    """The packaged contract, parsed once per process (every value judged reads it)."""
    return plait.contract.load()


def op_class_of(node: Node | None) -> str:
    """The contract's op class for ``node``'s results (``data_movement`` for a graph input,
    ``model`` for ops the contract has no narrower row for: ATen externs, opaque, random)."""
    if node is None:
        return "data_movement"
    if node.op in _NORMALIZATION:
        return "normalization"
    if node.op in _EXTERN_CLASSES:
        return _EXTERN_CLASSES[node.op]
    return _BY_CATEGORY.get(get_op(node.op).category, "model")


def loosest(op_classes: Iterable[str], dtype: torch.dtype) -> str:
    """Of ``op_classes``, the one whose contract row for ``dtype`` allows the most."""
    contract = _contract()
    classes = sorted(set(op_classes)) or ["data_movement"]

    def width(c: str) -> tuple[float, float]:
        tol = contract.tolerance(c, _row_dtype(dtype))
        return (tol.rtol, tol.atol)

    return max(classes, key=width)


def _row_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return dtype.to_real()
    if dtype.is_floating_point or dtype == torch.bool:
        return dtype
    return torch.int64


@dataclass(frozen=True)
class Measure:
    """A gate measure against its budget: the rule (``check``), where and in which case, the
    worst element's error and the budget it broke (None where the rule has no number, e.g. NaN
    in the wrong place), and the gate's message."""

    check: str
    where: str
    case: str
    message: str
    error: float | None = None
    budget: float | None = None
    op_class: str | None = None

    @classmethod
    def of(cls, failure: Failure, op_class: str | None = None) -> Measure:
        return cls(
            failure.check, failure.where, failure.case, failure.message,
            failure.error, failure.budget, op_class,
        )  # fmt: skip

    def __str__(self) -> str:
        numbers = ""
        if self.error is not None and self.budget is not None:
            numbers = f": error {self.error:.6g} against budget {self.budget:.6g}"
        row = f" ({self.op_class} row)" if self.op_class else ""
        return f"{self.check} at {self.where}{row}{numbers} [{self.message}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check, "where": self.where, "case": self.case,
            "message": self.message, "error": self.error, "budget": self.budget,
            "op_class": self.op_class,
        }  # fmt: skip


def judge_value(
    expected: Any, actual: Any, op_classes: Sequence[str], where: str, case: str = "diagnosis"
) -> Measure | None:
    """The gate's elementwise verdict on one value (the loosest of ``op_classes``' rows for its
    dtype): None when it conforms, else the measure that broke its budget."""
    if _same_bits(expected, actual):
        return None
    op_class = "data_movement"
    if isinstance(expected, torch.Tensor):
        op_class = loosest(op_classes, expected.dtype)
        tol = _contract().tolerance(op_class, _row_dtype(expected.dtype))
        budget = Budget(tol, None, 0.0)
    else:
        budget = Budget(_contract().tolerance("data_movement", torch.int64), None, 0.0)
    report = Report()
    compare(report, where, case, expected, actual, budget)
    if report.ok:
        return None
    return Measure.of(report.errors[0], op_class)


def share_of_budget(expected: Any, actual: Any, op_classes: Sequence[str]) -> float:
    """How much of its elementwise budget the worst element of ``actual`` used (the contract's
    rule ``|a - e| <= atol * max(1, S) + rtol * |e|``); 0 for equal or non-float values."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return 0.0
    if not expected.dtype.is_floating_point or expected.shape != actual.shape:
        return 0.0
    if _same_bits(expected, actual):
        return 0.0
    e, a = expected.detach().double(), actual.detach().double()
    finite = torch.isfinite(e) & torch.isfinite(a)
    if not bool(finite.any()):
        return 0.0
    tol = _contract().tolerance(loosest(op_classes, expected.dtype), expected.dtype)
    scale = max(1.0, float(e[finite].abs().max()))
    allowed = tol.atol * scale + tol.rtol * e.abs()
    err = (a - e).abs()
    over = torch.where(allowed > 0, err / allowed, (err > 0).double() * float("inf"))
    return float(over[finite].max())


def _same_bits(expected: Any, actual: Any) -> bool:
    """The fast path: the same tensor, or equal values of one dtype and shape (NaN never
    compares equal: such values take the gate's comparison)."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return False
    if expected is actual:
        return True
    same_meta = expected.dtype == actual.dtype and expected.shape == actual.shape
    return same_meta and expected.device == actual.device and bool(torch.equal(expected, actual))


# --- graphs through the gate ---------------------------------------------------------------
Executor = Callable[[list[Any]], Sequence[Any]]


def graph_executor(inputs: Sequence[Value], graph: Graph) -> Executor:
    """Run ``graph`` with the reference interpreter on values given in ``inputs``' order (the
    captured graph's), bound by name; ``graph``'s own constants fill its ``const`` inputs."""
    index = {v.name: i for i, v in enumerate(inputs)}
    owned = {
        t.untyped_storage().data_ptr()
        for t in graph.constants.values()
        if isinstance(t, torch.Tensor)
    }

    def run(values: list[Any]) -> list[Any]:
        named = {**graph.constants}
        for v in graph.inputs:
            if v.name not in named:
                named[v.name] = values[index[v.name]]
        out = interpret(graph, named, check_types=False)
        # NOTE: a pass's output is judged for what it computes: a constant it returns is copied
        # (the gate poisons what a candidate returns; the graph's constants must survive it)
        return [_copied_if_owned(t, owned) for t in out]

    return run


def _copied_if_owned(t: Any, owned: set[int]) -> Any:
    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in owned:
        return t.clone()
    return t


def float64_executor(inputs: Sequence[Value], graph: Graph) -> Executor:
    """The interpreter on float64 copies of every floating input and constant (the gate's
    float64 anchor)."""
    run = graph_executor(inputs, _widened_constants(graph))

    def widen(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            return x.detach().to(torch.float64)
        return x

    return lambda values: run([widen(x) for x in values])


def _widened_constants(graph: Graph) -> Graph:
    floats = {
        k: v for k, v in graph.constants.items()
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point
    }  # fmt: skip
    if not floats:
        return graph
    wide = graph.copy()
    wide.constants.update({k: v.to(torch.float64) for k, v in floats.items()})
    return wide


def gate_graph(
    reference: Executor,
    reference64: Executor | None,
    candidate: Executor,
    draw: Callable[[int], list[Any]],
    *,
    draws: int = 1,
    seed: int = 0,
) -> Report:
    """The gate on graph-level callables (each takes the graph's input values, in order):
    ``draw(seed)`` makes fresh inputs, never the same twice, never all zeros."""

    def as_fn(execute: Executor) -> Callable[..., Any]:
        return lambda *values: tuple(execute(list(values)))

    ref64 = as_fn(reference64) if reference64 is not None else None
    return plait.conformance.check(
        as_fn(reference),
        as_fn(candidate),
        lambda s: tuple(draw(s)),
        draws=draws,
        stress=None,
        # NOTE: random graphs compose ops where eager's own answer on special values depends on
        # its kernel path (which zero min/max return of -0.0 and +0.0, fed to atan2: -pi or
        # -0.0); the fuzz judges ordinary draws, as it judges no stress draw
        special_values=False,
        seed=seed,
        reference64=ref64,
    )


def first_measure(report: Report) -> Measure | None:
    """The first error of a gate report, as a measure (None when the report passed)."""
    return Measure.of(report.errors[0]) if report.errors else None


def named(graph: Graph, values: Sequence[Any]) -> Mapping[str, Any]:
    """Input values in ``graph``'s input order, by name."""
    return {v.name: x for v, x in zip(graph.inputs, values)}
