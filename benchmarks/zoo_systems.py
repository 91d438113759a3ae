"""The systems the zoo benchmark compares on one model, each prepared so that a failure is a
record (its error text), never the end of the run.

``eager`` is the module itself; ``plait`` is ``plait.compile(module, backend="stax",
options={"cache": False})``; ``inductor`` is ``torch.compile(module, backend="inductor",
dynamic=False)``; ``onnxruntime`` and ``openvino`` run one ONNX file exported once per model with
``torch.onnx.export`` (the dynamo exporter, else the TorchScript one), ONNX Runtime on its CPU
execution provider and OpenVINO on ``CPU`` with ``INFERENCE_PRECISION_HINT=f32``. Both fix their
thread count when a session is made, so each thread count gets its own session; the cold
compile is that of the first.

Example:
    >>> short(ValueError("x" * 3000))[:12], len(short(ValueError("x" * 3000)))
    ('ValueError: ', 1000)
"""

from __future__ import annotations

import importlib.util
import io
import logging
import time
import warnings
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

KINDS = ("eager", "plait", "inductor", "onnxruntime", "openvino")
PACKAGES = {"onnxruntime": "onnxruntime", "openvino": "openvino"}
MAX_ERROR = 1000
Fn = Callable[[torch.Tensor], torch.Tensor]


def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR]


def unavailable(kind: str) -> str | None:
    """Why ``kind`` cannot run here (a missing package), or None."""
    pkg = PACKAGES.get(kind)
    if pkg is not None and importlib.util.find_spec(pkg) is None:
        return f"{pkg} is not installed (pip install -e '.[bench]')"
    if kind in ("onnxruntime", "openvino") and importlib.util.find_spec("onnx") is None:
        return "onnx is not installed (torch.onnx.export needs it)"
    return None


@dataclass
class OnnxFile:
    """The model exported once to ONNX; shared by ONNX Runtime and OpenVINO."""

    path: Path | None = None
    exporter: str | None = None
    export_s: float | None = None
    error: str | None = None
    attempts: list[str] = field(default_factory=list)

    @classmethod
    def export(cls, module: nn.Module, example: torch.Tensor, path: Path) -> OnnxFile:
        errors = []
        # NOTE: the exporter logs a line per torchvision operator it cannot register.
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        for dynamo in (True, False):
            name = "dynamo" if dynamo else "torchscript"
            start = time.perf_counter()
            try:
                # NOTE: the exporter prints its progress to stdout, where the report goes.
                with warnings.catch_warnings(), torch.no_grad(), redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    torch.onnx.export(
                        module, (example,), str(path), dynamo=dynamo, input_names=["x"],
                        output_names=["y"], external_data=False,
                    )  # fmt: skip
            except Exception as exc:  # NOTE: each exporter's failure is kept; the next is tried.
                errors.append(f"{name}: {short(exc)}")
                continue
            return cls(path, name, time.perf_counter() - start, None, errors)
        return cls(None, None, None, " | ".join(errors)[: 2 * MAX_ERROR], errors)


@dataclass
class Runner:
    """One system on one model: a callable per thread count, made on first use."""

    kind: str
    module: nn.Module
    example: torch.Tensor
    onnx: OnnxFile | None = None
    error: str | None = None
    compile: dict[str, Any] = field(default_factory=dict)
    compiled: Any = None  # what plait.compile / torch.compile returned
    _fns: dict[int, Fn] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def prepare(self, threads: int) -> None:
        """Make the callable for the first thread count and time its cold first call."""
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._fns[threads] = self._make(threads, cold=True)
            self.warnings += list(dict.fromkeys(str(w.message)[:MAX_ERROR] for w in caught))
        except Exception as exc:  # NOTE: recorded in this system's cells; the run goes on.
            self.error = short(exc)

    def fn(self, threads: int) -> Fn:
        if threads not in self._fns:
            self._fns[threads] = self._make(threads, cold=False)
        return self._fns[threads]

    def _make(self, threads: int, cold: bool) -> Fn:
        if self.kind == "eager":
            return self.module
        if self.kind in ("plait", "inductor"):
            return self._torch_compiler(threads)
        if self.onnx is None or self.onnx.path is None:
            raise RuntimeError(f"no ONNX file: {self.onnx.error if self.onnx else 'not exported'}")
        start = time.perf_counter()
        fn = _ort(self.onnx.path, threads) if self.kind == "onnxruntime" else None
        if self.kind == "openvino":
            fn = _openvino(self.onnx.path, threads)
        if fn is None:
            raise ValueError(f"unknown system kind {self.kind!r}")
        session_s = time.perf_counter() - start
        if cold:
            first_s = _first_call(fn, self.example)
            self.compile = {
                "export_s": self.onnx.export_s,
                "exporter": self.onnx.exporter,
                "session_s": session_s,
                "first_call_s": first_s,
                "cold_s": (self.onnx.export_s or 0.0) + session_s + first_s,
            }
        return fn

    def _torch_compiler(self, threads: int) -> Fn:
        if self.compiled is not None:
            return self.compiled  # type: ignore[no-any-return]
        if self.kind == "inductor":
            # NOTE: Dynamo keeps compiled entries per code object across models (the zoo's
            # wrapper forward is one code object): past its recompile limit it would run the
            # next models eagerly, unannounced. Each model starts from a reset Dynamo, and a
            # first call that compiled no graph is an error, not an inductor timing.
            torch._dynamo.reset()
        start = time.perf_counter()
        if self.kind == "plait":
            import plait

            self.compiled = plait.compile(self.module, backend="stax", options={"cache": False})
        else:
            self.compiled = torch.compile(self.module, backend="inductor", dynamic=False)
        wrapper_s = time.perf_counter() - start
        first_s = _first_call(self.compiled, self.example)
        self.compile = {"wrapper_s": wrapper_s, "first_call_s": first_s,
                        "cold_s": wrapper_s + first_s}  # fmt: skip
        if self.kind == "inductor":
            from torch._dynamo.utils import counters

            graphs = int(counters["stats"]["unique_graphs"])
            self.compile["graphs"] = graphs
            if graphs == 0:
                raise RuntimeError("torch.compile compiled no graph: the model ran eagerly")
        return self.compiled  # type: ignore[no-any-return]


def _first_call(fn: Fn, x: torch.Tensor) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn(x)
    return time.perf_counter() - start


def _ort(path: Path, threads: int) -> Fn:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        (y, *_) = sess.run(None, {name: x.detach().cpu().numpy()})
        return torch.from_numpy(np.asarray(y))

    return run


def _openvino(path: Path, threads: int) -> Fn:
    import openvino as ov

    core = ov.Core()
    config = {
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
    }
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = compiled.create_infer_request()

    def run(x: torch.Tensor) -> torch.Tensor:
        request.infer({0: x.detach().cpu().numpy()})
        # NOTE: the request reuses its output buffer; a copy keeps each call's result its own.
        return torch.from_numpy(np.array(request.get_output_tensor(0).data, copy=True))

    return run


# --- what plait's manifest says ------------------------------------------------------------------
def plait_coverage(compiled: Any) -> dict[str, Any]:
    """How much of the model plait compiled, from ``plait.explain``: ``status`` is ``whole``
    (every node native or extern), ``partial`` (some nodes run by PyTorch as opaque or Stax
    fallback nodes), or ``fallback`` (capture failed: the whole program ran eagerly); the share
    of nodes compiled, and the manifest's fallback records with their reasons."""
    import plait

    explanation = plait.explain(compiled)
    if not explanation.specializations:
        return {"status": "not compiled", "specializations": 0}
    m = explanation.specializations[-1].manifest
    fallbacks = [f"{f.get('what')}: {f.get('reason')}"[:MAX_ERROR] for f in m.fallbacks]
    whole_program = any(f.get("what") == "whole program" for f in m.fallbacks)
    counts = {k: int(v) for k, v in m.executor.get("evidence", {}).get("counts", {}).items()}
    opaque = sum(1 for f in m.fallbacks if str(f.get("what", "")).startswith("opaque "))
    ran = counts.get("native", 0) + counts.get("extern", 0) + counts.get("fallback", 0)
    share = (counts.get("native", 0) + counts.get("extern", 0)) / ran if ran else None
    if whole_program:
        status = "fallback"
    elif counts.get("fallback", 0) or opaque:
        status = "partial"
    else:
        status = "whole"
    return {
        "status": status,
        "backend": m.executor.get("backend"),
        "counts": counts,
        "compiled_share": 0.0 if whole_program else share,
        "opaque_records": opaque,
        "fallbacks": fallbacks,
        "nodes_captured": m.graph.get("nodes_captured"),
        "nodes_optimized": m.graph.get("nodes_optimized"),
        "kernels": len(m.kernels.get("kernels", [])),
        "specializations": len(explanation.specializations),
    }
