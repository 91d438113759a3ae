"""The CUDA backend's benchmark: plait against eager and torch.compile on one NVIDIA GPU.

    python -m benchmarks.cuda_suite --out DIR            # every case (5 to 7 min on an H200)
    python -m benchmarks.cuda_suite --out DIR --quick    # smaller batches, fewer rounds
    python -m benchmarks.cuda_suite --out DIR --cases overhead-10op,resnet50-fp32-b1

Cases (:data:`CASES`): torchvision ResNet-50 in float32 at batch 1 and 64 and in bfloat16 at
batch 64, torchvision ViT-B/16 in bfloat16 at batch 32, a 6-layer Hugging Face GPT-2 (SDPA
attention) in bfloat16 on 8x512 token ids, and ten chained pointwise ops on 1024 floats (the
per-call overhead). Random seeded weights, nothing downloaded; inference under
``torch.no_grad()`` in eval mode; TF32 off. Systems: ``eager``; ``plait``
(``plait.compile(model)``: Triton kernels, cuDNN/cuBLAS/SDPA externs, one CUDA graph);
``inductor`` (``torch.compile(model, dynamic=False)``); ``inductor-ro`` (the same with
``mode="reduce-overhead"``: CUDA graphs); ``plait-nograph`` (``options={"cuda_graphs": False}``,
on the overhead case and ResNet-50 at batch 1 only).

Per case and system:

* cold compile: the wall time of the first call (wrapper, compile, first run; synchronized) on
  empty caches: each system compiles with fresh ``PLAIT_CACHE_DIR`` (plait's artifacts and
  kernels), ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` directories, inductor's
  in-memory caches cleared and ``torch._dynamo.reset()`` at the start of each case (not between
  inductor and inductor-ro: a reset drops every compiled frame and CUDA graph tree, the other
  mode's too, which would then recompile inside the timed rounds). Per-process
  one-time costs (CUDA context, imports, inductor's compile workers, Triton's driver, plait's guard
  evaluator) are paid once up front by a *primer* that compiles a two-op function with each
  compiler on caches of its own; its seconds are reported apart.
* warm start (plait): a fresh process (the hidden ``--worker`` flag) on the caches plait's cold
  compile filled: its first-call time and how many Triton kernels it compiled (see
  :class:`KernelCensus`).
* steady state: the CUDA-event time of one call (the device idle before it: synchronized), after
  10 warm-up calls, the systems interleaved round-robin (one call of each per round, the order
  rotating); median and p95, and ratios: eager over the system, inductor-ro over the system
  (above 1: the system is faster).
* parity: plait's outputs judged by the conformance gate (:func:`benchmarks.bench.parity.gate`,
  two fresh draws, contiguous layout) against eager; every system's max error on the example
  against eager, for display.
* evidence (plait): native/extern/fallback node counts, Triton kernels, whether one CUDA graph
  replays the program (and why not).
* memory: the CUDA allocator's growth over the cold compile (*resident*; a CUDA graph capture
  frees cuBLAS's workspaces, so it can be negative) and its peak over one steady call, both over
  what was allocated before.

plait-nograph compiles after plait in the same process, and plait keeps the Triton modules it
loaded by their source's hash (``plait.codegen.triton_load``): its first call reuses plait's
kernels and is no cold compile (its record says so).

A failure in one (case, system) is recorded in its cell and the run goes on. ``DIR/cuda_suite.json``
and ``DIR/cuda_suite.md`` are rewritten after every case (an interrupted run leaves what it
measured); the Markdown table is printed last. Exit status: 0; 1 when plait failed the gate on a
case (a wrong answer; plait errors are listed, not fatal); 2 without CUDA or on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import model_sources, zoo_models, zoo_report, zoo_systems
from benchmarks.bench import parity, run, timing
from benchmarks.zoo_systems import short

SCHEMA_VERSION = "1.0"
STEM = "cuda_suite"
OUT_DEFAULT = Path("benchmarks/out")
SYSTEMS = ("eager", "plait", "plait-nograph", "inductor", "inductor-ro")
WARMUP_CALLS = 10  # NOTE: >= 3, what reduce-overhead needs before it replays a graph
GATE_DRAWS = 2
GATE_LAYOUTS = ("contiguous",)
WORKER_TIMEOUT_S = 300.0
MAX_WARNINGS = 10
MAX_KERNEL_NAMES = 64
MIB = float(1 << 20)
CACHE_VARS = ("PLAIT_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
DEVICE = "cuda"  # NOTE: where models run; tests of the flow on a CPU machine set "cpu"

NOGRAPH_NOTE = (
    "not cold: it reuses the Triton modules plait's compile loaded in this process "
    "(plait.codegen.triton_load keeps them by source hash)"
)

Built = tuple[nn.Module, torch.Tensor]
Fn = Callable[[torch.Tensor], Any]


def log(message: str) -> None:
    """One progress line on stdout, flushed (PYTHONUNBUFFERED may not be set)."""
    print(f"[cuda_suite {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the cases -----------------------------------------------------------------------------------
class PointwiseChain(nn.Module):
    """Ten chained pointwise ops: on a tiny tensor the call costs its overhead, not its math."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5
        y = y + 0.25
        y = torch.relu(y)
        y = torch.sin(y)
        y = y * y
        y = y - 0.5
        y = torch.tanh(y)
        y = y + x
        y = torch.sigmoid(y)
        return y * 2.0


def import_torchvision() -> None:
    """Make ``torchvision.models`` importable: the installed torchvision where CUDA is (the GPU
    machine's imports normally), else torchvision's pure-Python model definitions
    (:mod:`benchmarks.model_sources`; the CPU machines' PyPI torchvision does not import)."""
    if "torchvision" in sys.modules:
        return
    if torch.cuda.is_available() and importlib.util.find_spec("torchvision") is not None:
        try:
            importlib.import_module("torchvision.models")
            return
        except Exception:  # NOTE: a broken build: forget it, use the Python definitions
            for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
                del sys.modules[name]
    model_sources.use_torchvision()


def torchvision_builder(zoo_name: str, batches: dict[str, int]) -> Callable[[str, int], Built]:
    """A builder of the zoo's torchvision entry ``zoo_name`` (seeded weights, batch norm
    calibrated, zero-initialized heads drawn: :func:`benchmarks.zoo_models.build`); ``tiny``
    is the zoo's quick model (ResNet-18, ViT on 32x32 images)."""

    def build(size: str, seed: int) -> Built:
        import_torchvision()
        entry = zoo_models.entry(zoo_name)
        built = zoo_models.build(entry, quick=size == "tiny", seed=seed, batch=batches[size])
        return built.module, built.example

    return build


GPT2_IDS = {"full": (8, 512), "quick": (2, 128), "tiny": (2, 16)}
GPT2_TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip


def build_gpt2(size: str, seed: int) -> Built:
    """Hugging Face ``GPT2Model`` with 6 layers (otherwise GPT2Config's defaults: 768 wide,
    12 heads), SDPA attention, no KV cache; its ``last_hidden_state`` on random token ids."""
    import transformers

    settings: dict[str, Any] = dict(GPT2_TINY) if size == "tiny" else {"n_layer": 6}
    settings["use_cache"] = False
    make: Any = transformers.GPT2Config
    try:
        config = make(attn_implementation="sdpa", **settings)
    except TypeError:  # NOTE: a transformers without the attn_implementation argument
        config = make(**settings)
    torch.manual_seed(seed)
    model = zoo_models.Selected(transformers.GPT2Model(config), "last_hidden_state").eval()
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, GPT2_IDS[size], generator=gen)
    return model, ids


def build_pointwise(size: str, seed: int) -> Built:
    gen = torch.Generator().manual_seed(seed + 1)
    return PointwiseChain().eval(), torch.randn(1024, generator=gen)


@dataclass(frozen=True)
class Case:
    """One benchmark case: ``build(size, seed)`` makes the module and its example on the CPU
    (float32 weights, eval mode); on the GPU both take ``dtype`` (integer inputs stay). Sizes:
    ``full`` (the issue's), ``quick`` (smaller batches, same models), ``tiny`` (small models:
    what the CPU tests build)."""

    name: str
    what: str
    build: Callable[[str, int], Built]
    dtype: torch.dtype
    rounds: int  # NOTE: timed round-robin rounds at full size
    quick_rounds: int
    nograph: bool = False  # NOTE: plait with cuda_graphs off too

    def systems(self, chosen: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(s for s in chosen if s != "plait-nograph" or self.nograph)


RESNET50 = "torchvision ResNet-50"
CASES = (
    Case("resnet50-fp32-b1", f"{RESNET50}, float32, 1x3x224x224",
         torchvision_builder("tv-resnet50", {"full": 1, "quick": 1, "tiny": 1}),
         torch.float32, rounds=300, quick_rounds=50, nograph=True),
    Case("resnet50-fp32-b64", f"{RESNET50}, float32, 64x3x224x224",
         torchvision_builder("tv-resnet50", {"full": 64, "quick": 8, "tiny": 2}),
         torch.float32, rounds=100, quick_rounds=20),
    Case("resnet50-bf16-b64", f"{RESNET50}, bfloat16, 64x3x224x224",
         torchvision_builder("tv-resnet50", {"full": 64, "quick": 8, "tiny": 2}),
         torch.bfloat16, rounds=100, quick_rounds=20),
    Case("vit_b_16-bf16-b32", "torchvision ViT-B/16, bfloat16, 32x3x224x224",
         torchvision_builder("tv-vit-b-16", {"full": 32, "quick": 4, "tiny": 2}),
         torch.bfloat16, rounds=100, quick_rounds=20),
    Case("gpt2-6l-bf16", "HF GPT2Model, 6 layers, SDPA, bfloat16, 8x512 token ids",
         build_gpt2, torch.bfloat16, rounds=200, quick_rounds=50),
    Case("overhead-10op", "10 chained pointwise ops, float32, 1024 elements",
         build_pointwise, torch.float32, rounds=1000, quick_rounds=200, nograph=True),
)  # fmt: skip


def case_named(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise ValueError(f"unknown case {name!r}; known: {', '.join(c.name for c in CASES)}")


def to_gpu(model: nn.Module, example: torch.Tensor, dtype: torch.dtype) -> Built:
    """The module and its example on the GPU in ``dtype`` (integer inputs keep theirs)."""
    x = example.to(DEVICE, dtype) if example.is_floating_point() else example.to(DEVICE)
    return model.to(DEVICE, dtype).eval(), x


# --- the command line ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    cases: tuple[str, ...]
    systems: tuple[str, ...]
    quick: bool
    out: Path
    seed: int
    rounds: int | None  # NOTE: overrides every case's rounds
    warm: bool
    budget_s: float | None
    worker: Path | None = None

    @property
    def size(self) -> str:
        return "quick" if self.quick else "full"

    def rounds_for(self, case: Case) -> int:
        if self.rounds is not None:
            return self.rounds
        return case.quick_rounds if self.quick else case.rounds

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out["out"], out["worker"] = str(self.out), None
        out["warmup_calls"], out["gate_draws"] = WARMUP_CALLS, GATE_DRAWS
        out["size"] = self.size
        return out


def _names(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown {what} {unknown or [text]}; known: {', '.join(known)}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.cuda_suite",
        description="plait's CUDA backend against eager and torch.compile (needs one GPU).",
    )
    names = ",".join(c.name for c in CASES)
    p.add_argument(
        "--out",
        type=Path,
        default=OUT_DEFAULT,
        help=f"directory for {STEM}.json and {STEM}.md (default {OUT_DEFAULT})",
    )
    p.add_argument("--cases", default="all", help=f"comma-separated, or all: {names}")
    p.add_argument(
        "--systems",
        default="all",
        help=f"comma-separated, or all (eager is required): {','.join(SYSTEMS)}",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller batches (ResNet 8, ViT 4, GPT-2 2x128) and fewer rounds",
    )
    p.add_argument("--rounds", type=int, help="timed rounds per case (default: per case)")
    p.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="skip plait's warm-start process per case",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        help="start no case after this many seconds (the rest are recorded skipped)",
    )
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> Config:
    """The run's configuration; a usage error exits with status 2, naming what is known."""
    p = parser()
    ns = p.parse_args(argv)
    try:
        cases = tuple(c.name for c in CASES) if ns.cases == "all" else (
            _names(ns.cases, tuple(c.name for c in CASES), "cases")
        )  # fmt: skip
        systems = SYSTEMS if ns.systems == "all" else _names(ns.systems, SYSTEMS, "systems")
        if "eager" not in systems:
            raise ValueError("--systems must include eager: it is the reference")
        if ns.rounds is not None and ns.rounds < 1:
            raise ValueError("--rounds must be >= 1")
    except ValueError as exc:
        p.error(str(exc))
    ordered = tuple(s for s in SYSTEMS if s in systems)
    return Config(cases, ordered, ns.quick, ns.out, ns.seed, ns.rounds, ns.warm, ns.budget_s,
                  ns.worker)  # fmt: skip


def cuda_problem() -> str | None:
    """Why this machine cannot run the suite, or None."""
    if not torch.cuda.is_available():
        return (
            "needs an NVIDIA GPU: torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})"
        )
    if importlib.util.find_spec("triton") is None:
        return "needs Triton (plait's CUDA kernels and inductor's): pip install triton"
    return None


# --- caches, numerics, warnings ------------------------------------------------------------------
def cache_env(base: Path) -> dict[str, str]:
    """Fresh cache directories under ``base`` (not created here: plait makes its own private,
    Triton and inductor theirs)."""
    return {
        "PLAIT_CACHE_DIR": str(base / "plait"),
        "TRITON_CACHE_DIR": str(base / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
    }


def cache_env_set(values: dict[str, str]) -> contextlib.AbstractContextManager[None]:
    """The cache variables set to ``values`` inside; restored after."""
    return run.cache_env(values)


def clear_inductor_caches() -> None:
    """Inductor's in-process caches (compiled kernels by source, loaded modules, autotuning):
    with fresh cache directories, the next torch.compile starts cold."""
    utils = importlib.import_module("torch._inductor.utils")
    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is not None:
        clear()


def numerics_off() -> None:
    """TF32 off: float32 matmuls and convolutions compute in float32, as the gate assumes."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@contextlib.contextmanager
def recording(into: list[str]) -> Iterator[None]:
    """Warnings raised inside (plait announces each fallback) collected into ``into``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = str(w.message)[: zoo_systems.MAX_ERROR]
        if text not in into and len(into) < MAX_WARNINGS:
            into.append(text)


# --- counting Triton compiles --------------------------------------------------------------------
class KernelCensus:
    """How many Triton kernels a block compiled, counted two independent ways:

    * in this process, Triton's compilation listener (``triton.knobs.compilation.listener``,
      Triton >= 3.4): ``triton.compiler.compile`` calls it once per kernel it returns, with
      ``cache_hit=False`` when it ran the compiler and ``True`` when it loaded the binary from
      ``TRITON_CACHE_DIR``. Hooking ``compile`` itself would count cache hits as compiles.
    * in any process (a compiler may compile in worker processes, as inductor does), the
      ``.cubin`` files that appeared under each watched cache directory: Triton writes one per
      kernel it compiles into a new directory named by the kernel's hash (plait may keep copies
      in its own cache: each directory is counted apart, never summed).

    ``compiled`` is the largest of these counts: each is a lower bound on the compiles it sees.
    ``kernels`` names the kernels the listener saw compiled (name, defining module: plait's name
    the hash of their source, Triton's hash), to compare a warm process's with a cold one's.
    """

    def __init__(self, dirs: list[str]) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.misses = 0
        self.hits = 0
        self.listener = False
        self._lock = threading.Lock()
        self._before: list[set[Path]] = []
        self._new: list[int] = [0] * len(self.dirs)
        self._previous: Any = None
        self.kernels: list[str] = []
        self.first_key: dict[str, Any] | None = None

    def _cubins(self) -> list[set[Path]]:
        return [set(d.rglob("*.cubin")) if d.is_dir() else set() for d in self.dirs]

    def _listen(self, **event: Any) -> None:
        with self._lock:
            if event.get("cache_hit"):
                self.hits += 1
            else:
                self.misses += 1
                if len(self.kernels) < MAX_KERNEL_NAMES:
                    self.kernels.append(_kernel_name(event))
                if self.first_key is None:
                    self.first_key = _key_parts(event)
        if self._previous is not None:
            self._previous(**event)

    def __enter__(self) -> KernelCensus:
        self._before = self._cubins()
        try:
            from triton import knobs

            self._previous = knobs.compilation.listener
            knobs.compilation.listener = self._listen
            self.listener = True
        except (ImportError, AttributeError):  # NOTE: an older Triton: the files alone count
            self.listener = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self.listener:
            from triton import knobs

            knobs.compilation.listener = self._previous
        self._new = [len(now - before) for now, before in zip(self._cubins(), self._before)]

    def record(self) -> dict[str, Any]:
        return {
            "compiled": max([self.misses, *self._new]),
            "listener": self.listener,
            "listener_compiled": self.misses if self.listener else None,
            "listener_cache_hits": self.hits if self.listener else None,
            "new_cubin_files": dict(zip(map(str, self.dirs), self._new)),
            "kernels": list(self.kernels),
            "first_compiled_key_parts": self.first_key,
        }


def _key_parts(event: dict[str, Any]) -> dict[str, Any]:
    """What Triton's cache key of a compiled kernel is made of (its source's hash, the compile
    options in its metadata, the cache-invalidating environment): to compare two processes'
    keys for one kernel."""
    src, meta = event.get("src"), dict(event.get("metadata") or {})
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        env = dict(get_cache_invalidating_env_vars())
    except ImportError:
        env = {}
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import triton_key
        from triton.runtime.driver import driver

        backend = make_backend(driver.active.get_current_target()).hash()
        build = hashlib.sha256(triton_key().encode()).hexdigest()
    except Exception as exc:  # NOTE: diagnostics only: another Triton names these otherwise
        backend = build = f"unknown ({type(exc).__name__})"
    return {
        "name": getattr(src, "name", "?"),
        "backend_hash": backend,
        "triton_key_sha256": build,
        "ptxas_env": os.environ.get("TRITON_PTXAS_PATH"),
        "source_hash": src.hash() if hasattr(src, "hash") else None,
        "metadata": {k: str(v)[:300] for k, v in sorted(meta.items()) if k != "hash"},
        "env": env,
    }


def _kernel_name(event: dict[str, Any]) -> str:
    src, meta = event.get("src"), event.get("metadata") or {}
    fn = getattr(src, "fn", None)
    module = getattr(fn, "module", None) or getattr(fn, "__module__", None)
    return f"{getattr(src, 'name', '?')} {module} {str(meta.get('hash', ''))[:16]}"


def census_dirs(system: str, env: dict[str, str]) -> list[str]:
    """Where a system's Triton binaries land: Triton's cache, and plait's own for plait."""
    dirs = [env["TRITON_CACHE_DIR"]]
    if system.startswith("plait"):
        dirs.append(env["PLAIT_CACHE_DIR"])
    return dirs


# --- the systems ---------------------------------------------------------------------------------
def wrap(system: str, model: nn.Module) -> tuple[Fn, Callable[[], None] | None]:
    """The callable ``system`` runs ``model`` through, and what to call before each call of it
    (reduce-overhead's step marker: outputs of earlier replays are not kept) or None."""
    if system == "eager":
        return model, None
    if system in ("plait", "plait-nograph"):
        import plait

        options = {"cuda_graphs": False} if system == "plait-nograph" else None
        return plait.compile(model, options=options), None
    if system == "inductor":
        return torch.compile(model, dynamic=False), None
    if system == "inductor-ro":
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        return compiled, torch.compiler.cudagraph_mark_step_begin
    raise ValueError(f"unknown system {system!r}")


class Primer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0) + 1.0


def prime(systems: tuple[str, ...], root: Path) -> dict[str, Any]:
    """Each compiler compiles a two-op function three calls deep, on caches of its own, before
    anything is measured: the CUDA context, imports, inductor's compile workers, Triton's driver
    and plait's guard evaluator are costs of a process, not of a model's compile."""
    x = torch.randn(64, device=DEVICE)
    out: dict[str, Any] = {}
    for system in systems:
        if system in ("eager", "plait-nograph"):
            continue
        start = time.perf_counter()
        try:
            with cache_env_set(cache_env(root / system)), torch.no_grad():
                fn, before = wrap(system, Primer())
                for _ in range(3):
                    if before is not None:
                        before()
                    fn(x)
                torch.cuda.synchronize()
            out[system] = {"seconds": time.perf_counter() - start}
        except Exception as exc:  # NOTE: the cases will show the same error where it matters
            out[system] = {"seconds": time.perf_counter() - start, "error": short(exc)}
    torch._dynamo.reset()
    return out


@dataclass
class Runner:
    """One system under measurement in one case."""

    name: str
    fn: Fn | None = None
    before: Callable[[], None] | None = None
    compiled: Any = None
    error: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # NOTE: the whole environment its cold compile ran in (what a warm start must run in too:
    # a compiler that ran later may have set variables that change Triton's cache keys)
    environ: dict[str, str] = field(default_factory=dict)
    output: torch.Tensor | None = None  # NOTE: its first output, on the CPU
    record: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def call(self, x: torch.Tensor) -> Any:
        assert self.fn is not None
        if self.before is not None:
            self.before()
        return self.fn(x)


def _tensor(y: Any) -> torch.Tensor:
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"the model returned {type(y).__name__}, not a tensor")
    return y


def wall_call(r: Runner, x: torch.Tensor) -> float:
    """Seconds of one synchronized call (the previous work finished first)."""
    seconds, _ = timing.timed(lambda: r.call(x), "cuda")
    return seconds


def event_call(r: Runner, x: torch.Tensor) -> tuple[float, float]:
    """One call on an idle device: milliseconds between CUDA events recorded right before and
    right after it (host-side launch overhead included: the device waits for the launches), and
    the host's synchronized wall milliseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if r.before is not None:
        r.before()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    assert r.fn is not None
    r.fn(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end), (time.perf_counter() - t0) * 1e3


# --- one case ------------------------------------------------------------------------------------
class CaseRun:
    """Build, cold-compile, time, judge and warm-start one case; every failure is recorded."""

    def __init__(self, cfg: Config, case: Case, workdir: Path) -> None:
        self.cfg, self.case, self.workdir = cfg, case, workdir
        # NOTE: plait's cold-compile environment (its caches included), once it compiled
        self.warm_env: dict[str, str] | None = None
        self.record: dict[str, Any] = {
            "name": case.name,
            "what": case.what,
            "size": cfg.size,
            "status": "ran",
            "error": None,
            "input": None,
            "rounds": cfg.rounds_for(case),
            "systems": {},
            "plait": {},
        }

    def log(self, message: str) -> None:
        log(f"{self.case.name}: {message}")

    def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        torch._dynamo.reset()
        try:
            self._run()
        except Exception as exc:  # NOTE: e.g. a model that does not build: the case's record
            # NOTE: what the systems measured before it stays in the table
            status = "ran" if self.record["systems"] else "error"
            self.record.update(status=status, error=short(exc))
            self.log(f"ERROR {short(exc)[:300]}")
        finally:
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
        if self.cfg.warm and self.warm_env is not None:
            self.record["plait"]["warm"] = self.warm_start(self.warm_env)
        self.record["elapsed_s"] = time.perf_counter() - start
        self.log(f"done in {self.record['elapsed_s']:.1f} s")
        return self.record

    def _run(self) -> None:
        case = self.case
        self.log(f"building ({case.what}, size {self.cfg.size})")
        model, x = to_gpu(*case.build(self.cfg.size, self.cfg.seed), case.dtype)
        self.record["input"] = {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", "")}
        self.record["parameters"] = sum(p.numel() for p in model.parameters())
        runners = [Runner(s) for s in case.systems(self.cfg.systems)]
        for r in runners:
            self.record["systems"][r.name] = r.record
        try:
            with torch.no_grad():
                for r in runners:
                    self.cold(r, model, x)
                    if r.name == "plait" and r.error is None:
                        self.record["plait"]["evidence"] = plait_evidence(r.compiled)
                        self.warm_env = r.environ
                self.steady(runners, x)
                self.memory(runners, x)
            self.parity(runners, model, x)
        finally:
            for r in runners:
                r.record["error"] = r.error
                r.record["warnings"] = r.warnings

    def cold(self, r: Runner, model: nn.Module, x: torch.Tensor) -> None:
        """The first call on empty caches, then the second and third (reduce-overhead records
        its graph there), all synchronized; Triton compiles and allocator growth."""
        r.env = cache_env(self.workdir / r.name)
        os.environ.update(r.env)  # NOTE: read by plait, Triton and inductor at each use
        r.environ = dict(os.environ)
        if r.name.startswith("inductor"):
            clear_inductor_caches()
        skips = _cudagraph_skips()
        self.log(f"{r.name}: cold compile")
        census = KernelCensus(census_dirs(r.name, r.env))
        torch.cuda.synchronize()
        gc.collect()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        try:
            with recording(r.warnings), census:
                start = time.perf_counter()
                r.fn, r.before = wrap(r.name, model)
                if r.name != "eager":
                    r.compiled = r.fn
                y = _tensor(r.call(x))
                torch.cuda.synchronize()
                first = time.perf_counter() - start
                r.output = y.detach().to("cpu", copy=True)
                del y
                later = [wall_call(r, x) for _ in range(2)]
        except Exception as exc:
            r.error = f"cold compile: {short(exc)}"
            self.log(f"{r.name}: ERROR {r.error[:300]}")
            return
        r.record["cold"] = {
            "first_call_s": first,
            "second_call_s": later[0],
            "first_three_calls_s": first + sum(later),
            "kernels": census.record(),
        }
        r.record["memory"] = {
            "compile_peak_mib": (torch.cuda.max_memory_allocated() - base) / MIB,
            "resident_mib": (torch.cuda.memory_allocated() - base) / MIB,
        }
        if r.name == "inductor-ro":
            r.record["cold"]["cudagraph_skips"] = _cudagraph_skips() - skips
        if r.name == "plait-nograph" and self.warm_env is not None:
            r.record["cold"]["note"] = NOGRAPH_NOTE  # NOTE: plait compiled before it
        self.log(f"{r.name}: first call {first:.2f} s, "
                 f"{census.record()['compiled']} Triton kernel(s) compiled")  # fmt: skip

    def steady(self, runners: list[Runner], x: torch.Tensor) -> None:
        """Warm-up calls, then timed rounds: one call of each system per round, the order
        rotating so that no system always runs first or after a given other one."""
        live = [r for r in runners if r.error is None]
        if not live:
            return
        rounds = self.cfg.rounds_for(self.case)
        self.log(f"steady state: {WARMUP_CALLS} warm-up + {rounds} rounds of {len(live)} systems")
        events: dict[str, list[float]] = {r.name: [] for r in live}
        walls: dict[str, list[float]] = {r.name: [] for r in live}
        start = time.perf_counter()
        for i in range(WARMUP_CALLS + rounds):
            k = i % len(live)
            for r in live[k:] + live[:k]:
                if r.error is not None:
                    continue
                try:
                    ms, wall_ms = event_call(r, x)
                except Exception as exc:  # NOTE: this system's cell says so; the others go on
                    r.error = f"steady-state call {i}: {short(exc)}"
                    self.log(f"{r.name}: ERROR {r.error[:300]}")
                    continue
                if i >= WARMUP_CALLS:
                    events[r.name].append(ms)
                    walls[r.name].append(wall_ms)
        self.log(f"steady state took {time.perf_counter() - start:.1f} s")
        stats = {n: timing.summarize([v / 1e3 for v in s]) for n, s in events.items() if s}
        eager = stats.get("eager", {}).get("p50_ms")
        ro = stats.get("inductor-ro", {}).get("p50_ms")
        for r in live:
            if r.name not in stats or r.error is not None:
                continue
            st = dict(stats[r.name])
            st["wall"] = timing.summarize([v / 1e3 for v in walls[r.name]])
            st["speedup_vs_eager"] = eager / st["p50_ms"] if eager else None
            st["speedup_vs_inductor_ro"] = ro / st["p50_ms"] if ro else None
            r.record["latency"] = st

    def memory(self, runners: list[Runner], x: torch.Tensor) -> None:
        """The allocator's peak over one steady call of each system, over what was allocated
        before it."""
        for r in runners:
            if r.error is not None:
                continue
            try:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                y = r.call(x)
                torch.cuda.synchronize()
                del y
                peak = (torch.cuda.max_memory_allocated() - base) / MIB
                r.record.setdefault("memory", {})["steady_peak_mib"] = peak
            except Exception as exc:
                r.error = f"memory probe call: {short(exc)}"

    def parity(self, runners: list[Runner], model: nn.Module, x: torch.Tensor) -> None:
        """Every system's first output against eager's (displayed); plait's judged by the
        conformance gate. Integer inputs (GPT-2's ids) are redrawn by the gate with ``randint``
        over the example's own range (``plait.conformance.draws``): valid ids."""
        eager = next((r for r in runners if r.name == "eager" and r.output is not None), None)
        if eager is None or eager.output is None:
            return
        for r in runners:
            if r.name != "eager" and r.output is not None:
                r.record["vs_eager"] = parity.errors(r.output, eager.output)
        plait_runner = next((r for r in runners if r.name == "plait"), None)
        if plait_runner is None or plait_runner.fn is None or plait_runner.output is None:
            return  # NOTE: plait's first call failed: its error is its cell
        self.log("plait: conformance gate")
        start = time.perf_counter()
        with recording(plait_runner.warnings):
            gate = parity.gate(
                model, plait_runner.fn, x, module=model, draws=GATE_DRAWS,
                layouts=GATE_LAYOUTS, seed=self.cfg.seed,
            )  # fmt: skip
        gate["seconds"] = time.perf_counter() - start
        self.record["plait"]["gate"] = gate
        self.log(f"plait: gate {'pass' if gate['ok'] else 'FAILED'} ({gate['seconds']:.1f} s)")
        if any(f["check"] == "exception" for f in gate["failures"]):
            self.record["plait"]["anchored"] = anchored(model, x, plait_runner.output, eager.output)

    def warm_start(self, env: dict[str, str]) -> dict[str, Any]:
        """plait's first call in a new process on the caches its cold compile filled."""
        self.log("plait: warm start in a fresh process")
        spec = {
            "case": self.case.name,
            "size": self.cfg.size,
            "seed": self.cfg.seed,
            "env": env,
            "primer": str(self.workdir / "warm-primer"),
            "systems": list(self.cfg.systems),
            "out": str(self.workdir / "warm.json"),
        }
        rec = run_worker(spec, env)
        if "error" in rec:
            self.log(f"plait warm start: ERROR {rec['error'][:300]}")
        else:
            self.log(f"plait warm start: first call {rec['first_call_s']:.2f} s, "
                     f"{rec['kernels']['compiled']} Triton kernel(s) compiled")  # fmt: skip
        return rec


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def anchored(
    model: nn.Module, x: torch.Tensor, output: torch.Tensor, eager_out: torch.Tensor
) -> dict[str, Any]:
    """Where the gate raised: plait's first ``output`` and eager's on the example against a
    float64 copy of the model on the CPU, as max errors (displayed; no verdict)."""
    try:
        x64 = x.detach().cpu().double() if x.is_floating_point() else x.detach().cpu()
        with torch.no_grad():
            ref64 = _tensor(parity.float64_model(model)(x64))
    except Exception as exc:
        return {"note": "the gate could not run; no float64 reference either", "error": short(exc)}
    return {
        "note": "the gate could not run this case: max errors on the example against a float64 "
        "copy of the model (displayed, not judged)",
        "vs_eager": parity.errors(output, eager_out),
        "vs_float64": parity.errors(output, ref64),
        "eager_vs_float64": parity.errors(eager_out, ref64),
    }


def plait_evidence(compiled: Any) -> dict[str, Any]:
    """What plait compiled (``plait.explain``: node counts, kernels, fallbacks; regions when
    the module was split) and how its program runs (target, CUDA graph, cache status)."""
    import plait

    out = zoo_systems.plait_coverage(compiled)
    explanation = plait.explain(compiled)
    if explanation.regions is not None:
        regions = explanation.regions
        out["regions"] = {
            "compiled": sum(1 for g in regions["regions"] if g["status"] == "compiled"),
            "total": len(regions["regions"]),
            "compiled_share": regions["ops"].get("compiled_share"),
            "boundaries": [str(b["reason"]).splitlines()[0][:300] for b in regions["boundaries"]][
                :5
            ],
        }
    if explanation.specializations:
        m = explanation.specializations[-1].manifest
        out["target"] = m.executor.get("target")
        out["cuda_graph"] = m.executor.get("cuda_graph")
        out["cache"] = m.cache.get("status")
        out["options_backend"] = m.options.get("backend_choice") or m.options.get("backend")
        out["timings"] = {k: round(v, 4) for k, v in m.timings.items()}  # NOTE: cold's stages
    return out


# --- plait's warm start, in a fresh process ------------------------------------------------------
def run_worker(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Run ``--worker`` on ``spec`` in a new interpreter with the cold run's environment ``env``
    (its caches included: nothing set since, by inductor say, leaks in); its measurements, or
    ``{"error": ...}``."""
    spec_path = Path(spec["out"]).with_suffix(".spec.json")
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec))
    full_env = {**env, "PYTHONUNBUFFERED": "1"}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(timing.ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    cmd = [sys.executable, "-m", "benchmarks.cuda_suite", "--worker", str(spec_path)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=timing.ROOT, env=full_env, capture_output=True, text=True,
                              timeout=WORKER_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S:.0f} s"}
    out = Path(spec["out"])
    if proc.returncode != 0 or not out.exists():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        last = lines[-1] if lines else "no output"
        tail = " | ".join(lines[-16:-1])
        return {"error": f"exit {proc.returncode}: {last} (traceback tail: {tail})"[:4000]}
    result: dict[str, Any] = json.loads(out.read_text())
    result["process_wall_s"] = time.perf_counter() - start
    return result


def worker_main(spec_path: Path) -> int:
    """``--worker SPEC``: prime the process, build the case, time plait's first call on the
    cache directories the spec names, count the Triton kernels it compiled; write JSON."""
    spec = json.loads(spec_path.read_text())
    numerics_off()
    # NOTE: the same compilers primed as in the cold run's process: a compiler's import may set
    # what Triton's cache keys read (the parent primed inductor too)
    primer = prime(tuple(spec.get("systems", ("plait",))), Path(spec["primer"]))
    case = case_named(spec["case"])
    model, x = to_gpu(*case.build(spec["size"], int(spec["seed"])), case.dtype)
    env = {k: spec["env"][k] for k in CACHE_VARS}
    os.environ.update(env)
    caught: list[str] = []
    census = KernelCensus(census_dirs("plait", env))
    torch.cuda.synchronize()
    gc.collect()
    with torch.no_grad(), recording(caught), census:
        start = time.perf_counter()
        compiled, _ = wrap("plait", model)
        compiled(x)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
    evidence = plait_evidence(compiled)
    out = {
        "first_call_s": first,
        "kernels": census.record(),
        "cache": evidence.get("cache"),
        "cuda_graph": evidence.get("cuda_graph"),
        "primer": primer,
        "warnings": caught,
    }
    Path(spec["out"]).write_text(json.dumps(out, default=str))
    return 0


# --- the run -------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """The machine and software (``benchmarks.bench.timing.environment``), with the GPU, the
    Triton and cuDNN versions and the commit ("unknown" outside a git checkout)."""
    env = timing.environment(torch.get_num_threads())
    try:
        triton = importlib.import_module("triton").__version__
    except ImportError:
        triton = None
    env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    env["triton"] = triton
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env["commit"] = (env.get("git") or {}).get("commit") or "unknown"
    return env


def skipped(case: Case, reason: str) -> dict[str, Any]:
    return {"name": case.name, "what": case.what, "status": "skipped", "error": reason,
            "systems": {}, "plait": {}}  # fmt: skip


def run_suite(cfg: Config) -> dict[str, Any]:
    """Every selected case, in order; the outputs rewritten after each."""
    numerics_off()
    root = Path(tempfile.mkdtemp(prefix="plait-cuda-suite-"))
    os.environ.update(cache_env(root / "process"))  # NOTE: nothing reads a user's cache
    start = time.perf_counter()
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": STEM,
        "config": cfg.record(),
        "environment": environment(),
        "primer": None,
        "cases": [],
    }
    result["verdict"] = verdict(result["cases"])
    env = result["environment"]
    log(f"{env['gpu']} · torch {env['torch']} · triton {env['triton']} · commit "
        f"{env['commit'][:10]} · cases {', '.join(cfg.cases)} · systems {', '.join(cfg.systems)}"
        f" · {cfg.size} size")  # fmt: skip
    try:
        log("primer: one tiny compile per compiler (per-process costs)")
        result["primer"] = prime(cfg.systems, root / "primer")
        for name in cfg.cases:
            case = case_named(name)
            elapsed = time.perf_counter() - start
            if cfg.budget_s is not None and elapsed > cfg.budget_s:
                rec = skipped(case, f"time budget: {elapsed:.0f} s > {cfg.budget_s:.0f} s")
                log(f"{name}: skipped ({rec['error']})")
            else:
                rec = CaseRun(cfg, case, root / name).run()
            result["cases"].append(rec)
            result["verdict"] = verdict(result["cases"])
            result["environment"]["elapsed_s"] = time.perf_counter() - start
            write_outputs(result, cfg.out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["environment"]["load_average_end"] = list(os.getloadavg())
    write_outputs(result, cfg.out)
    return result


def verdict(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """plait failing the gate is the one fatal outcome (exit 1); errors are listed."""
    failures, errors, plait_errors = [], [], []
    for c in cases:
        gate = c.get("plait", {}).get("gate")
        if gate is not None and not gate["ok"]:
            failures.append(f"{c['name']}: {zoo_report.worst(gate)}")
        for name, s in c.get("systems", {}).items():
            if s.get("error"):
                errors.append(f"{c['name']} / {name}: {s['error']}")
                if name.startswith("plait"):
                    plait_errors.append(f"{c['name']} / {name}")
        if c.get("status") in ("ran", "error") and c.get("error"):
            errors.append(f"{c['name']}: {c['error']}")
        warm = c.get("plait", {}).get("warm") or {}
        if warm.get("error"):
            errors.append(f"{c['name']} / plait warm start: {warm['error']}")
    return {
        "parity_ok": not failures,
        "plait_failures": failures,
        "plait_errors": plait_errors,
        "errors": errors,
        "exit_code": 1 if failures else 0,
    }


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """``cuda_suite.json`` (strict JSON) and ``cuda_suite.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(result), indent=2, allow_nan=False, default=str)
    (out / f"{STEM}.json").write_text(text + "\n")
    (out / f"{STEM}.md").write_text(markdown(result) + "\n")


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as None (strict JSON)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# --- the report ----------------------------------------------------------------------------------
def _ms(s: dict[str, Any] | None) -> str:
    if s is None:
        return "–"
    if s.get("error"):
        return "**error**"
    lat = s.get("latency")
    return "–" if not lat else f"{lat['p50_ms']:.3f}"


def _ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _seconds(s: dict[str, Any] | None) -> float | None:
    return ((s or {}).get("cold") or {}).get("first_call_s")


def _cold_cell(systems: dict[str, Any]) -> str:
    p, ro = _seconds(systems.get("plait")), _seconds(systems.get("inductor-ro"))
    left = "–" if p is None else f"{p:.1f}"
    right = "–" if ro is None else f"{ro:.1f}"
    ratio = f" ({p / ro:.2f})" if p is not None and ro else ""
    return f"{left} / {right}{ratio}"


def _warm_cell(c: dict[str, Any]) -> str:
    warm = c.get("plait", {}).get("warm")
    if not warm:
        return "–"
    if warm.get("error"):
        return "**error**"
    total = (c.get("plait", {}).get("evidence") or {}).get("kernels")
    of = f" of {total}" if total is not None else ""
    return f"{warm['kernels']['compiled']}{of} ({warm['first_call_s']:.1f} s)"


def _gate_cell(c: dict[str, Any]) -> str:
    p = c.get("plait", {})
    anchor = p.get("anchored")
    if anchor:
        vs64 = (anchor.get("vs_float64") or {}).get("max_abs")
        shown = "" if vs64 is None else f"; max abs vs float64 {vs64:.3g}"
        return f"**raised under the gate**{shown}"
    return zoo_report._gate(p.get("gate"))


def _graph_cell(c: dict[str, Any]) -> str:
    ev = c.get("plait", {}).get("evidence") or {}
    graph = ev.get("cuda_graph")
    if graph is None:
        return "split into regions" if ev.get("regions") else "–"
    if graph.get("used"):
        return "yes"
    return f"no: {str(graph.get('reason', '?'))[:120]}"


def _plait_cell(c: dict[str, Any]) -> str:
    """plait's median, marked when plait did not compile the whole program (``partial``: some
    nodes ran in PyTorch; ``fallback``: all of it did)."""
    cell = _ms(c["systems"].get("plait"))
    status = (c.get("plait", {}).get("evidence") or {}).get("status")
    return cell if status in (None, "whole") or cell == "**error**" else f"{cell} ({status})"


def summary_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in result["cases"]:
        if c["status"] != "ran":
            rows.append([c["name"], f"{c['status']}: {str(c['error'])[:120]}"] + ["–"] * 9)
            continue
        sy = c["systems"]
        plait_lat = (sy.get("plait") or {}).get("latency") or {}
        rows.append([
            c["name"], _ms(sy.get("eager")), _ms(sy.get("inductor")), _ms(sy.get("inductor-ro")),
            _plait_cell(c), _ratio(plait_lat.get("speedup_vs_inductor_ro")),
            _ratio(plait_lat.get("speedup_vs_eager")), _cold_cell(sy), _warm_cell(c),
            _gate_cell(c), _graph_cell(c),
        ])  # fmt: skip
    return rows


def _num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def system_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in result["cases"]:
        for name, s in c.get("systems", {}).items():
            lat, cold, mem = s.get("latency") or {}, s.get("cold") or {}, s.get("memory") or {}
            err = s.get("error")
            rows.append([
                c["name"], name, _num(lat.get("p50_ms"), 3), _num(lat.get("p95_ms"), 3),
                _ratio(lat.get("speedup_vs_eager")), _ratio(lat.get("speedup_vs_inductor_ro")),
                _num(cold.get("first_call_s")), _num(cold.get("first_three_calls_s")),
                str((cold.get("kernels") or {}).get("compiled", "–")),
                _num(mem.get("steady_peak_mib"), 1), _num(mem.get("resident_mib"), 1),
                _num((s.get("vs_eager") or {}).get("max_abs"), 4),
                "**error**" if err else "",
            ])  # fmt: skip
    return rows


def evidence_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in result["cases"]:
        ev = c.get("plait", {}).get("evidence")
        if not ev:
            continue
        counts = ev.get("counts") or {}
        fallbacks = "; ".join(ev.get("fallbacks") or [])[:200] or "–"
        rows.append([
            c["name"], str(ev.get("status")), str(counts.get("native", "–")),
            str(counts.get("extern", "–")), str(counts.get("fallback", "–")),
            str(ev.get("kernels", "–")), _graph_cell(c), str(ev.get("cache", "–")), fallbacks,
        ])  # fmt: skip
    return rows


def _parity_line(v: dict[str, Any]) -> str:
    if not v["parity_ok"]:
        return "**plait parity: FAILED**: " + "; ".join(v["plait_failures"])
    line = "**plait parity: passed on every case judged**"
    if v.get("plait_errors"):
        line += "; **plait raised** on " + ", ".join(v["plait_errors"]) + " (see Errors)"
    return line


def markdown(result: dict[str, Any]) -> str:
    """The report: the summary table, every system's numbers, plait's evidence, errors."""
    env, cfg, v = result["environment"], result["config"], result["verdict"]
    primer = result.get("primer") or {}
    primed = ", ".join(f"{k} {p['seconds']:.1f} s" + (" (error)" * bool(p.get("error")))
                       for k, p in primer.items()) or "–"  # fmt: skip
    lines = [
        "# plait on CUDA: eager, torch.compile and plait",
        "",
        f"{env.get('date')} · {env.get('gpu')} · torch {env.get('torch')} · triton "
        f"{env.get('triton')} · plait {env.get('plait')} · commit {str(env.get('commit'))[:10]}"
        f" · {cfg['size']} size · TF32 off · primer (per-process costs, not counted): {primed}",
        "",
        _parity_line(v),
        "",
        f"Steady state: median CUDA-event ms of one call on an idle device, after "
        f"{cfg['warmup_calls']} warm-up calls, systems interleaved round-robin. *plait vs ro*: "
        "inductor-ro median / plait median, *plait vs eager*: eager / plait (above 1: plait "
        "faster). *Cold compile*: first call on empty caches, plait s / inductor-ro s (ratio "
        "below 1: plait compiles faster). *Warm kernels compiled*: Triton kernels a fresh "
        "process compiled on the caches the cold compile filled, of plait's kernels (that "
        "process's first call). *Gate*: the conformance gate on plait, "
        f"{cfg['gate_draws']} fresh draws plus the example and a stress draw.",
        "",
    ]  # fmt: skip
    head = ["case", "eager ms", "inductor ms", "inductor-ro ms", "plait ms", "plait vs ro",
            "plait vs eager", "cold compile plait s / inductor-ro s (ratio)",
            "warm kernels compiled", "gate", "cuda graph"]  # fmt: skip
    lines += zoo_report._table(head, summary_rows(result))
    lines += ["", "## Every system", ""]
    head = ["case", "system", "median ms", "p95 ms", "vs eager", "vs inductor-ro",
            "first call s", "first 3 calls s", "Triton kernels compiled (cold)",
            "steady peak MiB", "resident MiB", "max abs vs eager", "error"]  # fmt: skip
    lines += zoo_report._table(head, system_rows(result))
    lines += [
        "",
        "*First call*: wrapper, compile and first run, synchronized, on empty caches; "
        f"plait-nograph's is {NOGRAPH_NOTE}. *Resident*: allocator growth over the first three "
        "calls (a CUDA graph capture frees cuBLAS's workspaces: it can be negative). *Steady "
        "peak*: allocator peak over one later call, over what was allocated before it.",
    ]
    rows = evidence_rows(result)
    if rows:
        lines += ["", "## plait's evidence", ""]
        head = ["case", "status", "native", "extern", "fallback", "Triton kernels",
                "cuda graph", "artifact cache", "fallbacks"]  # fmt: skip
        lines += zoo_report._table(head, rows)
    if v["errors"]:
        lines += ["", "## Errors", ""]
        lines += [f"- {e[:600]}" for e in v["errors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.worker is not None:
        return worker_main(cfg.worker)
    problem = cuda_problem()
    if problem is not None:
        print(f"cuda_suite: {problem}", file=sys.stderr, flush=True)
        return 2
    result = run_suite(cfg)
    print(markdown(result), flush=True)
    for line in result["verdict"]["plait_failures"]:
        print(f"FAILED: {line}", file=sys.stderr, flush=True)
    return int(result["verdict"]["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
