"""Tuning a TVM kernel with MetaSchedule (``tvm_tune: N``): N measured trials over the knobs of
plait's schedule (:mod:`plait.codegen.tvm_schedule`: vector widths, phase fusion, parallel
loop, unrolling), each trial a fresh sample of every knob; then the faster of the best trial
and the default schedule, timed here on the same inputs: a short search never makes a kernel
slower than untuned. (TVM's generic rules for CPUs were tried first: with a few random trials
their space of compute locations gave kernels ten times slower than the default schedule.)

The tuning log (MetaSchedule's workload and tuning records, and which schedule won) is what
:mod:`plait.codegen.tvm_build` keeps beside the kernel in the kernel cache; given a log, the
kernel is rebuilt from it without searching again.

Each trial runs the schedule function again (``replay-func``), with TVM's random cost model
(no XGBoost needed), ``num_trials_per_iter`` at most 16; candidates are built and timed in this
process (TVM's own local builder and runner start worker processes that each import TVM:
seconds per worker, and their 30-second timeouts expire on a loaded machine).

Example:
    >>> TRIALS_PER_ITERATION
    16
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plait.codegen.tvm_schedule import default_schedule, sampled_choice, schedule
from plait.codegen.tvm_script import TvmSource

TRIALS_PER_ITERATION = 16
_FILES = ("database_workload.json", "database_tuning_record.json")


def tuned_module(
    mod: Any,
    target: Any,
    src: TvmSource,
    parallel_threshold: int,
    trials: int,
    log: bytes | None,
    work_dir: Path,
) -> tuple[Any, bytes | None, dict[str, Any]]:
    """The module to compile (the search's best or the default schedule), the log made (None
    when ``log`` was given and used) and the tuning record for the manifest."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    default = default_schedule(mod, src, parallel_threshold)

    tuned_target = tvm.target.Target({**dict(target.export()), "num-cores": _cores()})
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    saved = json.loads(log) if log is not None else None
    if saved is not None:
        for name in _FILES:
            (work_dir / name).write_text(saved[name])
    else:

        def sample(sch: Any) -> Any:
            return schedule(sch, src, parallel_threshold, sampled_choice)

        space = ms.space_generator.ScheduleFn(sample, sch_rules=[], postprocs=[], mutator_probs={})
        with _without_tensor_intrinsics(), _quiet():
            ms.tune_tir(
                mod,
                tuned_target,
                str(work_dir),
                max_trials_global=trials,
                num_trials_per_iter=min(trials, TRIALS_PER_ITERATION),
                builder=_builder(),
                runner=_runner(),
                cost_model="random",
                space=space,
                strategy="replay-func",
                seed=0,
            )
    database = ms.database.JSONDatabase(
        path_workload=str(work_dir / _FILES[0]), path_tuning_record=str(work_dir / _FILES[1])
    )
    sch = ms.tir_integration.compile_tir(database, mod, tuned_target)
    searched = time.perf_counter() - start
    record: dict[str, Any] = {"trials": trials, "from_log": saved is not None}
    if sch is None:
        record.update(chosen="default", reason="MetaSchedule found no valid schedule")
        best = default
    elif saved is not None:
        best = sch.mod if saved["chosen"] == "tuned" else default
        record.update(chosen=saved["chosen"], tuned_us=saved.get("tuned_us"))
        record["default_us"] = saved.get("default_us")
    else:
        tuned_us, default_us = (_time(m, target) for m in (sch.mod, default))
        chosen = "tuned" if tuned_us <= default_us else "default"
        best = sch.mod if chosen == "tuned" else default
        record.update(chosen=chosen, tuned_us=round(tuned_us, 3), default_us=round(default_us, 3))
    record["seconds"] = round(searched, 3)
    made = None
    if saved is None:
        made_doc: dict[str, Any] = {name: (work_dir / name).read_text() for name in _FILES}
        made_doc.update({k: record.get(k) for k in ("chosen", "tuned_us", "default_us")})
        made = json.dumps(made_doc, sort_keys=True).encode()
    return best, made, record


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """MetaSchedule configures its loggers on each search, with a console handler on stdout
    that prints every round's table (its file logs go to the work directory, removed after):
    the console gets what is printed during the search, and the logger's level is put back."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _without_tensor_intrinsics() -> Iterator[None]:
    """While tuning: ``tvm.s_tir.tensor_intrin`` as an empty module. A tuning task imports it,
    which parses some 500 TVMScript intrinsics (CUDA, ROCm, Arm; half a minute or more here);
    the LLVM rules tune no tensor intrinsic. An import that was already made stays."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        yield
        return
    sys.modules[name] = types.ModuleType(name, "plait: not imported while tuning")
    try:
        yield
    finally:
        sys.modules.pop(name, None)


_BUILT: dict[str, Any] = {}  # NOTE: artifact name -> module built in this process


def _builder() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs: list[Any]) -> list[Any]:
            import tvm

            out = []
            for b in build_inputs:
                try:
                    with tvm.transform.PassContext(
                        opt_level=3, config={"tirx.disable_assert": True}
                    ):
                        built = tvm.compile(b.mod, target=b.target)
                except Exception as exc:  # NOTE: a candidate that fails to build
                    out.append(BuilderResult(None, f"{type(exc).__name__}: {exc}"[:2000]))
                    continue
                # NOTE: MetaSchedule removes an artifact's directory once it has run
                name = str(Path(tempfile.mkdtemp(prefix="plait-tvm-candidate-")) / "module")
                _BUILT[name] = built.mod
                out.append(BuilderResult(name, None))
            return out

    return InProcessBuilder()


def _runner() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    @derived_object
    class Measured(PyRunnerFuture):
        def __init__(self, seconds: list[float] | None, error: str | None) -> None:
            super().__init__()
            self.seconds, self.error = seconds, error

        def done(self) -> bool:
            return True

        def result(self) -> Any:
            return RunnerResult(self.seconds, self.error)

    @derived_object
    class InProcessRunner(PyRunner):
        def run(self, runner_inputs: list[Any]) -> list[Any]:
            out = []
            for r in runner_inputs:
                module = _BUILT.pop(r.artifact_path)
                try:
                    args = [
                        _random_tensor(str(a.dtype), [int(x) for x in a.shape]) for a in r.args_info
                    ]
                    timer = module.time_evaluator(
                        module.entry_name, _cpu(), number=10, repeat=3, min_repeat_ms=5
                    )
                    out.append(Measured([float(x) for x in timer(*args).results], None))
                except Exception as exc:  # NOTE: a candidate that fails to run
                    out.append(Measured(None, f"{type(exc).__name__}: {exc}"[:2000]))
            return out

    return InProcessRunner()


def _cpu() -> Any:
    import tvm

    return tvm.cpu()


def _random_tensor(dtype: str, shape: list[int]) -> Any:
    import numpy as np
    import tvm

    rng = np.random.default_rng(0)
    if dtype.startswith("float"):
        data = rng.standard_normal(shape).astype(dtype)
    else:
        data = rng.integers(1, 3, size=shape).astype(dtype)
    return tvm.runtime.tensor(data)


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _time(mod: Any, target: Any) -> float:
    """Microseconds per call of ``mod``'s one function on random inputs (median of repeats)."""
    import numpy as np
    import tvm

    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
        ex = tvm.compile(mod, target=target)
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    (gv,) = mod.get_global_vars()
    args = [
        _random_tensor(str(a.dtype), [int(x) for x in a.shape])
        for a in ArgInfo.from_prim_func(mod[gv])
    ]
    timer = ex.mod.time_evaluator(
        ex.mod.entry_name, tvm.cpu(), number=20, repeat=5, min_repeat_ms=20
    )
    return float(np.median(timer(*args).results)) * 1e6
