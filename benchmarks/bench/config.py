"""The benchmark's configuration: one frozen dataclass, its presets, and the ablation table.

Example:
    >>> cfg = BenchConfig.preset(quick=True)
    >>> cfg.image_size, cfg.batch_sizes, cfg.systems
    (32, (2,), ('eager', 'plait'))
    >>> [a.name for a in ABLATIONS][:3]
    ['fusion', 'fold-bn', 'const-fold']
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

SCHEMA_VERSION = "1.0"
SYSTEMS = ("eager", "plait", "inductor")
MODELS = ("resnet18", "resnet50")
DEVICES = ("cpu", "cuda", "auto")
COSTS = ("compile", "latency", "memory")


def reject_unknown(
    ap: argparse.ArgumentParser, what: str, given: Sequence[str], known: Sequence[str]
) -> None:
    """Exit through ``ap.error`` naming each of ``given`` (case or system names asked for on
    the command line) that is not one of ``known``: never run something else in its place."""
    unknown = [g for g in given if g not in known]
    if unknown:
        ap.error(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")


@dataclass(frozen=True)
class Ablation:
    """One plait optimisation turned off: ``passes_drop`` removes passes from the inference
    pipeline, ``options`` are ``plait.compile`` options, ``stax`` are ``StaxOptions`` fields.
    ``improves`` names the costs the optimisation claims to lower (of :data:`COSTS`)."""

    name: str
    what: str
    improves: tuple[str, ...]
    passes_drop: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    stax: dict[str, Any] = field(default_factory=dict)


# NOTE: knobs that do not exist yet (fuse, memory_plan, channels_last) are listed all the same;
# the benchmark reports them "not available" until StaxOptions grows the field.
ABLATIONS = (
    Ablation(
        "fusion",
        "fuse pointwise chains and epilogues into native kernels",
        ("latency", "memory"),
        stax={"fuse": False},
    ),
    Ablation(
        "fold-bn",
        "fold eval-mode BatchNorm into the preceding convolution's weights",
        ("latency", "memory"),
        passes_drop=("fold-bn",),
    ),
    Ablation(
        "const-fold",
        "evaluate expressions of frozen constants at compile time",
        ("latency",),
        passes_drop=("const-fold",),
    ),
    Ablation(
        "freeze",
        "treat parameters and buffers as constants (enables folding)",
        ("latency", "memory"),
        options={"freeze": False},
    ),
    Ablation(
        "graph-passes",
        "every graph pass (canonicalize ... dce), freezing included",
        ("latency", "memory"),
        options={"passes": "none"},
    ),
    Ablation(
        "inplace",
        "memory plan: epilogues write over the extern result they read",
        ("memory", "latency"),
        stax={"inplace": False},
    ),
    Ablation(
        "memory-plan",
        "memory plan: one arena reused across calls for kernel intermediates",
        ("memory", "latency"),
        stax={"memory_plan": False},
    ),
    Ablation(
        "layout-inference",
        "learn each extern result's layout at compile time (channels_last epilogues in place)",
        ("latency",),
        stax={"infer_layouts": False},
    ),
    Ablation(
        "channels-last",
        "convert convolution activations to channels_last",
        ("latency",),
        stax={"channels_last": False},
    ),
    Ablation(
        "mkl-linear",
        "float32 linears through MKL's packed GEMM (activations and adds as native kernels)",
        ("latency",),
        stax={"mkl_linear": False},
    ),
)


def ablation(name: str) -> Ablation:
    for a in ABLATIONS:
        if a.name == name:
            return a
    raise KeyError(f"unknown ablation {name!r}; known: {[a.name for a in ABLATIONS]}")


@dataclass(frozen=True)
class BenchConfig:
    """Everything that decides what one run measures. ``quick`` is the under-a-minute preset.
    ``perturb_plait`` (test-only) scales plait's logits by ``1 + perturb_plait`` so that the
    gate must fail and the benchmark must exit non-zero."""

    model: str = "resnet18"
    image_size: int = 64
    batch_sizes: tuple[int, ...] = (1, 8)
    device: str = "cpu"
    systems: tuple[str, ...] = SYSTEMS
    repeats: int = 20
    warmup: int = 3
    threads: int = 1
    seed: int = 0
    data: str = "digits"
    parity_images: int = 64
    gate_draws: int = 3
    gate_layouts: tuple[str, ...] = ("contiguous", "channels_last")
    ablations: tuple[str, ...] = tuple(a.name for a in ABLATIONS)
    ablation_workers: bool = True
    compile_workers: bool = True
    train_steps: int = 5
    train_batch: int = 8
    train_systems: tuple[str, ...] = ("eager", "plait", "inductor")
    perturb_plait: float = 0.0
    quick: bool = False

    @classmethod
    def preset(cls, quick: bool = False, **overrides: Any) -> BenchConfig:
        """The default (``make bench``) or quick preset, with explicit overrides on top."""
        base = cls()
        if quick:
            base = replace(
                base,
                image_size=32,
                batch_sizes=(2,),
                systems=("eager", "plait"),
                repeats=5,
                warmup=1,
                parity_images=8,
                gate_draws=1,
                gate_layouts=("contiguous",),
                ablations=("fold-bn", "freeze", "inplace", "fusion"),
                ablation_workers=False,
                train_steps=3,
                train_systems=("eager", "plait"),
                # NOTE: 8, not 4: at 32x32 the last stage's batch norms see batch x 1 x 1 values;
                # over 4 values their gradients are rounding noise (torch.compile failed the
                # training gate there with 15 errors).
                train_batch=8,
                quick=True,
            )
        given = {k: v for k, v in overrides.items() if v is not None}
        cfg = replace(base, **given)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model {self.model!r}: choose one of {MODELS}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r}: choose one of {DEVICES}")
        unknown = sorted(set(self.systems) - set(SYSTEMS))
        if unknown or not self.systems:
            raise ValueError(f"systems {unknown or '(none)'}: choose from {SYSTEMS}")
        if "eager" not in self.systems:
            raise ValueError("systems must include eager: it is the reference")
        if set(self.train_systems) - set(SYSTEMS):
            raise ValueError(f"train systems: choose from {SYSTEMS}")
        for name in self.ablations:
            ablation(name)
        if min(self.batch_sizes, default=0) < 1 or self.image_size < 8:
            raise ValueError("batch sizes must be >= 1 and the image size >= 8")
        if self.repeats < 1 or self.warmup < 0 or self.threads < 1 or self.gate_draws < 1:
            raise ValueError("repeats, threads and gate draws must be >= 1, warmup >= 0")
        if self.train_steps and (self.train_steps < 2 or self.train_batch < 2):
            raise ValueError("training needs >= 2 steps (one compiles) and batches of >= 2")

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out
