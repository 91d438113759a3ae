"""NaN, +-0 and +-inf through everything the Stax backend executes, against eager.

The op database's samples (every float dtype an op declares) get special values written into
each floating operand in turn, then into all of them at once, at random element positions among
random finite values; each variant is compiled by Stax (native kernels, reductions, externs) and
compared with eager PyTorch on the same inputs. Fused chains (conv/linear -> every activation,
add -> relu, x * s -> clamp, a residual conv -> add -> relu) go through ``plait.compile`` under
``torch.no_grad()``.

Judgement, per element: NaN must be NaN, an infinity the same infinity, a zero a zero of the
same sign; other finite values within the contract's tolerance for the op class. Eager does not
always agree with itself: where its answer depends on the layout it is given (``maximum`` of
+0 and -0 returns the first operand in its scalar loop and the second in its vector loop;
``gelu(inf)`` is inf in its ATen loop and NaN through oneDNN), either of eager's answers, on
contiguous or on strided copies of the same values, is accepted: nothing else is.

The ops come from the codegen's own tables (scalar rules, reduction templates, extern rules,
oneDNN post-ops): a new op without special-value samples fails
:func:`test_every_codegen_op_is_covered`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
import plait.contract
from plait.codegen.extern import EXTERN_RULES
from plait.codegen.onednn_postops import INEXACT, UNARY
from plait.codegen.reductions import TEMPLATES
from plait.codegen.scalar import RULES
from plait.ir import Graph, interpret
from plait.ir.ops import get_op
from tests.codegen.stax_helpers import (
    BATCH_GROUP,
    TRITON_STAND_INS,
    Batch,
    compile_in_batch,
    evaluate64,
    graph_of,
    op_class,
)
from tests.ir import opdb
from tests.util import needs_bf16

SPECIALS = (float("nan"), 0.0, -0.0, float("inf"), float("-inf"))


def _draws_random(sample: opdb.Sample) -> bool:
    """Samples that draw random numbers are not comparable with eager value by value."""
    return bool(sample.attrs.get("train")) or bool(sample.attrs.get("dropout_p"))


def codegen_ops() -> set[str]:
    """Every op the Stax backend executes by its own code or an extern call."""
    return set(RULES) | set(TEMPLATES) | set(EXTERN_RULES)


def _float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0


def _tensors(args: Sequence[Any]) -> list[tuple[int, int | None]]:
    """(position, index in a list operand or None) of each floating tensor operand."""
    out: list[tuple[int, int | None]] = []
    for i, a in enumerate(args):
        if isinstance(a, list):
            out += [(i, j) for j, t in enumerate(a) if _float(t)]
        elif _float(a):
            out.append((i, None))
    return out


def with_specials(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A copy of ``t`` (same layout) with every special value at random positions (about one
    element in six, each kind at least once where there is room)."""
    flat = t.detach().clone().contiguous().view(-1)
    n = flat.numel()
    k = min(n, max(len(SPECIALS), n // 6))
    where = torch.randperm(n, generator=gen)[:k]
    kinds = torch.randperm(k, generator=gen) % len(SPECIALS)
    for pos, kind in zip(where.tolist(), kinds.tolist()):
        flat[pos] = SPECIALS[kind]
    out = flat.view(t.shape)
    if not t.is_contiguous():
        strided = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        return strided.copy_(out) if _dense_strides(t) else _spread(out)
    return out


def _dense_strides(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last)


def _spread(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous tensor with ``t``'s values (every other element of a wider one)."""
    if t.dim() == 0:
        return t
    wide = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype)
    out = wide[..., ::2]
    out.copy_(t)
    return out


def strided_copy(t: Any) -> Any:
    """The same values in a non-contiguous layout (eager takes its other code paths)."""
    if isinstance(t, list):
        return [strided_copy(x) for x in t]
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() <= 1:
        return t
    return _spread(t.contiguous())


# --- judgement ------------------------------------------------------------------------------
def _acceptable(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """Per element: ``got`` may stand for ``want`` (the rule in the module docstring)."""
    if not want.is_floating_point():
        return got == want
    g, w = got.double(), want.double()
    both_nan = g.isnan() & w.isnan()
    special = g.isnan() | w.isnan() | g.isinf() | w.isinf()
    same_special = both_nan | (g.isinf() & w.isinf() & (g == w))
    zeros = (g == 0) & (w == 0)
    same_zero = zeros & (torch.signbit(g) == torch.signbit(w))
    finite = ~special & ~zeros
    close = (g - w).abs() <= atol + rtol * w.abs()
    return torch.where(special, same_special, torch.where(zeros, same_zero, finite & close))


def _near_anchor(got: torch.Tensor, anchor: Any, rtol: float, atol: float) -> torch.Tensor:
    """Finite nonzero elements within the budget of the float64 result (the gate's anchor: a
    16-bit eager result can be further from the truth than the budget is wide)."""
    if not isinstance(anchor, torch.Tensor) or not got.is_floating_point():
        return torch.zeros(got.shape, dtype=torch.bool)
    g, a = got.double(), anchor.double().to(got.dtype).double()
    return g.isfinite() & a.isfinite() & ((g - a).abs() <= atol + rtol * a.abs())


def assert_matches_eager(
    got: Sequence[Any],
    wants: Sequence[Sequence[Any]],
    op_class_name: str,
    what: str,
    anchor: Sequence[Any] | None = None,
) -> None:
    """``got`` against eager's answers ``wants`` (one per layout eager was given); finite
    values may instead be close to ``anchor`` (the float64 result)."""
    for k, g in enumerate(got):
        options = [w[k] for w in wants]
        if not isinstance(g, torch.Tensor):
            assert any(g == o for o in options), f"{what}: output {k}: {g!r} vs {options!r}"
            continue
        first = options[0]
        assert g.shape == first.shape and g.dtype == first.dtype, f"{what}: output {k}"
        tol = plait.contract.load().tolerance(op_class_name, g.dtype)
        ok = torch.zeros(g.shape, dtype=torch.bool)
        for o in options:
            ok |= _acceptable(g, o, tol.rtol, tol.atol)
        if anchor is not None and g.is_floating_point():
            # NOTE: only between finite values, never to excuse a zero of the other sign.
            finite = g.isfinite() & first.isfinite() & ~((g == 0) & (first == 0))
            ok |= finite & _near_anchor(g, anchor[k], tol.rtol, tol.atol)
        if not bool(ok.all()):
            at = tuple((~ok).nonzero()[0].tolist())
            alts = ", ".join(repr(float(o[at])) for o in options)
            raise AssertionError(
                f"{what}: output {k} differs from eager at {at}: got {float(g[at])!r}, "
                f"eager {alts} ({int((~ok).sum())} of {g.numel()} elements)"
            )


# --- the op database with special values -----------------------------------------------------
@dataclass
class Case:
    op: str
    dtype: torch.dtype
    sample: opdb.Sample
    where: str


def _variants(sample: opdb.Sample, seed: int) -> Iterator[tuple[opdb.Sample, str]]:
    """``sample`` with special values in each floating operand alone, then in all of them."""
    slots = _tensors(sample.args)
    gen = torch.Generator().manual_seed(seed)
    choices: list[list[tuple[int, int | None]]] = [[s] for s in slots]
    if len(slots) > 1:
        choices.append(slots)
    for chosen in choices:
        args = [list(a) if isinstance(a, list) else a for a in sample.args]
        for i, j in chosen:
            if j is None:
                args[i] = with_specials(args[i], gen)
            else:
                args[i][j] = with_specials(args[i][j], gen)
        where = "all operands" if len(chosen) > 1 else f"operand {chosen[0]}"
        yield replace(sample, args=args), where


def special_cases() -> list[Case]:
    out = []
    for op, dtype in opdb.cases():
        if not dtype.is_floating_point or op not in codegen_ops() or op in TRITON_STAND_INS:
            continue
        for n, sample in enumerate(opdb.samples(op, dtype)):
            if _draws_random(sample):
                continue
            for variant, where in _variants(sample, seed=n):
                out.append(Case(op, dtype, variant, where))
    return out


CASES = special_cases()
OPS = sorted({c.op for c in CASES})


def _takes_floats(op: str) -> bool:
    """Ops on integers and bool only (bitwise_and, ...) have no special values to keep."""
    return any(d.is_floating_point for d in get_op(op).dtypes)


def test_every_codegen_op_is_covered() -> None:
    """Each op the codegen can execute has special-value cases (a new op must get samples)."""
    # NOTE: an aten_factory node has no tensor operand to hold a special value
    # NOTE: the Triton stand-ins follow CUDA eager, not the CPU eager judged here:
    # tests/codegen/test_cuda_batch_norm_special_values.py judges them with special values
    missing = sorted(
        {op for op in codegen_ops() if _takes_floats(op)}
        - set(OPS)
        - {"aten_factory", *TRITON_STAND_INS}
    )
    assert not missing, (
        f"no special-value cases for {missing}: add float samples to tests/ir/opdb.py"
    )


Compiled = dict[str, list[tuple[Case, Graph, Any, list[torch.Tensor]]]]


def _items() -> list[tuple[Graph, tuple[Case, list[torch.Tensor]]]]:
    out = []
    for c in CASES:
        graph, inputs = graph_of(c.sample)
        out.append((graph, (c, inputs)))
    return out


# NOTE: built with the op database's samples (tests/codegen/test_opdb.py), whose kernels these
# variants' graphs mostly share
compile_in_batch("special-values", _items)


@pytest.fixture(scope="module")
def compiled(stax_batch: Batch) -> Compiled:
    out: Compiled = {}
    for (c, inputs), graph, program in stax_batch["special-values"]:
        out.setdefault(c.op, []).append((c, graph, program, inputs))
    return out


@pytest.mark.slow  # NOTE: the batch compiles about 2000 one-node graphs for this module
@pytest.mark.xdist_group(BATCH_GROUP)
@pytest.mark.parametrize("op", OPS)
def test_op_keeps_special_values(compiled: Compiled, op: str) -> None:
    for case, graph, program, inputs in compiled[op]:
        with torch.no_grad():
            got = program(*inputs)
            # NOTE: eager (each op's reference is PyTorch's own call) on contiguous and on
            # strided copies of the same values.
            wants = [
                interpret(graph, [t.contiguous() for t in inputs]),
                interpret(graph, [strided_copy(t) for t in inputs]),
            ]
            anchor = evaluate64(graph)(*inputs)
        what = f"{op} {case.dtype} {case.sample.desc} (specials in {case.where})"
        assert_matches_eager(got, wants, op_class(op), what, anchor)


# --- fused chains through plait.compile ------------------------------------------------------
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
}


def test_every_post_op_activation_is_in_the_chains() -> None:
    """The oneDNN post-op table and its exclusions are what the chains below exercise."""
    table = set(UNARY) | {key.split(":")[0] for _, key in INEXACT}
    assert table <= set(ACTIVATIONS), sorted(table - set(ACTIVATIONS))


class LinearAct(nn.Module):
    def __init__(self, act: str) -> None:
        super().__init__()
        self.lin, self.act = nn.Linear(8, 6), ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


class ConvAct(nn.Module):
    def __init__(self, act: str) -> None:
        super().__init__()
        self.conv, self.act = nn.Conv2d(3, 4, 3, padding=1), ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


class Residual(nn.Module):
    """conv -> add(residual) -> relu, the fused binary post-op path."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + x)


class AddRelu(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + y)


class ScaleClamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 1.5).clamp(-1.0, 2.0) + torch.clamp(x, min=0.0) - torch.clamp(x, max=-0.0)


class NativeMath(nn.Module):
    """Rounding, signs, NaN-ignoring max, remainder, predicates and libm in one kernel."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        exact = torch.fmax(torch.round(x * 4) / 4, torch.copysign(x.frac(), -y))
        exact = torch.where(torch.isfinite(y), exact, torch.remainder(x, 1.5))
        return exact + torch.atan2(torch.sin(x), y)


Chain = tuple[str, Callable[[], nn.Module], tuple[tuple[int, ...], ...], str]


def _chains() -> list[Chain]:
    out: list[Chain] = []
    for act in ACTIVATIONS:
        out.append((f"linear-{act}", lambda a=act: LinearAct(a), ((5, 8),), "matmul"))
        out.append((f"conv-{act}", lambda a=act: ConvAct(a), ((2, 3, 6, 5),), "conv"))
    out.append(("conv-add-relu", Residual, ((2, 4, 6, 5),), "conv"))
    out.append(("add-relu", AddRelu, ((4, 7), (4, 7)), "pointwise"))
    out.append(("scale-clamp", ScaleClamp, ((6, 9),), "pointwise"))
    out.append(("native-math", NativeMath, ((5, 8), (8,)), "pointwise"))
    return out


CHAINS = _chains()


def _layouts(x: torch.Tensor) -> list[torch.Tensor]:
    alt = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else strided_copy(x)
    return [x, alt]


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.xdist_group("stax-special-values")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("name", "make", "shapes", "cls"), CHAINS, ids=[c[0] for c in CHAINS])
def test_fused_chain_keeps_special_values(
    name: str,
    make: Callable[[], nn.Module],
    shapes: tuple[tuple[int, ...], ...],
    cls: str,
    dtype: torch.dtype,
) -> None:
    """float32 and bfloat16 (oneDNN's post-ops run in both)."""
    if dtype == torch.bfloat16 and needs_bf16.args[0]:
        pytest.skip(needs_bf16.kwargs["reason"])
    torch.manual_seed(0)
    model = make().eval().to(dtype)
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(11)
    for draw in range(3):
        xs = [(torch.randn(s, generator=gen) * 3).to(dtype) for s in shapes]
        # NOTE: draw 0 is finite (the capture), then special values in every input.
        if draw:
            xs = [with_specials(x, gen) for x in xs]
        with torch.no_grad():
            got = compiled(*xs)
            wants = [[model(*alts)] for alts in zip(*(_layouts(x) for x in xs))]
            # NOTE: the float64 anchor for finite values (a bfloat16 residual add fused into
            # the conv rounds once, eager twice: near-cancelling sums differ by more than the
            # budget from eager, not from the truth).
            anchor = [copy.deepcopy(model).double()(*(x.double() for x in xs))]
        assert_matches_eager([got], wants, cls, f"{name} draw {draw}", anchor)


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("kind", ["linear", "conv2d"])
def test_nan_reaches_the_output_of_a_relu_after_an_extern(kind: str) -> None:
    """The reported case: Linear(3, 2) -> ReLU on [[nan, 1, 1]] returned [[0, 0]]."""
    torch.manual_seed(0)
    if kind == "linear":
        model: nn.Module = nn.Sequential(nn.Linear(3, 2), nn.ReLU()).eval()
        x = torch.randn(1, 3)
    else:
        model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU()).eval()
        x = torch.randn(1, 2, 5, 5)
    compiled = plait.compile(model, backend="stax")
    with torch.no_grad():
        compiled(x)
        x = torch.randn(x.shape)
        x.view(-1)[0] = float("nan")
        got, want = compiled(x), model(x)
    assert want.isnan().any()
    assert torch.equal(got.isnan(), want.isnan()), f"{got} vs {want}"
