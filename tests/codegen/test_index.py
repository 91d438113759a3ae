"""Index algebra: every simplification is exact, checked by brute force over the loop ranges."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from plait.codegen.index import Clamp, Div, Ix, Mod, Var, contiguous_strides, linear, ravel, unravel


def evaluate(ix: Ix, env: dict[Var, int]) -> int:
    total = ix.const
    for atom, coef in ix.terms:
        if isinstance(atom, Var):
            value = env[atom]
        elif isinstance(atom, Div):
            value = evaluate(atom.e, env) // atom.k
        elif isinstance(atom, Mod):
            value = evaluate(atom.e, env) % atom.k
        else:
            assert isinstance(atom, Clamp)
            value = min(max(evaluate(atom.e, env), atom.lo), atom.hi)
        total += coef * value
    return total


def envs(vs: list[Var]) -> list[dict[Var, int]]:
    return [dict(zip(vs, p)) for p in itertools.product(*(range(v.extent) for v in vs))]


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3)


@given(shapes, st.lists(st.integers(0, 7), min_size=3, max_size=3), st.integers(0, 5),
       st.integers(1, 12))  # fmt: skip
def test_div_mod_exact(shape: list[int], coefs: list[int], const: int, k: int) -> None:
    vs = [Var(f"i{j}", n) for j, n in enumerate(shape)]
    e = Ix.lit(const)
    for v, c in zip(vs, coefs):
        e = e + Ix.var(v) * c
    q, r = e.div(k), e.mod(k)
    for env in envs(vs):
        x = evaluate(e, env)
        assert evaluate(q, env) == x // k
        assert evaluate(r, env) == x % k
        lo, hi = q.range
        assert lo <= evaluate(q, env) <= hi


@given(shapes, shapes)
def test_reshape_roundtrip_folds_to_strides(a: list[int], b: list[int]) -> None:
    """Reshape into any shape of the same size and back: the same elements, and plain strides
    again when the reshape splits or merges dims."""
    n = 1
    for d in a:
        n *= d
    target = [*b[:-1], 1]
    m = 1
    for d in target:
        m *= d
    if n % m:
        return
    target[-1] = n // m
    vs = [Var(f"i{j}", d) for j, d in enumerate(a)]
    idx = tuple(Ix.var(v) for v in vs)
    mid = unravel(ravel(idx, tuple(a)), tuple(target))
    back = unravel(ravel(mid, tuple(target)), tuple(a))
    for env in envs(vs):
        assert [evaluate(i, env) for i in back] == [env[v] for v in vs]
    # NOTE: a reshape that only splits or merges dims (one shape refines the other) folds back
    # into plain strides; others keep exact div/mod atoms.
    sa, sb = set(contiguous_strides(tuple(a))), set(contiguous_strides(tuple(target)))
    if sa <= sb or sb <= sa:
        assert linear(back, contiguous_strides(tuple(a))) == ravel(idx, tuple(a))


def test_merge_rule_and_clamp() -> None:
    i = Ix.var(Var("i0", 12))
    assert i.div(4) * 4 + i.mod(4) == i
    j = Ix.var(Var("i1", 5))
    e = i * 5 + j
    assert str(e.div(5)) == "i0" and str(e.mod(5)) == "i1"
    assert (j - 2).clamp(0, 10) != j - 2
    assert (j + 1).clamp(0, 10) == j + 1


def test_substitution_visits_a_shared_operand_once(monkeypatch) -> None:
    """A loop merge substitutes into indices whose div and mod atoms share one operand (a
    symbolic kernel's chain of reshapes): each operand is substituted once per call, so the
    work grows with the distinct operands, not with the paths to them (a dynamic ShuffleNet's
    kernels took minutes to print)."""
    from plait.codegen import index
    from plait.symbolic.poly import atom

    n = atom("s0")
    depth = 12

    def chain(v: Var) -> Ix:
        e = Ix.var(v)
        for _ in range(depth):
            e = e.div(n) + e.mod(n) * 2  # NOTE: both atoms read the previous level
        return e

    old, new = Var("i0", n * 64), Var("i1", n * 64)
    before = chain(old)
    calls = 0
    normalize = index._normalize

    def counted(terms, const):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return normalize(terms, const)

    monkeypatch.setattr(index, "_normalize", counted)
    after = before.subs({old: Ix.var(new)})
    monkeypatch.setattr(index, "_normalize", normalize)
    assert after == chain(new)
    assert calls <= 16 * depth  # NOTE: about 8 per level; without the sharing, 2**depth paths
