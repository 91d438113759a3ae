"""plait under DistributedDataParallel: 2 processes, gloo, CPU (one spawn for every check).

Gradients after every step and parameters after the last are judged by the contract's model
rule (the gate's AnchorPool: plait's error against an eager float64 DDP run may exceed eager
float32 DDP's by the contract's factors), for a compiled module wrapped in DDP, ``no_sync()``
accumulation, uneven inputs under ``join()``, and a DDP module compiled by plait. The compiled
backward is split at DDP's buckets: a bucket's all-reduce starts while gradients are still
being computed, as in eager."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import plait.contract
from benchmarks.distributed import free_port
from plait.conformance import Failure, Report, unit_roundoff
from plait.conformance.anchor import AnchorPool, ModelRule
from tests.distributed.ddp_worker import STEPS, worker

# NOTE: one spawn (a module fixture) for every test here: one xdist worker runs them all
pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="no torch.distributed with gloo here",
    ),
    pytest.mark.slow,
    pytest.mark.xdist_group("ddp-spawn"),
]
WORLD = 2


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(worker, args=(WORLD, free_port(), out), nprocs=WORLD)
        return [torch.load(Path(out) / f"rank{r}.pt") for r in range(WORLD)]


def model_rule() -> ModelRule:
    c = plait.contract.load()
    floor = c.model_floor("float32") * unit_roundoff(torch.float32)
    return ModelRule(c.model_factor("float32"), c.model_tail_factor("float32"), floor, c.noise_bits)


def judge(ranks: list[dict[str, Any]], scenario: str) -> Report:
    """Every gradient (each step) and parameter (after the last) of plait's run against the
    float64 anchor, with eager float32 as the baseline, pooled over ranks and steps. As in the
    gate, a value on which eager has fewer than the contract's ``noise_bits`` correct bits (a
    bias before a batch norm: its gradient is zero but for rounding) is rounding noise, judged
    elementwise against eager by the contract's float32 reduction row instead."""
    pool, rule, report = AnchorPool(), model_rule(), Report()
    pooled: dict[str, list[tuple[torch.Tensor, ...]]] = {}
    for rank, results in enumerate(ranks):
        runs = results[scenario]
        eager, cand, anchor = (runs[k] for k in ("eager", "plait", "anchor"))
        values = [(f"grad[{n}]", n, i) for i, s in enumerate(anchor["grads"]) for n in s]
        values += [(f"param[{n}]", n, None) for n in anchor["params"]]
        for where, name, step in values:
            ref, e, c = (
                (r["grads"][step][name] if step is not None else r["params"][name]).double()
                for r in (anchor, eager, cand)
            )
            mask = torch.isfinite(ref) & torch.isfinite(e) & torch.isfinite(c)
            pool.add(where, scenario, f"rank {rank} step {step}", e, c, ref, mask, rule)
            pooled.setdefault(where, []).append((e, c, ref))
    pool.finalize(report)
    row = plait.contract.load().tolerance("reduction", torch.float32)
    assert rule.noise_bits is not None
    for where, cases in pooled.items():
        scale = max(float(ref.abs().max()) for _, _, ref in cases)
        eager_error = max(float((e - ref).abs().max()) for e, _, ref in cases)
        if eager_error < 2**-rule.noise_bits * scale:
            continue  # NOTE: anchored above
        report.count("elementwise (noise)")
        for e, c, _ in cases:
            if not bool(((c - e).abs() <= row.atol + row.rtol * e.abs()).all()):
                report.add(Failure("error", "elementwise", where, scenario, "outside the row"))
    return report


def _assert_conforms(ranks: list[dict[str, Any]], scenario: str) -> None:
    report = judge(ranks, scenario)
    assert report.ok, [str(f) for f in report.errors]
    assert report.checks_run["anchored"] > 0, report.notes


def _assert_ranks_agree(ranks: list[dict[str, Any]], scenario: str) -> None:
    """After the all-reduce every rank holds the same gradients (bit for bit)."""
    first, other = (r[scenario]["plait"]["grads"] for r in ranks)
    for a, b in zip(first, other):
        for name in a:
            assert torch.equal(a[name], b[name]), name


def test_a_compiled_module_in_ddp_trains_as_eager_ddp(ranks: list[dict[str, Any]]) -> None:
    assert len(ranks[0]["wrapped"]["plait"]["grads"]) == STEPS
    _assert_conforms(ranks, "wrapped")
    _assert_ranks_agree(ranks, "wrapped")


def test_no_sync_accumulates_as_eager_ddp(ranks: list[dict[str, Any]]) -> None:
    _assert_conforms(ranks, "no_sync")
    _assert_ranks_agree(ranks, "no_sync")


def test_uneven_inputs_under_join(ranks: list[dict[str, Any]]) -> None:
    """Rank 1 has one batch more; rank 0 joins and shadows its all-reduce (eager DDP does the
    same): the parameters end equal on both ranks."""
    assert [len(r["uneven"]["plait"]["grads"]) for r in ranks] == [2, 3]
    _assert_conforms(ranks, "uneven")
    for name, value in ranks[0]["uneven"]["plait"]["params"].items():
        assert torch.equal(value, ranks[1]["uneven"]["plait"]["params"][name]), name


def test_a_ddp_module_compiled_by_plait(ranks: list[dict[str, Any]]) -> None:
    """``plait.compile(DDP(m))``: DDP's own forward (its communication bookkeeping) cannot be
    captured and runs as Python, said once in a warning; the wrapped module is compiled as a
    region, trains as eager DDP and its backward is split at the buckets too."""
    _assert_conforms(ranks, "compiled_ddp")
    (warning,) = ranks[0]["compiled_ddp_warnings"]
    assert "record_function" in warning
    assert ranks[0]["compiled_ddp_regions"] == [("module", "compiled")]
    (split,) = ranks[0]["compiled_ddp_split"]
    assert split.endswith(" segments") and int(split.split()[0]) >= 2, split


def test_the_backward_releases_gradients_by_bucket(ranks: list[dict[str, Any]]) -> None:
    release = ranks[0]["gradient_release"]
    assert (
        len(release["buckets"]) >= 2 and release["split"] == f"{len(release['buckets'])} segments"
    )
    assert "ddp-bucket-split" in ranks[0]["explain"] and "ddp-bucket×" in ranks[0]["explain"]
    names = [n for b in release["buckets"] for n in b["params"]]
    assert sorted(names) == sorted(ranks[0]["wrapped"]["plait"]["params"])
    # NOTE: DDP rebuilds its buckets after the first step from the order gradients arrived:
    # from the second step on they are the buckets the backward is cut at, and each starts its
    # all-reduce while later gradients are still missing, as eager's first does
    planned = [sorted(b["params"]) for b in release["buckets"]]
    for rank in ranks:
        eager, cand = (rank["wrapped"][k]["buckets"] for k in ("eager", "plait"))
        for step in range(1, STEPS):
            assert [names for _, _, names in cand[step]] == planned, (cand[step], planned)
            assert eager[step][0][1] > 0 and cand[step][0][1] > 0, (eager, cand)
            missing = [m for _, m, _ in cand[step]]
            assert missing == sorted(missing, reverse=True) and missing[-1] == 0, missing


def test_the_judge_catches_gradients_summed_instead_of_averaged(
    ranks: list[dict[str, Any]],
) -> None:
    """Not vacuous: a candidate whose all-reduce summed (each gradient twice eager's) fails."""
    wrong = [
        {
            "wrapped": {
                **r["wrapped"],
                "plait": {
                    "grads": [
                        {n: 2 * g for n, g in s.items()} for s in r["wrapped"]["plait"]["grads"]
                    ],
                    "params": r["wrapped"]["plait"]["params"],
                },
            }
        }
        for r in ranks
    ]
    report = judge(wrong, "wrapped")
    assert not report.ok and report.caught("grad[")
    checks = judge(ranks, "wrapped").checks_run
    every = 2 * len(ranks[0]["wrapped"]["plait"]["params"])  # NOTE: pooled over steps
    assert checks["anchored"] + checks["elementwise (noise)"] == every, checks


def test_fsdp2_shards_compiled_blocks(ranks: list[dict[str, Any]]) -> None:
    """``fully_shard`` on plait-compiled blocks (then on the root): FSDP2 gathers each block's
    parameters before its compiled forward and reduce-scatters the gradients its compiled
    backward releases; the gathered gradients and parameters are eager FSDP2's within the
    contract, and no step recompiles (one specialization per block)."""
    _assert_conforms(ranks, "fsdp2")
    assert ranks[0]["fsdp2"]["plait"]["specializations"] == [1, 1, 1]
