"""Results that are structseqs (``torch.return_types.*``), namedtuples, dataclasses, Hugging
Face ``ModelOutput`` and dicts are containers: a compiled program returns the same Python type
holding this call's tensors (never the capture's), bitwise equal to eager on fresh inputs, and
they pass between torch calls inside the program. An object plait cannot rebuild that holds a
traced tensor is refused loudly, never kept as a constant; a plain object that ``copy.copy``
rebuilds from its attributes is a container of them."""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.capture.helpers import assert_same
from tests.util import assert_bitwise

# --- every structseq type torch has ----------------------------------------------------------


def _resolve(name: str) -> Callable[..., Any]:
    """The torch function a return type is named after: ``linalg_qr`` -> ``torch.linalg.qr``."""
    if name.startswith("linalg_"):
        return getattr(torch.linalg, name.removeprefix("linalg_"))
    return getattr(torch, name)


def _matrix(seed: int) -> torch.Tensor:
    """A well-conditioned symmetric positive definite 4x4 matrix (every factorization works)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    return a @ a.T + 4 * torch.eye(4, dtype=torch.float64)


def _candidates(seed: int) -> list[tuple[Any, ...]]:
    """Argument lists tried in order; the first one eager accepts with the named result wins."""
    a = _matrix(seed)
    b = torch.randn(4, 2, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return [(a,), (a, 1), (a, 2), (b, a), (a, b), tuple(torch.linalg.lu_factor(a))]


def _structseq_cases() -> list[tuple[str, Callable[..., Any], int]]:
    cases = []
    for cls in torch.return_types.all_return_types:
        name = cls.__name__
        if name.endswith("_out"):
            continue  # NOTE: out= variants: plait refuses out= arguments (documented)
        fn = _resolve(name)
        for k, args in enumerate(_candidates(0)):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # NOTE: torch.qr's deprecation
                    got = fn(*args)
            except (RuntimeError, TypeError, ValueError):
                continue
            if type(got) is cls:
                cases.append((name, fn, k))
                break
        else:
            raise AssertionError(f"no candidate arguments give torch.return_types.{name}")
    return cases


STRUCTSEQ_CASES = _structseq_cases()


def test_every_return_type_is_covered() -> None:
    names = {c[0] for c in STRUCTSEQ_CASES}
    wanted = {c.__name__ for c in torch.return_types.all_return_types}
    assert names == {n for n in wanted if not n.endswith("_out")}
    assert len(names) >= 25


# NOTE: these select or rearrange their input's values: bitwise. The others are linear algebra
# through LAPACK, whose blocking may follow the alignment of its workspace (eager's own least
# squares differs in the last bit from run to run): the contract's matmul budget.
SELECTIONS = {
    "sort", "topk", "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin",
    "aminmax", "max", "min", "frexp", "histogram", "histogramdd",
}  # fmt: skip


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """The contract's matmul budget (linear algebra is matmul arithmetic), elementwise."""
    tol = plait.contract.load().tolerance("matmul", _real(want).dtype)
    g, w = _real(got), _real(want)
    scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
    bound = tol.atol * scale + tol.rtol * w.abs()
    assert g.shape == w.shape and g.dtype == w.dtype, what
    assert bool(((g - w).abs() <= bound).all()), f"{what}: {(g - w).abs().max()} over budget"


@pytest.mark.parametrize(("name", "fn", "k"), STRUCTSEQ_CASES, ids=[c[0] for c in STRUCTSEQ_CASES])
def test_structseq_result_is_fresh_each_call(name: str, fn: Callable[..., Any], k: int) -> None:
    """Bitwise equal to eager for selections, else within the contract's matmul budget."""

    def program(*args: Any) -> Any:
        return fn(*args)

    compiled = plait.compile(program, backend="eager")
    with warnings.catch_warnings():
        # NOTE: opaque nodes warn once (CaptureFallbackWarning); torch.qr warns it is deprecated
        warnings.simplefilter("ignore", UserWarning)
        for seed in (1, 2, 3):
            args = _candidates(seed)[k]
            got, want = compiled(*args), fn(*args)
            assert type(got) is type(want)
            exact = name in SELECTIONS
            pairs = zip(*map(torch.utils._pytree.tree_leaves, (tuple(got), tuple(want))))
            for i, (g, w) in enumerate(pairs):
                what = f"{name} seed {seed} [{i}]"
                if exact or (not g.is_floating_point() and not g.is_complex()):
                    assert_bitwise(_real(g), _real(w), what)
                else:
                    _close(g, w, what)
    program_ = compiled.specializations[0].program
    # NOTE: captured (opaque nodes), or the recorded fallback (max(dim): no IR op for indices)
    assert program_.has_graph or program_.fallback_reason, name


def test_structseq_gradients_reach_the_inputs() -> None:
    def program(x: torch.Tensor) -> Any:
        return torch.topk(x * 3, 2, dim=1)

    compiled = plait.compile(program, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed in (1, 2):
            x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            y = x.detach().clone().requires_grad_(True)
            got, want = compiled(x), program(y)
            assert_same(tuple(got), tuple(want))
            got.values.sum().backward()
            want.values.sum().backward()
            assert x.grad is not None
            assert_bitwise(x.grad, y.grad, "grad")


def test_structseq_passed_between_calls() -> None:
    def program(x: torch.Tensor) -> Any:
        pair = torch.sort(x, dim=1)
        return (
            torch.stack(pair.values.unsqueeze(0).unbind(0))
            + torch.cat(torch.aminmax(x, dim=1)).sum()
        )

    compiled = plait.compile(program, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed in (1, 2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
            assert_same(compiled(x), program(x))


# --- nested containers, as results and as arguments -----------------------------------------

Pair = namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass
class Box:
    first: Any
    second: Any = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    item: Any


def _containers(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    def wrap(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(kids, max_size=3),
            st.lists(kids, max_size=3).map(tuple),
            st.tuples(kids, kids).map(lambda t: Pair(*t)),
            st.tuples(kids, kids).map(lambda t: Box(*t)),
            kids.map(Frozen),
            st.tuples(kids, kids).map(lambda t: torch.return_types.sort(t)),
            st.dictionaries(st.sampled_from("abc"), kids, max_size=3),
            st.dictionaries(st.sampled_from("xyz"), kids, max_size=2).map(OrderedDict),
            st.dictionaries(st.sampled_from("pq"), kids, max_size=2).map(
                lambda d: defaultdict(list, d)
            ),
        )

    return st.recursive(leaf, wrap, max_leaves=8)


# A leaf is the index of a scale: the program returns x * scale there (or the scale itself).
STRUCTURES = _containers(st.one_of(st.integers(0, 3), st.just(None), st.just("tag")))


def _tree_map(leaf: Callable[[Any], Any], tree: Any) -> Any:
    """``leaf`` applied to every non-container of ``tree`` (the containers above), rebuilt."""

    def build(s: Any) -> Any:
        if isinstance(s, Pair):
            return Pair(*[build(v) for v in s])
        if isinstance(s, torch.return_types.sort):
            return type(s)([build(v) for v in s])
        if isinstance(s, (list, tuple)):
            return type(s)(build(v) for v in s)
        if isinstance(s, Box):
            return Box(build(s.first), build(s.second))
        if isinstance(s, Frozen):
            return Frozen(build(s.item))
        if isinstance(s, defaultdict):
            return defaultdict(s.default_factory, {k: build(v) for k, v in s.items()})
        if isinstance(s, dict):
            return type(s)((k, build(v)) for k, v in s.items())
        return leaf(s)

    return build(tree)


def _fill(shape: Any, x: torch.Tensor) -> Any:
    return _tree_map(lambda s: x * (s + 2) if isinstance(s, int) else s, shape)


def _same_structure(a: Any, b: Any, what: str = "output") -> None:
    assert type(a) is type(b), f"{what}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert_bitwise(a, b, what)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same_structure(getattr(a, f.name), getattr(b, f.name), f"{what}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), what
        if isinstance(a, defaultdict):
            assert a.default_factory is b.default_factory, what
        for k in a:
            _same_structure(a[k], b[k], f"{what}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            _same_structure(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


@settings(max_examples=40, deadline=None)
@given(shape=STRUCTURES)
def test_nested_results_are_rebuilt_with_this_calls_tensors(shape: Any) -> None:
    def program(x: torch.Tensor) -> Any:
        return _fill(shape, (x * 1.5).exp())

    compiled = plait.compile(program, backend="eager", fullgraph=True)
    for seed in (1, 2):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        _same_structure(compiled(x), program(x))


@settings(max_examples=40, deadline=None)
@given(shape=STRUCTURES)
def test_nested_arguments_are_inputs(shape: Any) -> None:
    def program(tree: Any) -> Any:
        return _tree_map(lambda t: t * 3 if isinstance(t, torch.Tensor) else t, tree)

    compiled = plait.compile(program, backend="eager", fullgraph=True)
    for seed in (1, 2):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        tree = _fill(shape, x)
        _same_structure(compiled(tree), program(tree))


# --- Hugging Face ModelOutput -----------------------------------------------------------------


class _Pooler(nn.Module):
    """A tiny module that returns a Hugging Face ModelOutput, like every HF model."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, with_hidden: bool = False) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        h = self.dense(x).tanh()
        return BaseModelOutputWithPooling(
            last_hidden_state=h,
            pooler_output=h[:, 0] * 2,
            hidden_states=(x, h) if with_hidden else None,
        )


@pytest.mark.parametrize("with_hidden", [False, True])
def test_model_output_is_rebuilt(with_hidden: bool) -> None:
    import transformers  # noqa: F401  (a dev dependency: installed wherever the tests run)

    torch.manual_seed(0)
    model = _Pooler()
    compiled = plait.compile(model, backend="eager", fullgraph=True)
    for seed in (1, 2):
        x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(seed))
        got, want = compiled(x, with_hidden=with_hidden), model(x, with_hidden=with_hidden)
        assert type(got) is type(want)
        assert list(got.keys()) == list(want.keys())
        for k in want:
            assert_same(got[k], want[k], k)
        assert_same(got.to_tuple(), want.to_tuple())


@pytest.mark.slow
def test_hugging_face_model_output_from_a_real_model() -> None:
    """A BertModel built from a config: its ModelOutput comes back with each call's tensors
    (today part of BERT runs eagerly: gather with a tensor keyword is the recorded fallback)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    model = transformers.BertModel(config).eval()
    compiled = plait.compile(model, backend="eager")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed in (1, 2):
            ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(seed))
            got, want = compiled(ids), model(ids)
            assert type(got) is type(want)
            assert list(got.keys()) == list(want.keys())
            for k in want:
                assert_same(got[k], want[k], k)


# --- plain objects are rebuilt from their attributes -----------------------------------------


class _Holder:
    def __init__(self, t: Any, tag: str = "held") -> None:
        self.t = t
        self.tag = tag


def _same_object(got: Any, want: Any, where: str = "output") -> None:
    assert type(got) is type(want), where
    if isinstance(want, _Holder):
        assert list(vars(got)) == list(vars(want)), where
        for k in vars(want):
            _same_object(getattr(got, k), getattr(want, k), f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same_object(g, w, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert_bitwise(got, want, where)
    else:
        assert got == want, where


@pytest.mark.parametrize(
    "make",
    [
        lambda x: _Holder(x * 2),
        lambda x: [_Holder(x * 2, tag="listed")],
        lambda x: {1: {frozenset([1]): _Holder(x + 1)}},
        lambda x: {"deep": [(_Holder(_Holder([x.exp(), 3])),)]},
        lambda x: (_Holder(x * 2), _Holder(x * 2)),
    ],
    ids=["object", "object-in-list", "object-in-dict", "deep", "two-alike"],
)
def test_plain_object_result_is_rebuilt_with_each_calls_tensors(
    make: Callable[[Any], Any],
) -> None:
    """An object ``copy.copy`` rebuilds from its ``__dict__`` (Hugging Face's DynamicCache is
    one) comes back as a new object of its type each call, holding that call's tensors."""

    def program(x: torch.Tensor) -> Any:
        return make(x)

    compiled = plait.compile(program, backend="stax", fullgraph=True)
    kept = []
    for seed in range(3):
        x = torch.randn(3, generator=torch.Generator().manual_seed(seed))
        got, want = compiled(x), program(x)
        _same_object(plait_unwrap(got), plait_unwrap(want))
        kept.append(got)
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].program.fallback_reason is None
    first, second = (plait_unwrap(k) for k in kept[:2])
    assert first is not second


def plait_unwrap(out: Any) -> Any:
    """The innermost result of the parametrized programs (a dict's single path unwrapped)."""
    while isinstance(out, dict):
        (out,) = out.values()
    return out


# --- what plait cannot rebuild is refused -----------------------------------------------------


class _Slotted:
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _Reduced:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __reduce__(self) -> Any:
        return (_Reduced, (self.t,))


class _Listish(list):
    pass


def _twice(x: torch.Tensor) -> Any:
    held = _Holder(x * 2)
    return (held, held)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: _Slotted(x * 2),
        lambda x: [_Reduced(x * 2)],
        lambda x: {1: {frozenset([1]): _Slotted(x + 1)}},
        lambda x: _Listish([x * 2]),
        lambda x: {x * 2},
        lambda x: {"deep": [(_Holder(_Slotted(x.exp())),)]},
        _twice,
    ],
    ids=[
        "slots", "custom-reduce", "object-in-dict", "list-subclass", "set", "deep",
        "same-object-twice",
    ],
)  # fmt: skip
def test_unrebuildable_result_holding_a_tensor_is_refused(make: Callable[[Any], Any]) -> None:
    def program(x: torch.Tensor) -> Any:
        return make(x)

    x = torch.randn(3)
    with pytest.raises(GraphCaptureError, match=r"cannot rebuild|cannot be rebuilt"):
        plait.compile(program, backend="eager", fullgraph=True)(x)
    compiled = plait.compile(program, backend="eager")
    with pytest.warns(CaptureFallbackWarning, match=r"cannot rebuild|cannot be rebuilt"):
        compiled(x)
    assert compiled.specializations[0].program.fallback_reason is not None
    y = torch.randn(3)
    got, want = compiled(y), program(y)
    assert type(got) is type(want)
