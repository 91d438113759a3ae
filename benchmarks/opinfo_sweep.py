"""One OpInfo sample through ``plait.compile``, judged against eager PyTorch and classified.

Each sample of PyTorch's OpInfo database (``op_db``) becomes a function of its tensors (every other
argument is a constant of the program) and is compiled with plait's default backend. The compiled
function is called three times, each time beside eager on clones of the same inputs:

1. on the sample itself (the call that captures);
2. on a second draw of the same sample: the op's sample generator run again under another seed
   (same shapes, dtypes and constants; index tensors valid by construction), so a result baked
   into the program at capture shows up as a mismatch;
3. on that second draw with NaN, +inf, -inf and -0.0 written into every floating-point tensor
   (judged only where eager accepts those values; not drawn for the few ops whose eager kernels
   crash the process on them), so kernels that lose a NaN, an infinity or a sign show up.

Outcomes (:data:`CATEGORIES`): ``pass``; ``mismatch`` (a result different from eager under the
numerical contract, with no error: a silent mismatch, whatever fallback was recorded);
``signed_zero`` (only the sign of a zero differs); ``error`` (a plait error type with its message);
``fallback`` (right results, but the manifest records an opaque node or a whole-program eager
fallback); ``crash`` (any other exception from the compiled call); ``random`` (eager's call draws
from torch's RNG, leaving it in another state, or its result changes with the seed, or OpInfo
flags it uninitialized: structure, shapes and dtypes are judged, and whether the values equal
eager's under the same seeds is noted; OpInfo's random ops that seed the RNG inside the op and
restore it are deterministic, so they are judged like any op); ``not_judged`` (eager rejects the
sample, or it has sparse tensors: the sweep judges dense tensors only); ``timeout`` (set by the
sweep's pool).

Example:
    >>> ops = {op_key(op): op for op in float32_ops()}
    >>> [r.category for r in run_op(ops["abs"], limit=1)]
    ['pass']
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import time
import types
import unittest
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

import plait
import plait.contract
from plait.conformance import Budget, Report
from plait.conformance.compare import compare

CATEGORIES = (
    "pass",
    "mismatch",
    "signed_zero",
    "error",
    "fallback",
    "crash",
    "timeout",
    "random",
    "not_judged",
)
GRAD_MODES = ("no_grad", "grad")
SECOND_SEED = 1_000_003

_MATMUL = re.compile(
    r"^(mm|bmm|addmm|addbmm|baddbmm|addmv|addr|mv|matmul|dot|vdot|inner|outer|ger|einsum|"
    r"tensordot|chain_matmul|kron|nn\.functional\.(linear|bilinear)|__rmatmul__|linalg\..*|"
    r"cholesky.*|lu.*|qr|svd.*|pinverse|inverse|det|logdet|slogdet|triangular_solve|"
    r"geqrf|ormqr|cdist|pca_lowrank|matrix_exp|trace)$"
)
_NORMALIZATION = re.compile(
    r"(norm|softmax|softmin|log_softmax|normalize|std|var|logsumexp|cumulative_trapezoid)"
)
_DATA_MOVEMENT = re.compile(
    r"^(as_strided.*|broadcast_.*|cat|chunk|column_stack|contiguous|clone|diag.*|dsplit|dstack|"
    r"expand.*|flatten|flip.*|gather|hsplit|hstack|index_.*|masked_select|movedim|moveaxis|"
    r"narrow.*|permute|ravel|repeat.*|reshape.*|roll|rot90|select.*|split.*|squeeze.*|stack|"
    r"swapaxes|swapdims|t|take.*|tensor_split|tile|transpose|tril|triu|unbind|unflatten|"
    r"unfold.*|unsqueeze|view.*|vsplit|vstack|T|H|mT|mH|scatter|"
    r"nn\.functional\.(pad|pixel_shuffle|pixel_unshuffle|unfold|fold|embedding|one_hot))$"
)


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database. ``expecttest`` (a test-only dependency the database imports for
    its TestCase base class, not for the OpInfos) is stubbed when it is not installed."""
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            stub = types.ModuleType("expecttest")
            stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
            sys.modules["expecttest"] = stub
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def float32_ops() -> list[Any]:
    """Every OpInfo with float32 support on the CPU."""
    return [op for op in load_op_db() if torch.float32 in op.supported_dtypes("cpu")]


def op_key(op: Any) -> str:
    """The OpInfo's unique name: ``name`` or ``name.variant``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def is_random(op: Any) -> bool:
    """True when OpInfo flags eager's output as nondeterministic (uninitialized memory).

    NOTE: random ops are not listed by name: OpInfo seeds most of them inside the op
    (``wrapper_set_seed``), and then eager is deterministic and plait must match it; a sample whose
    eager result still changes with the seed is found by running eager under two seeds."""
    return bool(op.has_nondeterministic_output)


def op_class(op: Any) -> str:
    """The numerical contract's op class that judges ``op``'s results."""
    from torch.testing._internal.opinfo.core import (
        BinaryUfuncInfo,
        ReductionOpInfo,
        UnaryUfuncInfo,
    )

    name = op.name
    if "conv" in name:
        return "conv"
    if "scaled_dot_product_attention" in name or "multi_head_attention" in name:
        return "attention"
    if _MATMUL.match(name):
        return "matmul"
    if _NORMALIZATION.search(name):
        return "normalization"
    if _DATA_MOVEMENT.match(name):
        return "data_movement"
    if isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo)):
        return "pointwise"
    if isinstance(op, ReductionOpInfo) or name.startswith(("cum", "sum", "prod", "mean")):
        return "reduction"
    return "model"


@dataclass
class Outcome:
    """What one (op, sample, grad mode) did."""

    op: str
    index: int
    grad_mode: str
    category: str
    desc: str
    detail: str = ""
    draw: str = ""  # which call decided the category
    fallbacks: list[str] = field(default_factory=list)
    # NOTE: the typed ATen extern nodes the compiled program ran (PyTorch's kernels, not a
    # fallback, but not plait's generated code either): ``aten.<name>`` -> count
    externs: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def samples(op: Any, seed: int) -> list[Any]:
    """The op's float32 CPU samples, drawn under ``seed``."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(op.sample_inputs("cpu", torch.float32, requires_grad=False))


def describe(sample: Any) -> str:
    """A short description of a sample: tensors as dtype[shape], other values as they are."""

    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            dt = str(v.dtype).removeprefix("torch.")
            if v.layout != torch.strided:
                return f"{dt}{list(v.shape)}({str(v.layout).removeprefix('torch.')})"
            return f"{dt}{list(v.shape)}" + ("" if v.is_contiguous() else "(strided)")
        if isinstance(v, (list, tuple)):
            inner = ", ".join(one(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner})"
        text = repr(v)
        return text if len(text) < 40 else text[:37] + "..."

    parts = [one(sample.input)] + [one(a) for a in sample.args]
    parts += [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def _flatten(sample: Any) -> tuple[list[Any], Any]:
    return pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))


def _program(op: Any, spec: Any, leaves: list[Any]) -> tuple[Callable[..., Any], list[int]]:
    """The sample as a function of its tensor leaves; every other leaf is a constant."""
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    fixed = list(leaves)
    fn = op.op

    def program(*tensors: torch.Tensor) -> Any:
        filled = list(fixed)
        for i, t in zip(where, tensors, strict=True):
            filled[i] = t
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return fn(inp, *args, **kwargs)

    return program, where


def _tensors(leaves: list[Any], where: list[int]) -> list[torch.Tensor]:
    return [leaves[i].clone() for i in where]


def _same_structure(a: list[Any], b: list[Any], spec_a: Any, spec_b: Any) -> bool:
    if spec_a != spec_b or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or x.layout != y.layout:
                return False
            if x.layout == torch.strided and x.stride() != y.stride():
                return False
        elif not _equal_plain(x, y):
            return False
    return True


def _equal_plain(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    try:
        return bool(x == y) and type(x) is type(y)
    except Exception:
        return x is y


def redrawn(leaves: list[Any], where: list[int], seed: int) -> list[torch.Tensor]:
    """Fresh values of the same shapes and dtypes, when the sample generator could not give any:
    floats uniformly in the range of the originals, integers and bools permuted (same values,
    so indices stay in range)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in where:
        t = leaves[i]
        if t.layout != torch.strided:
            out.append(t.clone())
        elif t.dtype.is_floating_point and t.numel() > 0:
            finite = t[torch.isfinite(t)]
            lo = float(finite.min()) if finite.numel() else -1.0
            hi = float(finite.max()) if finite.numel() else 1.0
            lo, hi = (lo, hi) if hi > lo else (lo - 1.0, hi + 1.0)
            fresh = lo + (hi - lo) * torch.rand(t.shape, generator=g, dtype=torch.float64)
            new = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
            new.copy_(fresh)
            out.append(new)
        elif t.numel() > 1:
            perm = torch.randperm(t.numel(), generator=g)
            new = t.clone()
            new.view(-1).copy_(t.reshape(-1)[perm]) if new.is_contiguous() else new.copy_(
                t.reshape(-1)[perm].reshape(t.shape)
            )
            out.append(new)
        else:
            out.append(t.clone())
    return out


_SPECIALS = (math.nan, math.inf, -math.inf, -0.0)
# NOTE: eager itself dies on NaN/inf here (oneMKL's sgebal rejects them, then a segfault; torch
# 2.13 CPU), so the special values are not drawn for these ops.
_EAGER_CRASHES_ON_SPECIALS = re.compile(r"^linalg\.(eig|eigvals)$")


def with_specials(tensors: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Copies of ``tensors`` with NaN, +inf, -inf and -0.0 at random positions of each float
    tensor (at most a quarter of its elements)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in tensors:
        t = t.clone()
        if t.layout == torch.strided and t.dtype.is_floating_point and t.numel() > 0:
            flat = t.view(-1) if t.is_contiguous() else None
            positions = torch.randperm(t.numel(), generator=g)[: max(1, t.numel() // 4)]
            values = torch.tensor([_SPECIALS[i % 4] for i in range(len(positions))], dtype=t.dtype)
            if flat is not None:
                flat[positions] = values
            else:
                dense = t.reshape(-1).clone()
                dense[positions] = values
                t.copy_(dense.reshape(t.shape))
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# Judging one call


class Judged:
    """The verdict on one call: ``None`` when it matches, else what differed."""

    def __init__(self, budget_for: Callable[[torch.dtype], Budget], contract_version: str) -> None:
        self.budget_for = budget_for
        self.version = contract_version

    def __call__(self, expected: Any, actual: Any) -> tuple[str, str] | None:
        """``(kind, message)`` for the first difference, kind ``mismatch`` or ``signed_zero``."""
        e_leaves, e_spec = pytree.tree_flatten(expected)
        a_leaves, a_spec = pytree.tree_flatten(actual)
        if type(expected) is not type(actual):
            return "mismatch", (
                f"result type {type(actual).__module__}.{type(actual).__qualname__}, "
                f"eager's {type(expected).__module__}.{type(expected).__qualname__}"
            )
        if e_spec != a_spec:
            return "mismatch", f"result structure {a_spec}, eager's {e_spec}"
        signed: str | None = None
        for i, (e, a) in enumerate(zip(e_leaves, a_leaves)):
            where = f"output leaf {i}"
            if isinstance(e, torch.Tensor) and type(a) is not torch.Tensor:
                if not isinstance(a, torch.Tensor):
                    return "mismatch", f"{where}: {type(a).__name__}, eager returned a tensor"
                return "mismatch", f"{where}: a {type(a).__qualname__}, not a plain torch.Tensor"
            if isinstance(e, torch.Tensor) and e.layout != a.layout:
                return "mismatch", f"{where}: layout {a.layout}, eager's {e.layout}"
            if isinstance(e, torch.Tensor) and e.layout != torch.strided:
                e, a = e.to_dense(), a.to_dense()  # NOTE: sparse results compared by value
            report = Report(contract_version=self.version)
            dtype = e.dtype if isinstance(e, torch.Tensor) else torch.float32
            compare(report, where, "call", expected=e, actual=a, budget=self.budget_for(dtype))
            if report.errors:
                return "mismatch", str(report.errors[0])
            if signed is None and isinstance(e, torch.Tensor) and e.dtype.is_floating_point:
                signed = _signed_zero(where, e, a)
        return ("signed_zero", signed) if signed else None


def _signed_zero(where: str, e: torch.Tensor, a: torch.Tensor) -> str | None:
    zeros = (e == 0) & (a == 0)
    differ = zeros & (torch.signbit(e) != torch.signbit(a))
    if not bool(differ.any()):
        return None
    idx = tuple(int(i) for i in differ.nonzero()[0])
    return f"{where}: signed zero differs at {int(differ.sum())} element(s), first {idx}: " + (
        f"eager {float(e[idx])!r}, compiled {float(a[idx])!r}"
    )


def judge_for(op: Any) -> Judged:
    """A judge with the contract's elementwise budget for ``op``'s class."""
    contract = plait.contract.load()
    cls = op_class(op)

    def budget(dtype: torch.dtype) -> Budget:
        try:
            tol = contract.tolerance(cls, dtype)
        except plait.contract.ContractError:  # complex and other dtypes without a row
            tol = contract.tolerance(cls, "float32" if dtype.is_complex else "integer")
        return Budget(tol, None, 0.0)

    return Judged(budget, contract.version)


# ---------------------------------------------------------------------------------------------
# Running one op


def _is_plait_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "plait"


def _one_line(text: str, limit: int = 300) -> str:
    text = " | ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exception_text(exc: BaseException) -> str:
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if "/plait/" in filename:
            where = f" [{filename.split('/plait/')[-1]}:{tb.tb_lineno}]"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {_one_line(str(exc))}{where}"


def _fallbacks(compiled: Any) -> list[str]:
    out = []
    explanation = plait.explain(compiled)
    for spec in explanation.specializations:
        for record in spec.manifest.fallbacks:
            if str(record.get("what", "")).startswith("node "):
                continue  # NOTE: the same opaque call again, per node
            out.append(_one_line(f"{record.get('what', '?')}: {record.get('reason', '?')}", 240))
    if explanation.limit_fallback is not None:
        out.append(_one_line(f"recompile limit: {explanation.limit_fallback['reason']}"))
    return sorted(set(out))


def _aten_externs(compiled: Any) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for spec in plait.explain(compiled).specializations:
        counts.update(spec.manifest.graph.get("aten_externs", {}))
    return dict(sorted(counts.items()))


def _grad_context(mode: str) -> Any:
    return torch.no_grad() if mode == "no_grad" else torch.enable_grad()


def _three_calls(
    op_key: str, leaves: list[Any], where: list[int], spec: Any, second: Any | None, index: int
) -> list[tuple[str, list[torch.Tensor]]]:
    """The capture's values, a fresh draw of the same sample, and that draw with special values
    (except for ops whose eager kernels crash the process on them)."""
    fresh = None
    if second is not None:
        leaves2, spec2 = _flatten(second)
        if _same_structure(leaves, leaves2, spec, spec2):
            fresh = [leaves2[i] for i in where]
    if fresh is None:
        fresh = redrawn(leaves, where, SECOND_SEED + index)
    calls = [
        ("call 1 (capture values)", [leaves[i] for i in where]),
        ("call 2 (fresh values)", fresh),
    ]
    if not _EAGER_CRASHES_ON_SPECIALS.match(op_key):
        calls.append(
            ("call 3 (fresh values with NaN/inf/-0)", with_specials(fresh, SECOND_SEED + index))
        )
    return calls


def run_sample(
    op: Any, first: Any, second: Any | None, index: int, grad_mode: str, *, options: Any = None
) -> Outcome:
    """Compile one sample and classify it (see the module docstring)."""
    start = time.perf_counter()
    leaves, spec = _flatten(first)
    program, where = _program(op, spec, leaves)
    outcome = Outcome(op_key(op), index, grad_mode, "pass", describe(first))
    if any(leaves[i].layout != torch.strided for i in where):
        outcome.category, outcome.detail = "not_judged", "a sparse tensor: dense tensors only"
        return outcome
    calls = _three_calls(outcome.op, leaves, where, spec, second, index)
    judge = judge_for(op)
    random = is_random(op)
    compiled = plait.compile(program, options=options if options is not None else {"cache": False})
    signed: tuple[str, str] | None = None
    draws_differ: tuple[str, str] | None = None
    with _grad_context(grad_mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, (label, tensors) in enumerate(calls):
            try:
                torch.manual_seed(index)
                before = torch.get_rng_state()
                with _counting_seeds() as seeds:
                    expected = program(*_tensors_copy(tensors))
                # NOTE: a call that draws from or reseeds torch's RNG is random.
                random = random or not torch.equal(before, torch.get_rng_state())
            except Exception as exc:
                if n == 0:
                    outcome.category, outcome.detail = "not_judged", _exception_text(exc)
                    break
                continue  # NOTE: eager rejects these values: nothing to judge them against
            if n == 0 and not random:
                random = _eager_is_random(program, tensors, expected, index, judge)
            try:
                torch.manual_seed(index)
                actual = compiled(*_tensors_copy(tensors))
            except Exception as exc:
                outcome.category = "error" if _is_plait_error(exc) else "crash"
                outcome.detail, outcome.draw = _exception_text(exc), label
                break
            verdict = _meta_verdict(expected, actual) if random else judge(expected, actual)
            if random and verdict is None and draws_differ is None:
                full = judge(expected, actual)
                draws_differ = (full[1], label) if full is not None else None
            if verdict is None:
                continue
            if verdict[0] == "mismatch":
                seeded = "the program seeds torch's RNG (torch.manual_seed); " if seeds else ""
                outcome.category, outcome.draw = "mismatch", label
                outcome.detail = seeded + verdict[1]
                break
            signed = signed or (verdict[1], label)
    if outcome.category == "pass":
        _settle(outcome, compiled, random, signed, draws_differ)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _settle(
    outcome: Outcome,
    compiled: Any,
    random: bool,
    signed: tuple[str, str] | None,
    draws_differ: tuple[str, str] | None,
) -> None:
    """The category of a sample whose calls all matched: random, signed zero, fallback or pass."""
    try:
        outcome.fallbacks = _fallbacks(compiled)
        outcome.externs = _aten_externs(compiled)
    except Exception as exc:  # NOTE: explain itself failing is a finding too
        outcome.category, outcome.detail = "crash", "plait.explain: " + _exception_text(exc)
        return
    if random:
        outcome.category = "random"
        if draws_differ is not None:
            outcome.detail = "values differ from eager's under the same seeds: " + draws_differ[0]
            outcome.draw = draws_differ[1]
        else:
            outcome.detail = "same values as eager under the same seeds"
    elif signed is not None:
        outcome.category, outcome.detail, outcome.draw = "signed_zero", *signed
    elif outcome.fallbacks:
        outcome.category, outcome.detail = "fallback", outcome.fallbacks[0]


@contextlib.contextmanager
def _counting_seeds() -> Iterator[list[int]]:
    """Records the seeds passed to ``torch.manual_seed`` inside the block (OpInfo's random ops
    seed inside the op, so eager is deterministic there and plait must give the same values)."""
    seeds: list[int] = []
    original = torch.manual_seed

    def counting(seed: int) -> Any:
        seeds.append(int(seed))
        return original(seed)

    torch.manual_seed = counting
    try:
        yield seeds
    finally:
        torch.manual_seed = original


def _eager_is_random(
    program: Callable[..., Any],
    tensors: list[torch.Tensor],
    expected: Any,
    seed: int,
    judge: Judged,
) -> bool:
    """True when eager under another RNG seed gives another result (a sample that draws random
    numbers from a generator of its own, say)."""
    torch.manual_seed(seed + 7919)
    try:
        again = program(*_tensors_copy(tensors))
    except Exception:
        return False
    return judge(expected, again) is not None


def _tensors_copy(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _meta_verdict(expected: Any, actual: Any) -> tuple[str, str] | None:
    """Random or uninitialized results: the structure, shapes and dtypes only."""
    e_leaves, e_spec = pytree.tree_flatten(expected)
    a_leaves, a_spec = pytree.tree_flatten(actual)
    if e_spec != a_spec:
        return "mismatch", f"result structure {a_spec}, eager's {e_spec}"
    for i, (e, a) in enumerate(zip(e_leaves, a_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return "mismatch", f"output leaf {i}: {type(a).__name__}, eager a tensor"
            if e.shape != a.shape or e.dtype != a.dtype:
                return "mismatch", (
                    f"output leaf {i}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
                )
    return None


def run_op(
    op: Any,
    *,
    start: int = 0,
    limit: int | None = None,
    grad_modes: tuple[str, ...] = ("no_grad",),
    options: Any = None,
) -> Iterator[Outcome]:
    """Every sample of ``op`` from ``start`` (at most ``limit``), in each grad mode."""
    try:
        first = samples(op, seed=0)
        second = samples(op, seed=SECOND_SEED)
    except Exception as exc:
        yield Outcome(op_key(op), 0, grad_modes[0], "not_judged", "sample generation failed",
                      _exception_text(exc))  # fmt: skip
        return
    stop = len(first) if limit is None else min(len(first), start + limit)
    for index in range(start, stop):
        other = second[index] if index < len(second) else None
        for mode in grad_modes:
            try:
                yield run_sample(op, first[index], other, index, mode, options=options)
            except Exception as exc:  # NOTE: the harness must classify, never stop
                yield Outcome(op_key(op), index, mode, "crash", describe(first[index]),
                              "outside the compiled call: " + _exception_text(exc))  # fmt: skip
