"""Result types of an ``aten`` node whose operands have symbolic dims, for the overloads whose
result dims are operand dims or constants: attention's fused kernels and their backward, which a
training capture records as ``aten`` nodes (they return the values the backward reads), and an
embedding's backward (its result the weight's shape).

An ``aten`` node's types come from the overload's meta kernel, which takes concrete shapes. For
an overload in :data:`PROBED` the meta kernel runs at two assignments of the symbols: distinct
primes in ascending order of the symbols' names, then other primes in descending order. A result
dim equal in both runs is that constant; one that takes a symbol's value, or an operand dim's
(``s0 - 1`` of a sliced sequence, ``s0*s1`` of a flattened one), in both runs is that dim; any
other (``2 * s0``, ``max(s0, s1)``: disjoint values in two orders tell them apart), or one that
two operand dims match, raises, as every symbolic operand of another overload does.

Example:
    >>> import torch
    >>> from plait.symbolic import symbol
    >>> from plait.ir.types import TensorType
    >>> s0, s1 = symbol("s0"), symbol("s1")
    >>> q = TensorType((s0, 4, s1, 16), torch.float32)
    >>> run = lambda ops: [TensorType(ops[0].shape, ops[0].dtype)]
    >>> probed_types(run, (q,))[0].shape == (s0, 4, s1, 16)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plait.ir.ops.registry import TypeRuleError
from plait.ir.types import TensorType
from plait.symbolic import Dim, dims_equal, evaluate, free_symbols

# NOTE: (name, overload) of the overloads typed by probing; each result dim is an operand dim or
# a constant (checked at each node: any other dim raises)
PROBED: frozenset[tuple[str, str]] = frozenset(
    {
        ("_scaled_dot_product_flash_attention_for_cpu", "default"),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", "default"),
        ("embedding_dense_backward", "default"),
    }
)
_PRIMES = (1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069)
_OTHER_PRIMES = (2003, 2011, 2017, 2027, 2029, 2039, 2053, 2063, 2069, 2081, 2083, 2087)


def probed_types(
    run: Callable[[tuple[TensorType, ...]], Sequence[TensorType]],
    operands: tuple[TensorType, ...],
) -> tuple[TensorType, ...]:
    """The result types of ``run`` (the meta kernel on static operand types) on ``operands``
    of symbolic dims, each result dim a constant, one of the operands' symbols or one of their
    dims."""
    symbols = sorted(free_symbols(d for t in operands for d in t.shape), key=str)
    if len(symbols) > len(_PRIMES):
        raise TypeRuleError(f"aten: {len(symbols)} symbols; at most {len(_PRIMES)} are probed")
    orders = (_PRIMES[: len(symbols)], tuple(reversed(_OTHER_PRIMES[: len(symbols)])))
    runs = []
    for values in orders:
        bound = dict(zip(symbols, values))
        concrete = tuple(
            TensorType(tuple(evaluate(d, bound) for d in t.shape), t.dtype, t.device)
            for t in operands
        )
        runs.append(run(concrete))
    first, second = runs
    known = _operand_dims(operands, symbols, orders)
    out = []
    for a, b in zip(first, second):
        dims: list[Dim] = []
        for x, y in zip(a.shape, b.shape):
            dims.append(x if x == y else _dim_of(x, y, known))
        out.append(TensorType(tuple(dims), a.dtype, a.device))
    return tuple(out)


def _operand_dims(
    operands: tuple[TensorType, ...], symbols: list, orders: tuple[tuple[int, ...], ...]
) -> list[tuple[Dim, int, int]]:
    """Each symbol and each distinct symbolic operand dim (``s0 - 1`` of a slice, ``s0*s1`` of a
    flatten), with its values at the two assignments."""
    dims: list[Dim] = list(symbols)
    for t in operands:
        for d in t.shape:
            if not isinstance(d, int) and not any(dims_equal(d, e) for e in dims):
                dims.append(d)
    bounds = [dict(zip(symbols, values)) for values in orders]
    return [(d, evaluate(d, bounds[0]), evaluate(d, bounds[1])) for d in dims]


def _dim_of(x: int, y: int, known: list[tuple[Dim, int, int]]) -> Dim:
    found = [d for d, a, b in known if (a, b) == (x, y)]
    if len(found) == 1:
        return found[0]
    raise TypeRuleError(
        "aten: a result dim is neither a constant nor an operand's dim"
        + (f" (it could be any of {', '.join(map(str, found))})" if found else "")
        + "; this overload takes static shapes (compile with dynamic=False)"
    )
