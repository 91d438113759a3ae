"""The numerical contract as data: parsing, validation and the frozen API over it.

The contract is a TOML file (see ``default.toml``). This module turns its text into a
:class:`Contract`, rejecting malformed files with a :class:`ContractError` that names the key.
It imports nothing of plait and not even torch: dtypes are accepted by name (``"float32"``) or as
any object whose ``str()`` is ``"torch.<name>"``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

# Schema 2 (contract 1.1.0): model.factor judges the RMS error, model.tail_factor the worst error,
# model.baseline_layouts names eager's runs that set the baseline. Schema 1 files (factor on the
# worst error, eager's own layout alone) mean something else and are refused, not reinterpreted.
SCHEMA_VERSION = 2

OP_CLASSES: tuple[str, ...] = (
    "data_movement",
    "pointwise",
    "reduction",
    "matmul",
    "conv",
    "normalization",
    "attention",
    "model",
)
DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16", "integer", "bool")
FLOAT_DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
# NOTE: dtypes the anchored model rule applies to: those narrower than the float64 anchor.
FACTOR_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# Memory layouts the gate can run a program in (plait.conformance.draws applies them).
LAYOUTS: tuple[str, ...] = ("contiguous", "channels_last")

# Width of each accumulation dtype, to reject an accumulator narrower than the values it sums.
_WIDTH = {"bool": 1, "float16": 16, "bfloat16": 16, "float32": 32, "float64": 64, "int64": 64}
_ACCUM_OK = {
    "float64": ("float64",),
    "float32": ("float32", "float64"),
    "bfloat16": ("float32", "float64"),
    "float16": ("float32", "float64"),
    "integer": ("int64",),
    "bool": ("int64",),
}
_INTEGER_NAMES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16"}


class ContractError(ValueError):
    """A contract file is malformed, or a query names something the contract does not declare."""


@dataclass(frozen=True)
class Tolerance:
    """The budget for one (op class, dtype) pair.

    Example:
        >>> import plait.contract
        >>> tol = plait.contract.load().tolerance("matmul", "float32")
        >>> tol.accum_dtype, tol.nondeterminism_allowed
        ('float32', False)
    """

    rtol: float
    atol: float
    accum_dtype: str
    nondeterminism_allowed: bool

    @property
    def exact(self) -> bool:
        """True when the budget allows no difference at all."""
        return self.rtol == 0.0 and self.atol == 0.0


@dataclass(frozen=True)
class ChangelogEntry:
    """One ``[[changelog]]`` entry: why the contract changed, and which keys the change touched."""

    version: str
    date: str
    reason: str
    changes: tuple[str, ...]


@dataclass(frozen=True)
class GradcheckSpec:
    """Finite-difference step and budgets for :func:`plait.conformance.gradcheck_fd`."""

    eps: float
    rtol: float
    atol: float


@dataclass(frozen=True)
class Contract:
    """A loaded, validated, immutable numerical contract.

    The model rule (docs/conformance.md): per value, the candidate's RMS error against float64
    may exceed the baseline's by ``model_factor``, its worst error the baseline's worst by
    ``model_tail_factor``, each plus ``model_floor`` units of roundoff x the value's scale. The
    baseline is eager in the case's own layout and in each of ``baseline_layouts`` on the same
    inputs, the least accurate of them.

    Example:
        >>> import plait.contract
        >>> c = plait.contract.load()
        >>> c.model_factor("float32")
        2.0
        >>> c.tolerance("pointwise", "int64").exact
        True
        >>> c.model_tail_factor("float32"), c.baseline_layouts
        (4.0, ('contiguous', 'channels_last'))
    """

    version: str
    schema_version: int
    tolerances: Mapping[tuple[str, str], Tolerance]
    model_factors: Mapping[str, float]
    model_floors: Mapping[str, float]
    model_tail_factors: Mapping[str, float]
    noise_bits: float
    baseline_layouts: tuple[str, ...]
    bitwise_order_preserving: bool
    gradcheck: GradcheckSpec
    changelog: tuple[ChangelogEntry, ...]
    source: str
    data: Mapping[str, Any] = field(repr=False, compare=False)

    def tolerance(self, op_class: str, dtype: object) -> Tolerance:
        """The :class:`Tolerance` for ``op_class`` at ``dtype`` (a name or a torch dtype)."""
        if op_class not in OP_CLASSES:
            raise ContractError(f"unknown op class {op_class!r}; known: {', '.join(OP_CLASSES)}")
        return self.tolerances[(op_class, dtype_key(dtype))]

    def model_factor(self, dtype: object) -> float:
        """How far compiled RMS error may exceed eager's against float64, for ``dtype``."""
        key = dtype_key(dtype)
        if key not in self.model_factors:
            raise ContractError(
                f"no model factor for {key}: only {', '.join(FACTOR_DTYPES)} are anchored on "
                "float64; other dtypes are judged by the op-class tolerances alone"
            )
        return self.model_factors[key]

    def model_floor(self, dtype: object) -> float:
        """The anchored budget's floor for ``dtype``, in units of unit roundoff x largest value."""
        self.model_factor(dtype)  # NOTE: same rows, same error for the others.
        return self.model_floors[dtype_key(dtype)]

    def model_tail_factor(self, dtype: object) -> float:
        """How far compiled worst error may exceed eager's against float64, for ``dtype``."""
        self.model_factor(dtype)
        return self.model_tail_factors[dtype_key(dtype)]


def dtype_key(dtype: object) -> str:
    """The contract's dtype row for ``dtype``: ``torch.int32`` -> ``"integer"`` and so on.

    Example:
        >>> dtype_key("torch.float32"), dtype_key("int8"), dtype_key("half")
        ('float32', 'integer', 'float16')
    """
    name = str(dtype).removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name in DTYPES:
        return name
    if name in _INTEGER_NAMES or name in ("long", "int", "short"):
        return "integer"
    raise ContractError(f"dtype {name!r} has no row in the contract; rows: {', '.join(DTYPES)}")


def parse(text: str, source: str = "<string>") -> Contract:
    """Parse and validate contract TOML text; raise :class:`ContractError` naming what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"{source}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise ContractError(f"{source}: not valid TOML: nested too deep") from None
    try:
        return from_data(data, source)
    except RecursionError:  # NOTE: _freeze walks the values; TOML cannot nest this deep here
        raise ContractError(f"{source}: values nested too deep") from None


def from_data(data: Mapping[str, Any], source: str = "<data>") -> Contract:
    """Validate an already-parsed contract mapping and build the :class:`Contract`."""

    def fail(msg: str) -> ContractError:
        return ContractError(f"{source}: {msg}")

    schema = data.get("schema_version")
    if schema != SCHEMA_VERSION:
        raise fail(f"schema_version must be {SCHEMA_VERSION}, got {schema!r}")
    version = data.get("version")
    if not isinstance(version, str) or not version:
        raise fail("version must be a non-empty string")
    tolerances = _parse_ops(data.get("op"), fail)
    factors, floors, tails = _parse_model(data.get("model"), fail)
    model = _table(data["model"], "model", fail)
    noise_bits = _positive(model.get("noise_bits"), "model.noise_bits", fail)
    baseline = _parse_layouts(model.get("baseline_layouts"), fail)
    bitwise = _table(data.get("bitwise"), "bitwise", fail).get("order_preserving")
    if not isinstance(bitwise, bool):
        raise fail("bitwise.order_preserving must be true or false")
    grad = _table(data.get("gradcheck"), "gradcheck", fail)
    spec = GradcheckSpec(
        eps=_positive(grad.get("eps"), "gradcheck.eps", fail, allow_zero=False),
        rtol=_positive(grad.get("rtol"), "gradcheck.rtol", fail),
        atol=_positive(grad.get("atol"), "gradcheck.atol", fail),
    )
    changelog = _parse_changelog(data.get("changelog"), fail)
    if version not in {entry.version for entry in changelog}:
        raise fail(f"version {version!r} has no [[changelog]] entry")
    return Contract(
        version=version,
        schema_version=schema,
        tolerances=MappingProxyType(tolerances),
        model_factors=MappingProxyType(factors),
        model_floors=MappingProxyType(floors),
        model_tail_factors=MappingProxyType(tails),
        noise_bits=noise_bits,
        baseline_layouts=baseline,
        bitwise_order_preserving=bitwise,
        gradcheck=spec,
        changelog=changelog,
        source=source,
        data=_freeze(data),
    )


def _table(value: Any, name: str, fail: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(f"missing table [{name}]")
    return value


def _positive(value: Any, key: str, fail: Any, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(f"{key} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise fail(f"{key} must be finite and {bound}, got {value!r}")
    return number


def _parse_ops(value: Any, fail: Any) -> dict[tuple[str, str], Tolerance]:
    ops = _table(value, "op", fail)
    unknown = sorted(set(ops) - set(OP_CLASSES))
    if unknown:
        raise fail(f"unknown op class {unknown[0]!r} in [op]; known: {', '.join(OP_CLASSES)}")
    out: dict[tuple[str, str], Tolerance] = {}
    for op_class in OP_CLASSES:
        rows = _table(ops.get(op_class), f"op.{op_class}", fail)
        extra = sorted(set(rows) - set(DTYPES))
        if extra:
            raise fail(f"op.{op_class}: unknown dtype {extra[0]!r}; rows: {', '.join(DTYPES)}")
        for dtype in DTYPES:
            if dtype not in rows:
                raise fail(f"op.{op_class}: missing dtype {dtype!r}")
            out[(op_class, dtype)] = _parse_row(rows[dtype], f"op.{op_class}.{dtype}", dtype, fail)
    return out


def _parse_row(row: Any, key: str, dtype: str, fail: Any) -> Tolerance:
    if not isinstance(row, Mapping):
        raise fail(f"{key} must be a table")
    extra = sorted(set(row) - {"rtol", "atol", "accum", "nondeterministic"})
    if extra:
        raise fail(f"{key}: unknown field {extra[0]!r}")
    rtol = _positive(row.get("rtol"), f"{key}.rtol", fail)
    atol = _positive(row.get("atol"), f"{key}.atol", fail)
    accum = row.get("accum")
    if accum not in _ACCUM_OK[dtype]:
        raise fail(
            f"{key}.accum must be one of {', '.join(_ACCUM_OK[dtype])} "
            f"(never narrower than {dtype}), got {accum!r}"
        )
    nondet = row.get("nondeterministic")
    if not isinstance(nondet, bool):
        raise fail(f"{key}.nondeterministic must be true or false")
    if dtype not in FLOAT_DTYPES and (rtol or atol):
        raise fail(f"{key}: {dtype} results do not round, rtol and atol must be 0")
    return Tolerance(rtol, atol, str(accum), nondet)


def _parse_model(
    value: Any, fail: Any
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    model = _table(value, "model", fail)
    factors = _per_dtype(model, "factor", fail)
    tails = _per_dtype(model, "tail_factor", fail)
    for dtype, factor in factors.items():
        if factor < 1.0:
            raise fail(f"model.factor.{dtype} must be >= 1 (eager itself meets factor 1)")
        if tails[dtype] < factor:
            raise fail(
                f"model.tail_factor.{dtype} must be >= model.factor.{dtype}: a worst error is "
                "a noisier statistic than an RMS error"
            )
    return factors, _per_dtype(model, "floor", fail), tails


def _parse_layouts(value: Any, fail: Any) -> tuple[str, ...]:
    if value is None:
        raise fail("missing model.baseline_layouts (a list of layout names, possibly empty)")
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise fail(f"model.baseline_layouts must be a list of layout names, got {value!r}")
    unknown = sorted(set(value) - set(LAYOUTS))
    if unknown:
        raise fail(
            f"model.baseline_layouts: unknown layout {unknown[0]!r}; known: {', '.join(LAYOUTS)}"
        )
    if len(set(value)) != len(value):
        raise fail("model.baseline_layouts: a layout is named twice")
    return tuple(value)


def _per_dtype(model: Mapping[str, Any], name: str, fail: Any) -> dict[str, float]:
    table = _table(model.get(name), f"model.{name}", fail)
    extra = sorted(set(table) - set(FACTOR_DTYPES))
    if extra:
        raise fail(f"model.{name}: unknown dtype {extra[0]!r}")
    out: dict[str, float] = {}
    for dtype in FACTOR_DTYPES:
        if dtype not in table:
            raise fail(f"model.{name}: missing dtype {dtype!r}")
        out[dtype] = _positive(table[dtype], f"model.{name}.{dtype}", fail)
    return out


def _parse_changelog(value: Any, fail: Any) -> tuple[ChangelogEntry, ...]:
    if not isinstance(value, list) or not value:
        raise fail("missing [[changelog]]: every contract version needs an entry")
    entries = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise fail(f"changelog[{i}] must be a table")
        reason = item.get("reason")
        changes = item.get("changes", [])
        if not isinstance(reason, str) or not reason.strip():
            raise fail(f"changelog[{i}].reason must be a non-empty string")
        if not isinstance(changes, list) or not all(isinstance(c, str) for c in changes):
            raise fail(f"changelog[{i}].changes must be a list of key strings")
        if not isinstance(item.get("version"), str) or "date" not in item:
            raise fail(f"changelog[{i}] needs a version string and a date")
        entries.append(ChangelogEntry(item["version"], str(item["date"]), reason, tuple(changes)))
    return tuple(entries)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
