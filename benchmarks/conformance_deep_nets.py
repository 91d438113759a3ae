"""Measurements behind the model rule on deep nets (docs/conformance.md, "Deep nets").

Not a test: run ``python -m benchmarks.conformance_deep_nets [--seeds 20] [--save FILE]``
(``--load FILE`` re-judges saved outputs without running a model; ``--mutants N`` and
``--correct N`` measure the mutant suite and the correct candidates of tests/conformance on N gate
seeds instead). For ResNet-18 (32x32 and 64x64 images, batch 2 and 8, both layouts) and two
GPT-2 blocks (d_model 768, 128 tokens) it runs, per gate seed, the cases the
gate pools (the example and three fresh draws): the float64 anchor, eager in the case's layout and
in the other one, and correct candidates whose arithmetic differs from eager's (torch.compile /
inductor, plait.compile, BatchNorm folded in float64, channels_last eager, convolutions through
unfold+matmul, split-K linears, attention written out). The errors go through the gate's own
:class:`~plait.conformance.anchor.AnchorPool`. It prints, per candidate, the median and worst over
seeds of: the candidate's worst (max) and RMS error over eager's in the case's layout and over the
least accurate of eager's layouts (the baseline), and the share of the budget used by contract
1.0.0's rule (the worst element at ``factor``, eager's own layout), by an RMS rule on eager's own
layout, and by this contract's RMS and tail rules on the baseline layouts.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

import plait.contract
from plait.conformance import check, draw_like, unit_roundoff
from plait.conformance.anchor import AnchorPool, ModelRule
from plait.conformance.draws import apply_layout
from plait.conformance.report import Anchored, Report
from tests.conformance.correct import channels_last, convs_unfolded, fold_bn, folded_channels_last
from tests.conformance.models import randn, resnet18_eval, seeded

Fn = Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------------
# models


def gpt2_blocks(seed: int = 0) -> nn.Module:
    """Two GPT-2 blocks as benchmarks/stax_cpu.py runs them (d_model 768, 12 heads), eval mode."""
    from benchmarks.models.gpt2 import Block, GPT2Config

    cfg = GPT2Config(block_size=128, n_head=12, d_model=768)
    return seeded(seed, lambda: nn.Sequential(Block(cfg), Block(cfg)).eval())


# --------------------------------------------------------------------------------------------
# correct candidates: compilers, and the hand-written reorderings of tests/conformance/correct.py


class SplitKLinear(nn.Module):
    """``nn.Linear`` as two half-K matmuls added: a split-K kernel's order."""

    def __init__(self, fc: nn.Linear) -> None:
        super().__init__()
        self.fc = fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[-1] // 2
        w = self.fc.weight
        out = x[..., :k] @ w[:, :k].T + x[..., k:] @ w[:, k:].T
        return out if self.fc.bias is None else out + self.fc.bias


def linears_split_k(model: nn.Module) -> nn.Module:
    out = copy.deepcopy(model)
    for parent in list(out.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, nn.Linear):
                parent._modules[name] = SplitKLinear(child)
    return out


def attention_written_out(model: nn.Module) -> nn.Module:
    """A copy of GPT-2 blocks whose attention is softmax(q k^T / sqrt(d)) written out with a causal
    mask, instead of ``scaled_dot_product_attention``."""
    out = copy.deepcopy(model)
    for m in out.modules():
        if getattr(m, "attention", None) == "sdpa":
            t = 128
            m.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))
            object.__setattr__(m, "attention", "explicit")
    return out


def inductor(model: nn.Module) -> Fn:
    return torch.compile(copy.deepcopy(model), backend="inductor", dynamic=False)


def plait_compiled(model: nn.Module) -> Fn:
    import plait

    return plait.compile(copy.deepcopy(model))


CANDIDATES: dict[str, dict[str, Callable[[nn.Module], Fn]]] = {
    "resnet18": {
        "channels_last": channels_last,
        "bn_folded": fold_bn,
        "bn_folded_channels_last": folded_channels_last,
        "conv_unfold_matmul": convs_unfolded,
        "inductor": inductor,
        "plait": plait_compiled,
    },
    "gpt2_blocks": {
        "split_k_linears": linears_split_k,
        "attention_written_out": attention_written_out,
        "inductor": inductor,
        "plait": plait_compiled,
    },
}


@dataclass(frozen=True)
class Config:
    name: str
    model: str
    shape: tuple[int, ...]
    layout: str = "contiguous"


CONFIGS = (
    Config("resnet18 32x32 b2", "resnet18", (2, 3, 32, 32)),
    Config("resnet18 32x32 b8", "resnet18", (8, 3, 32, 32)),
    Config("resnet18 64x64 b2", "resnet18", (2, 3, 64, 64)),
    Config("resnet18 64x64 b8", "resnet18", (8, 3, 64, 64)),
    Config("resnet18 64x64 b8 channels_last", "resnet18", (8, 3, 64, 64), "channels_last"),
    Config("gpt2 2 blocks 1x128x768", "gpt2_blocks", (1, 128, 768)),
)


# --------------------------------------------------------------------------------------------
# collection: outputs of every case the gate pools, per gate seed


@dataclass
class Cases:
    """The pooled cases of one gate seed: per case the float64 anchor, eager in the case's
    layout, eager in the other layout, and each candidate."""

    ref64: list[torch.Tensor] = field(default_factory=list)
    eager: list[torch.Tensor] = field(default_factory=list)
    other: list[torch.Tensor] = field(default_factory=list)
    cand: dict[str, list[torch.Tensor]] = field(default_factory=dict)


def collect(config: Config, seeds: int, names: list[str] | None) -> dict[int, Cases]:
    """Run the anchor, eager (both layouts) and every candidate on the cases the gate would pool
    for each seed (the example and draws 1-3, as ``check(..., seed=s)`` draws them)."""
    size = config.shape[-1] if config.model == "resnet18" else 0
    model = resnet18_eval(0, size) if config.model == "resnet18" else gpt2_blocks(0)
    wide = copy.deepcopy(model).double()
    example = randn(*config.shape, seed=7)
    other_layout = "contiguous" if config.layout == "channels_last" else "channels_last"
    builders = CANDIDATES[config.model]
    chosen = [n for n in builders if names is None or n in names]
    out: dict[int, Cases] = {}
    with torch.no_grad():
        cands: dict[str, Fn] = {}
        for name in chosen:
            start = time.perf_counter()
            cands[name] = builders[name](model)
            cands[name](_laid(example, config.layout))  # NOTE: compile once, reuse for all seeds.
            print(f"  {config.name}: {name} ready in {time.perf_counter() - start:.1f} s")
        for seed in range(seeds):
            cases = Cases()
            inputs = [example] + [draw_like((example,), seed * 7919 + i)[0] for i in (1, 2, 3)]
            for x in (_laid(t, config.layout) for t in inputs):
                cases.ref64.append(wide(x.double()))
                cases.eager.append(model(x).double())
                cases.other.append(model(_laid(x, other_layout)).double())
                for name, fn in cands.items():
                    cases.cand.setdefault(name, []).append(fn(x.clone()).double())
            out[seed] = cases
    return out


def _laid(x: torch.Tensor, layout: str) -> torch.Tensor:
    return apply_layout((x,), layout)[0][0]


# --------------------------------------------------------------------------------------------
# statistics: the gate's own pool, with and without the other layout as a baseline


def judged(cases: Cases, name: str, baseline_layouts: bool) -> Anchored:
    """The gate's statistics for candidate ``name`` over the pooled cases of one seed."""
    contract = plait.contract.load()
    rule = ModelRule(
        contract.model_factor("float32"),
        contract.model_tail_factor("float32"),
        contract.model_floor("float32") * unit_roundoff(torch.float32),
        contract.noise_bits,
    )
    pool = AnchorPool()
    for i, z in enumerate(cases.ref64):
        e, c = cases.eager[i], cases.cand[name][i]
        mask = torch.isfinite(e) & torch.isfinite(c) & torch.isfinite(z)
        others = {"other": cases.other[i]} if baseline_layouts else {}
        pool.add("output", "group", f"case {i}", e, c, z, mask, rule, others)
    report = Report()
    pool.finalize(report)
    (stat,) = report.anchored.values()
    return stat


def share_1_0(a: Anchored) -> float:
    """Contract 1.0.0's rule: worst error <= factor x eager's own worst + floor x u x max|z|."""
    budget = a.factor * a.eager + a.floor * a.scale
    return a.error / budget if budget > 0 else (0.0 if a.error == 0 else float("inf"))


@dataclass(frozen=True)
class Row:
    """One candidate on one seed: the statistics of docs/conformance.md's deep-net table."""

    max_ratio: float  # candidate's worst error / eager's (own layout)
    rms_ratio: float  # the same as root mean squares
    max_ratio_base: float  # candidate's worst / the baseline's (the least accurate eager layout)
    rms_ratio_base: float
    share_1_0: float  # contract 1.0.0: worst error, factor 2, eager's own layout
    share_rms_own: float  # RMS rule, factor 2, eager's own layout
    share_rms: float  # this contract: RMS rule, baseline layouts
    share_tail: float  # this contract: worst-element rule, tail factor, baseline layouts


def row(cases: Cases, name: str) -> Row:
    own, both = judged(cases, name, False), judged(cases, name, True)
    return Row(
        own.error / own.eager,
        own.rms_error / own.rms_eager,
        both.error / both.baseline,
        both.rms_error / both.rms_baseline,
        share_1_0(own),
        own.shares[0],
        *both.shares,
    )


def _col(values: list[float], fails: bool = False) -> str:
    ordered = sorted(values)
    text = f"{ordered[len(ordered) // 2]:5.2f} {ordered[-1]:5.2f}"
    return text + (f" {sum(v > 1 for v in values):2d}" if fails else "")


HEADER = (
    "median, worst over seeds (and failures) of: the candidate's worst (max) and RMS error over\n"
    "eager's in the case's layout (own) and over the least accurate of eager's layouts (base);\n"
    "the share of the budget used by contract 1.0.0's rule (max, own), an RMS rule on eager's own\n"
    "layout, and this contract's RMS and worst-element (tail) rules on the baseline layouts.\n"
    f"{'config: candidate':46s} | max/own     | rms/own     | max/base    | rms/base    | "
    "1.0.0 share    | rms, own       | rms share      | tail share"
)


def report(data: dict[str, dict[int, Cases]]) -> None:
    print(HEADER)
    for config_name, per_seed in data.items():
        names = sorted({n for cases in per_seed.values() for n in cases.cand})
        for name in names:
            rows = [row(cases, name) for cases in per_seed.values()]
            cols = [
                _col([r.max_ratio for r in rows]),
                _col([r.rms_ratio for r in rows]),
                _col([r.max_ratio_base for r in rows]),
                _col([r.rms_ratio_base for r in rows]),
                _col([r.share_1_0 for r in rows], fails=True),
                _col([r.share_rms_own for r in rows], fails=True),
                _col([r.share_rms for r in rows], fails=True),
                _col([r.share_tail for r in rows], fails=True),
            ]
            print(f"{config_name + ': ' + name:46s} | " + " | ".join(cols))


# --------------------------------------------------------------------------------------------
# mutants: the margins on the other side


def mutant_margins(seeds: int) -> None:
    """For every mutant of the suite, on gate seeds 0..seeds-1: how often it was killed (at the
    expected place), and the least, over seeds, of its largest share of a model-rule budget:
    contract 1.0.0's rule (recomputed from the same statistics) and this contract's RMS and tail
    rules. A share above 1 is a kill by the model rule."""
    from tests.conformance.mutants import MUTANTS

    print(f"{'mutant':28s} | killed | 1.0.0 share | rms share | tail share  (least over seeds)")
    for mutant in MUTANTS:
        killed, old, rms, tail = 0, [], [], []
        for seed in range(seeds):
            setup = mutant.build()
            r = check(setup.reference, setup.candidate, setup.inputs, seed=seed, **setup.options)
            killed += r.caught(mutant.where, mutant.check)
            stats = list(r.anchored.values())
            old.append(max((share_1_0(a) for a in stats), default=0.0))
            rms.append(max((a.shares[0] for a in stats), default=0.0))
            tail.append(max((a.shares[1] for a in stats), default=0.0))
        print(
            f"{mutant.name:28s} | {killed:2d}/{seeds}  | {min(old):11.3g} | {min(rms):9.3g} | "
            f"{min(tail):10.3g}"
        )


def correct_margins(seeds: int) -> None:
    """For every correct candidate of tests/conformance/correct.py, on gate seeds 0..seeds-1: the
    largest share of the RMS and of the tail budget, and of contract 1.0.0's rule."""
    from tests.conformance.correct import CORRECT

    print(f"{'correct candidate':30s} | passed | 1.0.0 share | rms share | tail share  (worst)")
    for name, make in CORRECT.items():
        passed, old, rms, tail = 0, [0.0], [0.0], [0.0]
        for seed in range(seeds):
            setup = make()
            r = check(setup.reference, setup.candidate, setup.inputs, seed=seed, **setup.options)
            passed += r.ok
            stats = list(r.anchored.values())
            old.append(max((share_1_0(a) for a in stats), default=0.0))
            rms.append(max((a.shares[0] for a in stats), default=0.0))
            tail.append(max((a.shares[1] for a in stats), default=0.0))
        print(
            f"{name:30s} | {passed:2d}/{seeds}  | {max(old):11.2f} | {max(rms):9.2f} | "
            f"{max(tail):10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--configs", nargs="*", help="substrings of config names to run")
    parser.add_argument("--candidates", nargs="*", help="candidate names to run")
    parser.add_argument("--save", help="save the collected outputs here (torch.save)")
    parser.add_argument("--load", help="judge outputs saved by --save instead of running")
    parser.add_argument("--mutants", type=int, help="measure the mutants on this many seeds")
    parser.add_argument("--correct", type=int, help="measure the correct candidates likewise")
    args = parser.parse_args()
    if args.mutants:
        mutant_margins(args.mutants)
        return
    if args.correct:
        correct_margins(args.correct)
        return
    if args.load:
        data = torch.load(args.load, weights_only=False)
    else:
        data = {}
        for config in CONFIGS:
            if args.configs and not any(s in config.name for s in args.configs):
                continue
            data[config.name] = collect(config, args.seeds, args.candidates)
            if args.save:
                torch.save(data, args.save)
    report(data)


if __name__ == "__main__":
    main()
