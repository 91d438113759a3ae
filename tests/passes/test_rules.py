"""Every rewrite rule fires where it should, stays quiet where it must, and is recorded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plait.ir import Graph, TensorType, from_text, interpret
from plait.passes import all_passes, run_pipeline
from tests.passes.cases import FIRES, MUST_NOT, UNVERIFIED

# NOTE: plait's own passes: a test elsewhere may register a user pass in the same process
ALL_RULES = sorted(
    rule
    for info in all_passes().values()
    if info.fn.__module__.startswith("plait.")
    for rule in info.rules
)


def params_for(g: Graph, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for v in g.inputs:
        if v.kind in ("param", "buffer"):
            assert isinstance(v.type, TensorType)
            t = torch.randn(
                tuple(int(d) for d in v.type.shape), generator=gen, dtype=torch.float64
            ).to(v.type.dtype)
            # NOTE: a variance is positive (a negative one makes fold-bn refuse: its scale is NaN)
            variance = v.name == "v" or v.name.endswith("running_var")
            out[v.name] = t.abs() + 0.5 if variance else t
    return out


def run_case(case: tuple[str, str, bool], verify: bool = True) -> Any:
    text, pipeline, freeze = case
    g = from_text(text, verify=verify)
    return run_pipeline(g, pipeline, params=params_for(g) if freeze else None)


def fired_rules(result: Any) -> list[str]:
    return [r.rule for rec in result.records for r in rec.rewrites]


def test_every_rule_has_cases() -> None:
    assert sorted(FIRES) == ALL_RULES
    assert sorted(MUST_NOT) == ALL_RULES


@pytest.mark.parametrize("rule", ALL_RULES)
def test_rule_fires_and_is_recorded(rule: str) -> None:
    result = run_case(FIRES[rule], verify=rule not in UNVERIFIED)
    assert rule in fired_rules(result)
    for rec in result.records:
        assert rec.changed == bool(rec.rewrites)
        for rw in rec.rewrites:
            assert rw.rule in all_passes()[rec.name].rules, f"{rw.rule} fired from {rec.name}"
    # every record reaches the manifest's JSON
    assert any(r["rule"] == rule for rec in result.to_json() for r in rec["rewrites"])


@pytest.mark.parametrize("rule", ALL_RULES)
def test_rule_does_not_fire(rule: str) -> None:
    result = run_case(MUST_NOT[rule])
    assert rule not in fired_rules(result)


def test_rewrite_records_name_node_ids() -> None:
    result = run_case(FIRES["fold-bn.conv"])
    (rw,) = [r for rec in result.records for r in rec.rewrites if r.rule == "fold-bn.conv"]
    assert sorted(rw.replaced) == [0, 1]  # the batch_norm and the conv it consumed
    assert len(rw.produced) == 1 and rw.produced[0] not in (0, 1)
    assert [n.id for n in result.graph.nodes] == rw.produced


def test_cse_never_merges_random_ops() -> None:
    result = run_case(MUST_NOT["cse.duplicate"])
    assert [n.op for n in result.graph.nodes].count("dropout") == 2


def test_dce_keeps_an_unused_draw_before_a_used_one() -> None:
    text, _, _ = MUST_NOT["dce.dead-node"]
    g = from_text(text)
    x = torch.randn(4, 6)
    torch.manual_seed(5)
    expected = interpret(g, [x])
    out = run_pipeline(g, "dce").graph
    torch.manual_seed(5)
    assert torch.equal(interpret(out, [x])[0], expected[0])
