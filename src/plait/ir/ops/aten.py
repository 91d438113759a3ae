"""Typed ATen extern ops: one functional ``torch.ops.aten`` overload as an IR node.

A call that plait's own ops cannot express is traced to PyTorch's functional ATen ops
(:mod:`plait.frontend.aten_trace`); each ATen op with no exactly equivalent IR op becomes an
``aten`` node (``aten_factory`` when it has no tensor operand: ``linspace``, ``eye``). Unlike an
``opaque`` node, whose output types are copied from one recorded sample, an ``aten`` node's type
rule computes its output types from its input types through the overload's meta kernel (run on
fake tensors), so a new shape gets the right types; and the node names an ATen overload, never a
Python function: ``name``/``overload`` resolve within ``torch.ops.aten`` only, so an artifact's
text can never make plait run arbitrary code.

An overload's undefined results (``None``: the gradients ``convolution_backward`` leaves out by
its ``output_mask``) are no outputs of the node: its outputs are the defined results, in order
(:func:`defined_results`; a single one is the tensor itself). Which results are undefined depends
on the arguments alone: an ``output_mask`` argument, or a flag that asks for a result
(``_native_multi_head_attention``'s weights, only with ``need_weights``), decides them
(:func:`output_mask`), for the types and at run time alike (kernels and meta kernels define more
than it asks for, each its own way: :func:`_masked`).

Non-tensor arguments travel as the JSON literals of opaque nodes (``literals``/``kwliterals``,
:func:`plait.ir.ops.extern.decode_literal`; ``{"t": i}`` is tensor operand ``i``). Refused by
the type rule: in-place or aliasing overloads (the IR is functional), symbolic dims, non-tensor
results, data-dependent output shapes.

An overload tagged ``torch.Tag.nondeterministic_seeded`` (``bernoulli.p``, ``uniform``,
``normal.Tensor_float``, ``randint_like``...) makes its node random (``is_random``): passes never
merge, fold or reorder it among the random nodes, and the executors run it in program order, so
it draws from torch's global generator exactly the numbers eager draws there.

``aten_check(tensors...)`` is a runtime check (:data:`RUNTIME_CHECKS`: ``_linalg_check_errors``,
``_assert_async``...): PyTorch's own kernel, run in program order, that returns nothing and raises
eager's error on bad values (a singular matrix). Its node returns an ``i64[]`` token that capture
makes a graph output, so it is never dead code. (Constant folding may run it once on frozen
constants: capture ran it on the same values already, and a weight changed in place recompiles.)

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 3), torch.float32))
    >>> u, s, vh = gb.call("aten", [x], name="_linalg_svd", overload="default",
    ...                    literals='[{"t": 0}, false]')
    >>> [str(v.type) for v in (u, s, vh)]
    ['f32[4, 3]', 'f32[3]', 'f32[3, 3]']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from plait.ir.ops.aten_overloads import lookup_overload, resolve_overload
from plait.ir.ops.aten_symbolic import PROBED, probed_types
from plait.ir.ops.call_autograd import (
    draws_random,
)
from plait.ir.ops.call_literals import call_spec, count_operands, decode_call
from plait.ir.ops.extern import ALL
from plait.ir.ops.registry import VARIADIC, Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.types import TensorType, Type


def is_seeded(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` draws from torch's random number generator."""
    return torch.Tag.nondeterministic_seeded in op.tags


@functools.lru_cache(maxsize=1024)
def _seeded_name(name: str, overload: str) -> bool:
    try:
        return is_seeded(lookup_overload(name, overload))
    except TypeRuleError:
        return False


def _random_when(attrs: Any) -> bool:
    """A seeded overload draws unless its arguments turn the draw off (``dropout_p=0``: the
    attention kernels' forward then computes a deterministic result, free to lay out as any
    extern's)."""
    name, overload = str(attrs.get("name", "")), str(attrs.get("overload", "default"))
    if not _seeded_name(name, overload):
        return False
    return _draws(name, overload, str(attrs.get("literals", "")), str(attrs.get("kwliterals", "")))


@functools.lru_cache(maxsize=1024)
def _draws(name: str, overload: str, literals: str, kwliterals: str) -> bool:
    """:func:`~plait.ir.ops.call_autograd.draws_random` on the node's encoded arguments (the
    switches it reads are plain literals, never tensor operands)."""
    positional, keywords = call_spec(literals, kwliterals)
    return draws_random(lookup_overload(name, overload), positional or [], keywords)


aten = torch.ops.aten
# NOTE: ATen overloads that compute nothing and raise on bad values (eager's error, by its own
# kernel): they run as ``aten_check`` nodes, in program order, never dropped.
RUNTIME_CHECKS = frozenset(
    {
        aten._linalg_check_errors.default,
        aten._assert_async.default,
        aten._assert_async.msg,
    }
)


def resolve_check(name: str, overload: str) -> torch._ops.OpOverload:
    """``torch.ops.aten.<name>.<overload>``, one of :data:`RUNTIME_CHECKS`.

    Example:
        >>> resolve_check("_linalg_check_errors", "default")
        <OpOverload(op='aten._linalg_check_errors', overload='default')>
    """
    op = lookup_overload(name, overload)
    if op not in RUNTIME_CHECKS:
        raise TypeRuleError(f"aten_check: aten.{name}.{overload} is no runtime check plait knows")
    return op


def overload_name(op: torch._ops.OpOverload) -> tuple[str, str]:
    """``(name, overload)`` of an ATen overload, as the ``aten`` node's attributes spell it."""
    return op._schema.name.split("::", 1)[1], op._overloadname


def defined_results(out: Any) -> Any:
    """``out`` less its undefined (``None``) results; a single result left is that tensor.

    Example:
        >>> t = torch.zeros(2)
        >>> defined_results((None, t, None)) is t
        True
    """
    if isinstance(out, (tuple, list)) and any(o is None for o in out):
        kept = [o for o in out if o is not None]
        return kept[0] if len(kept) == 1 else tuple(kept)
    return out


def _results(out: Any, what: str) -> list[torch.Tensor]:
    outs = [o for o in out if o is not None] if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise TypeRuleError(f"aten: {what} returns {type(out).__name__}; a node returns tensors")
    return outs


# NOTE: overloads whose kernels leave a result undefined (None) by a flag argument, where their
# meta kernels make a tensor for it: (the flag, the results it asks for)
_FLAGGED_RESULTS: dict[tuple[str, str], tuple[str, int]] = {
    # NOTE: the attention weights, only with need_weights=True (empty on fake tensors)
    ("aten::_native_multi_head_attention", "default"): ("need_weights", 1),
}


def output_mask(op: Any, args: Any, kwargs: Any) -> list[bool] | None:
    """Which results of ``op(*args, **kwargs)`` are defined, decided by its arguments alone:
    its ``output_mask`` argument (the results a backward kernel is asked for), or the flag that
    asks for a result (:data:`_FLAGGED_RESULTS`); None when every result is. ``args`` may hold
    anything in place of tensors (fx nodes, placeholders): only flags are read.

    Example:
        >>> op = torch.ops.aten._native_multi_head_attention.default
        >>> output_mask(op, [None] * 9, {"need_weights": False})
        [True, False]
    """
    if not isinstance(op, torch._ops.OpOverload):
        return None
    names = [a.name for a in op._schema.arguments]
    flagged = _FLAGGED_RESULTS.get((op._schema.name, op._overloadname))
    if flagged is not None:
        flag, result = flagged
        at = names.index(flag)
        default = op._schema.arguments[at].default_value
        value = args[at] if at < len(args) else kwargs.get(flag, default)
        mask = [True] * len(op._schema.returns)
        mask[result] = bool(value)
        return mask
    if "output_mask" not in names:
        return None
    at = names.index("output_mask")
    mask = args[at] if at < len(args) else kwargs.get("output_mask")
    return [bool(m) for m in mask] if isinstance(mask, (tuple, list)) else None


def _masked(out: Any, mask: list[bool] | None) -> Any:
    """``out`` with the results ``mask`` leaves out undefined (None). Kernel and meta kernel
    disagree on them, both ways: ``native_batch_norm_backward``'s meta kernel computes the
    input's gradient whatever the mask says (its CPU kernel does not), the CPU
    ``convolution_backward`` computes the weight's gradient with the bias's (its meta kernel
    does not); the node's outputs are the results the mask asks for, typed and run alike."""
    if mask is None or not isinstance(out, (tuple, list)) or len(mask) != len(out):
        return out
    return tuple(o if keep else None for o, keep in zip(out, mask))


def _meta_types(
    name: str, overload: str, literals: str, kwliterals: str, operands: tuple[TensorType, ...]
) -> tuple[TensorType, ...]:
    # NOTE: a call that leaves its dtype to torch.get_default_dtype() types by the default in
    # force (capture writes the dtype out: frontend.aten_emit), so the default keys the memo
    return _meta_types_under(
        torch.get_default_dtype(), name, overload, literals, kwliterals, operands
    )


@functools.lru_cache(maxsize=4096)
def _meta_types_under(
    default: torch.dtype,
    name: str,
    overload: str,
    literals: str,
    kwliterals: str,
    operands: tuple[TensorType, ...],
) -> tuple[TensorType, ...]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = resolve_overload(name, overload)
    what = f"aten.{name}.{overload}"
    if (name, overload) in PROBED and not all(t.is_static for t in operands):
        run = lambda ops: _meta_types_under(default, name, overload, literals, kwliterals, ops)
        return probed_types(run, operands)
    for t in operands:
        if not t.is_static:
            raise TypeRuleError(
                f"aten: {what} has an operand of symbolic shape {t}; aten nodes take static "
                "shapes (compile with dynamic=False)"
            )
    try:
        with torch._C.DisableTorchFunction(), FakeTensorMode():
            fakes = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in operands]
            args, kwargs = decode_call(fakes, literals, kwliterals)
            outs = _results(_masked(op(*args, **kwargs), output_mask(op, args, kwargs)), what)
            types = [(tuple(o.shape), o.dtype, str(o.device)) for o in outs]
    except TypeRuleError:
        raise
    except Exception as exc:  # NOTE: the meta kernel's own error: bad shapes, dtypes, arguments
        raise meta_rejects("aten", what, exc) from None
    try:
        if not all(isinstance(d, int) for shape, _, _ in types for d in shape):
            raise TypeRuleError(f"aten: {what} has a data-dependent output shape")
        found = tuple(TensorType(shape, dtype, device) for shape, dtype, device in types)
    except TypeError as exc:
        raise TypeRuleError(f"aten: {what}: {exc}") from None
    fix = KERNEL_TYPES.get((name, overload))
    return found if fix is None else fix(operands, found)


def mixed_batch_norm(x: TensorType, others: Sequence[Type]) -> bool:
    """A batch norm of a 16-bit input whose weight, bias and running statistics (those present,
    at least one) are float32: autocast's case, where ATen's kernels keep float32 statistics."""
    return (
        x.dtype in (torch.bfloat16, torch.float16)
        and bool(others)
        and all(isinstance(t, TensorType) and t.dtype == torch.float32 for t in others)
    )


def _float32_batch_statistics(
    operands: tuple[TensorType, ...], found: tuple[TensorType, ...]
) -> tuple[TensorType, ...]:
    """ATen's CPU and CUDA training batch norm keep the batch mean and inverse standard
    deviation (results 1 and 2) in float32 for a 16-bit input whose weight, bias and running
    statistics are float32 (autocast's mixed case), where the fake-tensor meta kernel says the
    input's dtype."""
    if not mixed_batch_norm(operands[0], operands[1:]):
        return found
    stats = tuple(TensorType(t.shape, torch.float32, t.device) for t in found[1:3])
    return (found[0], *stats, *found[3:])


def _empty_dropout_mask(
    operands: tuple[TensorType, ...], found: tuple[TensorType, ...]
) -> tuple[TensorType, ...]:
    """ATen's CPU ``native_dropout`` of an empty input returns its mask in the input's dtype
    (the kernel's early return), where the meta kernel says bool."""
    x = operands[0]
    if x.device != "cpu" or not x.is_static or 0 not in x.shape:
        return found
    return (found[0], TensorType(found[1].shape, x.dtype, x.device))


# NOTE: overloads whose kernels' result types differ from their meta kernel's, and the kernels'
# (checked against the kernels by tests/autograd/test_training_autocast.py and
# tests/autograd/test_training.py)
KERNEL_TYPES: dict[tuple[str, str], Any] = {
    ("_native_batch_norm_legit_functional", "default"): _float32_batch_statistics,
    ("_native_batch_norm_legit", "no_stats"): _float32_batch_statistics,
    ("native_dropout", "default"): _empty_dropout_mask,
}


def meta_rejects(node: str, what: str, exc: Exception) -> TypeRuleError:
    """A meta kernel's own error (bad shapes, dtypes, arguments) as ``node``'s type rule's."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return TypeRuleError(f"{node}: the meta kernel of {what} rejects this call: {first}")


def _check_spec(operands: list[Type], literals: str, kwliterals: str) -> None:
    positional, keywords = call_spec(literals, kwliterals)
    used = len(operands) if positional is None else count_operands(positional)
    used += count_operands(keywords)
    if used != len(operands):
        raise TypeRuleError(
            f"aten: the call spec uses {used} tensor operand(s), the node has {len(operands)}"
        )


def _aten_rule(
    args: list[Type], name: str, overload: str, literals: str, kwliterals: str
) -> list[Type]:
    _check_spec(args, literals, kwliterals)
    operands = tuple(t for t in args if isinstance(t, TensorType))
    return list(_meta_types(name, overload, literals, kwliterals, operands))


def _factory_rule(name: str, overload: str, literals: str, kwliterals: str) -> list[Type]:
    _check_spec([], literals, kwliterals)
    return list(_meta_types(name, overload, literals, kwliterals, ()))


def bind_call(
    name: str, overload: str, literals: str, kwliterals: str, operands: int
) -> Callable[[list[Any]], Any]:
    """A callable over the node's ``operands`` tensors that calls the overload with the node's
    arguments (the literals decoded once, here)."""
    return _bind(resolve_overload(name, overload), literals, kwliterals, operands)


def _bind(
    op: torch._ops.OpOverload, literals: str, kwliterals: str, operands: int
) -> Callable[[list[Any]], Any]:
    if literals == "" and kwliterals == "":
        return lambda tensors: defined_results(op(*tensors))
    slots: list[Any] = [_Slot(i) for i in range(operands)]
    args, kwargs = decode_call(slots, literals, kwliterals)

    def fill(x: Any, tensors: list[Any]) -> Any:
        if isinstance(x, _Slot):
            return tensors[x.index]
        if type(x) is list:
            return [fill(v, tensors) for v in x]
        if type(x) is tuple:
            return tuple(fill(v, tensors) for v in x)
        return x

    mask = output_mask(op, args, kwargs)
    return lambda tensors: defined_results(
        _masked(op(*fill(args, tensors), **{k: fill(v, tensors) for k, v in kwargs.items()}), mask)
    )


class _Slot:
    """Tensor operand ``index`` in a decoded call, filled in at each call."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


CHECK_TOKEN = TensorType((), torch.int64, "cpu")


def _check_rule(
    args: list[Type], name: str, overload: str, literals: str, kwliterals: str
) -> list[Type]:
    resolve_check(name, overload)
    _check_spec(args, literals, kwliterals)
    for t in args:
        if isinstance(t, TensorType) and not t.is_static:
            raise TypeRuleError(f"aten_check: aten.{name} has an operand of symbolic shape {t}")
    return [CHECK_TOKEN]


def bind_check(
    name: str, overload: str, literals: str, kwliterals: str, operands: int
) -> Callable[[list[Any]], torch.Tensor]:
    """A callable over the node's ``operands`` tensors that runs the check (raising eager's
    error on bad values) and returns the node's token."""
    call = _bind(resolve_check(name, overload), literals, kwliterals, operands)

    def run(tensors: list[Any]) -> torch.Tensor:
        call(tensors)
        return torch.zeros((), dtype=torch.int64)

    return run


def _check_ref(args: list[Any], name: str, overload: str, literals: str, kwliterals: str) -> Any:
    return bind_check(name, overload, literals, kwliterals, len(args))(list(args))


# NOTE: inference overloads with no derivative (autograd refuses them) and the overload eager
# calls in their place when a gradient flows: same arguments, same results. Capture traces
# F.embedding_bag with a weight that does not require grad, so it records the inference one;
# run with a gradient flowing (PyTorch's autograd over the reference: a torch_vjp node, a
# backward that falls back to eager autograd) the reference calls eager's training overload.
# Functionalization records a complex tensor's conj as _conj_copy, which has no complex
# derivative: conj_physical computes the same values and has eager's.
TRAINING_OVERLOADS = {
    aten._embedding_bag_forward_only.default: aten._embedding_bag.default,
    aten._conj_copy.default: aten.conj_physical.default,
}


def _aten_ref(args: list[Any], name: str, overload: str, literals: str, kwliterals: str) -> Any:
    call_args, keywords = decode_call(list(args), literals, kwliterals)
    op = resolve_overload(name, overload)
    if torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *keywords.values())
    ):
        op = TRAINING_OVERLOADS.get(op, op)
    return defined_results(
        _masked(op(*call_args, **keywords), output_mask(op, call_args, keywords))
    )


def _factory_ref(name: str, overload: str, literals: str, kwliterals: str) -> Any:
    return _aten_ref([], name, overload, literals, kwliterals)


# NOTE: the attributes of a node that calls an ATen overload (aten, aten_factory, aten_check,
# and the fused batch-norm nodes of plait.ir.ops.batch_norm_relu)
ATEN_ATTRS = (
    Attr("name", "str"),
    Attr("overload", "str", "default"),
    Attr("literals", "str", ""),
    Attr("kwliterals", "str", ""),
)
register(
    OpDef(
        "aten",
        Category.EXTERN,
        (Param("args", VARIADIC),),
        ATEN_ATTRS,
        _aten_rule,
        _aten_ref,
        ALL,
        "a functional ATen overload run by PyTorch (an extern kernel; types from its meta kernel)",
        fixed_outputs=None,
        random_when=_random_when,
    )
)
register(
    OpDef(
        "aten_factory",
        Category.EXTERN,
        (),
        ATEN_ATTRS,
        _factory_rule,
        _factory_ref,
        ALL,
        "a functional ATen overload with no tensor operand (linspace, eye), run by PyTorch",
        fixed_outputs=None,
        random_when=_random_when,
    )
)
register(
    OpDef(
        "aten_check",
        Category.EXTERN,
        (Param("args", VARIADIC),),
        ATEN_ATTRS,
        _check_rule,
        _check_ref,
        (torch.int64,),
        "an ATen runtime check (_linalg_check_errors...) run by PyTorch in program order: raises "
        "eager's error on bad values; returns an i64[] token",
        fixed_outputs=None,
    )
)
