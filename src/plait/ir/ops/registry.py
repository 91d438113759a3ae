"""The closed op registry: every IR op defined once, with everything about it side by side.

An :class:`OpDef` holds the op's signature (operand params and attributes with defaults), its
category, its type rule, its PyTorch reference implementation and the dtypes it supports. Later
layers (autograd, codegen) keep their own per-op rule tables keyed by op name, so imports keep
pointing down the pipeline.

Example:
    >>> from plait.ir.ops import get_op
    >>> op = get_op("softmax")
    >>> op.category.value, [a.name for a in op.attrs]
    ('reduction', ['dim', 'dtype'])
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from plait.ir.errors import IRKeyError, IRValueError
from plait.ir.ssa import Operand, Value
from plait.ir.types import COMPLEX_DTYPES, NoneType, ScalarType, TensorType, Type, scalar_type_of


class Category(enum.Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    VIEW = "view"
    EXTERN = "extern"
    RANDOM = "random"
    OPAQUE = "opaque"
    CONSTANT = "constant"


class TypeRuleError(ValueError):
    """An op's type rule rejects its operand types or attributes."""


class ComplexDtypeError(TypeRuleError):
    """An op outside :data:`COMPLEX_OPS` was given, or would give, a complex tensor."""


class AttrError(ValueError):
    """An attribute is missing, unknown, or of the wrong kind."""


# Operand param kinds. NOTE: a variadic param is always the last one.
TENSOR = "tensor"
OPTIONAL_TENSOR = "tensor?"
SCALAR_OR_TENSOR = "scalar|tensor"
VARIADIC = "tensor*"

_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str = TENSOR


@dataclass(frozen=True)
class Attr:
    """An attribute: ``kind`` is one of ATTR_KINDS, with a ``?`` suffix when None is allowed."""

    name: str
    kind: str
    default: Any = _REQUIRED
    choices: tuple[Any, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _is_dim(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, sympy.Expr) and bool(v.is_integer)
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


ATTR_KINDS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "float": lambda v: isinstance(v, float),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dtype": lambda v: isinstance(v, torch.dtype),
    "dim": _is_dim,
    "scalar": lambda v: isinstance(v, (int, float)) or _is_dim(v),
    "ints": lambda v: isinstance(v, tuple) and all(_is_int(x) for x in v),
    "dims": lambda v: isinstance(v, tuple) and all(_is_dim(x) for x in v),
}


def _coerce(kind: str, value: Any) -> Any:
    """Normalize spellings a user may pass: lists become tuples, ints become floats for floats."""
    if isinstance(value, list):
        value = tuple(value)
    if kind == "float" and _is_int(value):
        value = float(value)
    if kind in ("ints", "dims") and _is_dim(value):
        value = (value,)
    if isinstance(value, sympy.Expr) and value.is_Integer:
        value = int(value)
    if isinstance(value, tuple):
        value = tuple(int(x) if isinstance(x, sympy.Expr) and x.is_Integer else x for x in value)
    return value


TypeRule = Callable[..., Sequence[Type]]

# NOTE: the only ops that may take or give complex tensors: those PyTorch's own kernels run
# (``aten``/``aten_factory`` extern nodes, opaque nodes, PyTorch's random functions), so each
# complex value is computed exactly as eager computes it, and ``detach`` (the value itself, no
# gradient: Stax has no lowering for it and runs its PyTorch reference, ``x.detach()``). Every
# other op, native arithmetic or not, refuses complex operands and results in
# :meth:`OpDef.output_types`, so an op added later cannot forget to (its codegen, kernels and
# folding rules know real dtypes only); the capture then emits an ``aten`` node (or an opaque
# one) instead.
# The views among them (always affine: a strided view of a buffer, never a kernel) compute
# nothing: an aten node reading one sees eager's strides (a copy in its place would hand
# PyTorch's kernel another layout, and its rounding may differ with it: MKL's complex mm).
COMPLEX_VIEWS = frozenset({"permute", "transpose", "unsqueeze", "squeeze", "select", "expand"})
COMPLEX_OPS = frozenset(
    {"aten", "aten_factory", "opaque", "random_call", "random_factory", "detach", *COMPLEX_VIEWS}
)


def _complex_dtype(types: Sequence[Any]) -> torch.dtype | None:
    for t in types:
        if isinstance(t, list):
            found = _complex_dtype(t)
            if found is not None:
                return found
        elif isinstance(t, TensorType) and t.dtype in COMPLEX_DTYPES:
            return t.dtype
    return None


@dataclass(frozen=True)
class OpDef:
    name: str
    category: Category
    params: tuple[Param, ...]
    attrs: tuple[Attr, ...]
    type_rule: TypeRule
    reference: Callable[..., Any]
    dtypes: tuple[torch.dtype, ...]
    doc: str = ""
    fixed_outputs: int | None = 1
    random_when: Callable[[Mapping[str, Any]], bool] | None = field(default=None)

    def is_random(self, attrs: Mapping[str, Any]) -> bool:
        """Random ops consume RNG state: never CSE'd, never reordered among themselves."""
        if self.category is Category.RANDOM:
            return self.random_when is None or self.random_when(attrs)
        return self.random_when is not None and self.random_when(attrs)

    # --- attributes -------------------------------------------------------------------------
    def check_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """Validate ``attrs`` and fill defaults; returns a new dict in declaration order."""
        known = {a.name for a in self.attrs}
        unknown = sorted(set(attrs) - known)
        if unknown:
            raise AttrError(
                f"{self.name}: unknown attribute(s) {unknown}; expected {sorted(known)}"
            )
        out: dict[str, Any] = {}
        for a in self.attrs:
            if a.name in attrs:
                value = _coerce(a.kind.rstrip("?"), attrs[a.name])
            elif a.required:
                raise AttrError(f"{self.name}: missing required attribute {a.name!r}")
            else:
                value = a.default
            optional = a.kind.endswith("?")
            base = a.kind.rstrip("?")
            if value is None and not optional:
                raise AttrError(f"{self.name}: attribute {a.name!r} may not be none")
            if value is not None and not ATTR_KINDS[base](value):
                raise AttrError(
                    f"{self.name}: attribute {a.name!r} must be {a.kind}, got {value!r}"
                )
            if a.choices is not None and value not in a.choices:
                raise AttrError(
                    f"{self.name}: attribute {a.name!r} must be one of {a.choices}, got {value!r}"
                )
            out[a.name] = value
        return out

    # --- operands ---------------------------------------------------------------------------
    def flatten(self, inputs: Sequence[Any]) -> tuple[Operand, ...]:
        """Match call inputs to params: trailing optional tensors default to None, a variadic
        param takes a list."""
        params = self.params
        if len(inputs) > len(params):
            raise TypeRuleError(
                f"{self.name}: takes {len(params)} operand(s) "
                f"({', '.join(p.name for p in params)}), got {len(inputs)}"
            )
        flat: list[Operand] = []
        for i, p in enumerate(params):
            if i >= len(inputs):
                if p.kind != OPTIONAL_TENSOR:
                    raise TypeRuleError(f"{self.name}: missing operand {p.name!r}")
                flat.append(None)
            elif p.kind == VARIADIC:
                seq = inputs[i]
                if not isinstance(seq, (list, tuple)) or not seq:
                    raise TypeRuleError(f"{self.name}: operand {p.name!r} takes a nonempty list")
                flat.extend(seq)
            else:
                flat.append(inputs[i])
        return tuple(flat)

    def structure(self, flat: Sequence[Any]) -> list[Any]:
        """Inverse of :meth:`flatten`: regroup a flat operand tuple by param."""
        n = len(self.params)
        if self.params and self.params[-1].kind == VARIADIC:
            return [*flat[: n - 1], list(flat[n - 1 :])]
        if len(flat) != n:
            raise TypeRuleError(f"{self.name}: expected {n} operands, got {len(flat)}")
        return list(flat)

    def operand_types(self, flat: Sequence[Operand]) -> list[Any]:
        """Structured operand types, checked against the param kinds."""
        types: list[Type] = []
        for operand in flat:
            if isinstance(operand, Value):
                types.append(operand.type)
            elif operand is None:
                types.append(NoneType())
            else:
                types.append(scalar_type_of(operand))
        structured = self.structure(types)
        for p, t in zip(self.params, structured):
            ok = {
                TENSOR: lambda t: isinstance(t, TensorType),
                OPTIONAL_TENSOR: lambda t: isinstance(t, (TensorType, NoneType)),
                SCALAR_OR_TENSOR: lambda t: isinstance(t, (TensorType, ScalarType)),
                VARIADIC: lambda ts: all(isinstance(x, TensorType) for x in ts),
            }[p.kind](t)
            if not ok:
                raise TypeRuleError(f"{self.name}: operand {p.name!r} must be {p.kind}, got {t}")
        return structured

    def infer(
        self, inputs: Sequence[Any], attrs: Mapping[str, Any]
    ) -> tuple[tuple[Operand, ...], dict[str, Any], tuple[Type, ...]]:
        """Flatten operands, validate attributes and compute output types."""
        flat = self.flatten(inputs)
        full = self.check_attrs(attrs)
        return flat, full, self.output_types(flat, full)

    def output_types(self, flat: Sequence[Operand], attrs: Mapping[str, Any]) -> tuple[Type, ...]:
        structured = self.operand_types(flat)
        takes_complex = self.name in COMPLEX_OPS
        dtype = None if takes_complex else _complex_dtype(structured)
        if dtype is not None:
            raise ComplexDtypeError(self._complex_refusal("takes", dtype))
        out = tuple(self.type_rule(*structured, **attrs))
        dtype = None if takes_complex else _complex_dtype(out)
        if dtype is not None:
            raise ComplexDtypeError(self._complex_refusal("gives", dtype))
        if self.fixed_outputs is not None and len(out) != self.fixed_outputs:
            raise TypeRuleError(
                f"{self.name}: type rule gave {len(out)} outputs, op declares {self.fixed_outputs}"
            )
        return out

    def _complex_refusal(self, verb: str, dtype: torch.dtype) -> str:
        return (
            f"{self.name}: {verb} a {dtype} tensor; plait's native ops compute real dtypes "
            f"only, complex values go through PyTorch's kernels ({', '.join(sorted(COMPLEX_OPS))})"
        )

    def run(self, flat: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Run the reference implementation on concrete operands; always returns a tuple."""
        out = self.reference(*self.structure(flat), **attrs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise IRValueError(f"op {opdef.name!r} is already registered")
    variadic = [i for i, p in enumerate(opdef.params) if p.kind == VARIADIC]
    if variadic and variadic != [len(opdef.params) - 1]:
        raise IRValueError(f"op {opdef.name!r}: a variadic param must be the last one")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise IRKeyError(
            f"unknown op {name!r}; plait's op registry is closed: see plait.ir.ops.all_ops()"
        ) from None


def all_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)
