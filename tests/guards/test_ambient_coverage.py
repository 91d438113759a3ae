"""Every ambient setting the compiler reads is covered by a guard or a cache key part.

A read of process state that no guard covers is a bug (a compiled program reused where its
assumptions no longer hold). This test finds every such read in the compiler's source and holds
it to the table below: a new read fails here until it is classified, and its guard or key part
gets a test of its own (tests/guards/test_guard_kinds.py, tests/cache/test_key_parts.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import plait
from plait.guards import ambient
from plait.guards.ambient import call_settings, onednn_environment, process_settings

SRC = Path(plait.__file__).parent
PATTERN = re.compile(
    r"get_num_threads|allow_tf32|float32_matmul_precision|deterministic_algorithms|"
    r"/proc/cpuinfo|get_device_capability|get_default_dtype|mkldnn\.is_available|"
    r"mkldnn\.enabled|cudnn\.|is_autocast_enabled|is_grad_enabled|os\.environ|cpu_count|"
    r"fp32_precision|_get_cublas|_get_cudnn|_get_mkldnn|_get_deterministic|flush_denormal|"
    r"fastpath_enabled|is_anomaly_enabled|_get_warnAlways"
)
# NOTE: not the compiler: the gate reads what it compares under, and the ambient table itself.
SKIP = ("conformance/", "guards/ambient.py")

# NOTE: plait.settings reads (and re-applies) the settings every specialization's guards pin, for
# the artifact protocol (which settings a user's calls ran under); it decides nothing compiled.
_PROTOCOL = "the artifact protocol's settings of a call, each pinned by a guard"

# NOTE: plait.speculative_run reads them to decide whether a warm start's first run starts
# early and under which hint; what a call is served is the specialization's own program, checked
# after capture, whatever the hint named.
_EARLY = "whether a first run starts before capture ends (a hint), never what a call is served"

# NOTE: plait.frontend.mutable_library_values.READERS: getters a program may name, each asked
# again on every call by the Python values guard of the programs that name it.
_READER = "guard: the Python values guard's getter check, where the program names the getter"

# (file, what it reads) -> what covers it
COVERED = {
    ("frontend/guard_build.py", "is_grad_enabled"): "guard grad_mode",
    ("frontend/guard_build.py", "get_default_dtype"): "guard torch.get_default_dtype()",
    ("frontend/default_dtype.py", "get_default_dtype"): "guard torch.get_default_dtype() (the "
    "default a capture's builder casts integer operands to)",
    ("frontend/aten_emit.py", "get_default_dtype"): "a docstring: a factory's dtype is written "
    "out, nothing read",
    ("ir/ops/rules.py", "get_default_dtype"): "its docstring: the IR's rules never read it",
    ("ir/ops/aten.py", "get_default_dtype"): "guard torch.get_default_dtype() (an ATen node's "
    "types memo is keyed by the default in force where the node is typed)",
    ("frontend/guard_build.py", "is_autocast_enabled"): "guard torch.autocast",
    ("frontend/capture_values.py", "is_grad_enabled"): "guard grad_mode (capture's own)",
    ("frontend/grad_replay.py", "is_autocast_enabled"): "guard torch.autocast (each recorded "
    "call's autocast, compared with the refusal's before a replay)",
    ("frontend/continuation.py", "is_grad_enabled"): "guard grad_mode (whether a capture "
    "records its calls to go on with grad at a refusal)",
    ("frontend/nested_fast_path.py", "is_grad_enabled"): "guard grad_mode (whether eager's "
    "TransformerEncoder would take its nested fast path, which the capture then refuses)",
    ("frontend/nested_fast_path.py", "is_autocast_enabled"): "guard torch.autocast (the same "
    "decision: eager's fast path needs autocast off)",
    ("frontend/tracer.py", "is_grad_enabled"): "guard grad_mode (capture's own, compared with "
    "PyTorch's inside inference mode or a custom autograd.Function's forward)",
    ("frontend/tracer.py", "is_autocast_enabled"): "guard torch.autocast (the ambient one); "
    "autocast entered by the program is captured as casts: here it only decides whether a call "
    "is left uncomputed, never the graph (frontend.unsampled)",
    ("frontend/late_values.py", "is_autocast_enabled"): "guard torch.autocast (the ambient "
    "one); autocast entered by the program is captured as casts: here it only decides whether "
    "skipped calls are computed when read or captured again, never the graph",
    ("backends.py", "is_grad_enabled"): "guard grad_mode (decides freezing and the backend)",
    ("regions/op_counts.py", "is_autocast_enabled"): "explain's op counts only: a call under "
    "autocast is not measured (a dispatch mode would change its fused kernels), never the graph",
    ("frontend/lower_math.py", "is_grad_enabled"): "guard grad_mode (hardtanh's and a tensor "
    "clamp's gradient-exact capture)",
    ("guards/state.py", "is_grad_enabled"): "guard grad_mode (what the frozen guard reads)",
    ("codegen/onednn_postops.py", "mkldnn.is_available"): "key ambient.mkldnn_available",
    ("codegen/timed_matmul.py", "mkldnn.is_available"): "key ambient.mkldnn_available",
    ("codegen/timed_matmul.py", "float32_matmul_precision"): "guard "
    "torch.get_float32_matmul_precision() (whether a product may run oneDNN's matmul)",
    ("codegen/timed_matmul.py", "fp32_precision"): "guard "
    "torch.backends.mkldnn.matmul.fp32_precision (oneDNN's math mode: strict float32 only)",
    ("codegen/build.py", "/proc/cpuinfo"): "key ambient.cpu, toolchain.cxx.cpu_flags_sha256 (the "
    "one reader of it: manifest.cpu_features and the toolchain take build.cpu_info)",
    ("codegen/build.py", "os.environ"): "CXX: key toolchain.cxx.version; cache dir; test hook",
    ("codegen/build.py", "cpu_count"): "build parallelism only: the same libraries",
    ("codegen/tvm_build.py", "os.environ"): "PLAIT_STAX_NO_COMPILE: the test hook that forbids "
    "building a kernel (as build.py's), never what is built; TVM_NUM_THREADS set (where unset) "
    "for TVM's thread pool: how fast kernels run, never what they compute",
    ("codegen/timed_choices.py", "get_num_threads"): "guard torch.get_num_threads(); part of a "
    "timed decision's key (timings move with the thread count), never of what a library computes",
    ("codegen/timed_choices.py", "os.environ"): "the oneDNN and MKL environment variables: part "
    "of a timed decision's key (timings move with the kernels they let those libraries pick), "
    "never of what a library computes; the oneDNN ones are key ambient.onednn_env too",
    ("codegen/tvm_build.py", "get_num_threads"): "guard torch.get_num_threads() (TVM's thread "
    "pool sized as the C++ kernels' OpenMP; speed only)",
    ("runtime/program.py", "cpu_count"): "build parallelism only: the same libraries",
    ("speculative_run.py", "cpu_count"): _EARLY,
    ("speculative_run.py", "get_num_threads"): _EARLY,
    ("speculative_run.py", "is_grad_enabled"): _EARLY,
    ("speculative_run.py", "get_default_dtype"): _EARLY,
    ("runtime/kernel_targets.py", "cpu_count"): "compile parallelism only: the same kernels",
    ("export/native_triton.py", "cpu_count"): "compile parallelism only: the same kernels",
    ("runtime/runner_emit.py", "is_grad_enabled"): "read per call, at run time (nothing compiled)",
    ("ir/ops/aten.py", "is_grad_enabled"): "read per call by an ATen node's reference, at run "
    "time: eager's training overload where a gradient flows (nothing compiled)",
    ("autograd/function.py", "is_grad_enabled"): "read in the compiled backward, at run time: "
    "refuses a second-order gradient (nothing compiled)",
    ("autograd/function.py", "is_autocast_enabled"): "read per call, at run time: turns autocast "
    "off while a compiled program runs (nothing compiled)",
    ("distributed/release.py", "is_grad_enabled"): "read in the compiled backward released by "
    "bucket, at run time: refuses a second-order gradient (nothing compiled)",
    ("frontend/capture_values.py", "is_autocast_enabled"): "guard torch.autocast (whether capture "
    "writes autocast's casts, frontend.autocast)",
    ("frontend/autocast.py", "is_autocast_enabled"): "guard torch.autocast (its dtype too: capture "
    "writes its casts)",
    ("manifest.py", "get_device_capability"): "recorded in the manifest; key gpu_capability",
    ("cache/__init__.py", "os.environ"): "the cache's location, never its key",
    ("codegen/admission.py", "os.environ"): "TRITON_INTERPRET: refuses the Triton target on CPU "
    "tensors outside Triton's interpreter; what compiles does not depend on it",
    ("codegen/triton_load.py", "os.environ"): "TRITON_INTERPRET: which math module a loaded "
    "kernel binds (libdevice, or the interpreter's numpy shim): how one kernel source runs, "
    "read each time a kernel loads, never part of what is cached",
    ("cache/store.py", "os.environ"): "the cache's size limit, never its key",
    ("codegen/triton_pool.py", "os.environ"): "Triton's variables handed to its compile "
    "workers, so they compile under this process's keys (a worker's key is checked against "
    "this process's): where kernels compile, never what",
    ("codegen/triton_pool.py", "cpu_count"): "compile parallelism only: the same kernels",
    ("triton_worker.py", "os.environ"): "a compile worker takes the compiling process's Triton "
    "variables: the same kernels, under the same keys",
    ("cache/remote.py", "os.environ"): "the remote tier's URL, TTL and entry size limit: where "
    "entries are kept and for how long, never their key",
    ("guards/native.py", "os.environ"): "where the guard evaluator is cached, whether it is "
    "used: how guards run, never what they check",
    ("cache/snapshots.py", "is_grad_enabled"): "front key mode; guard grad_mode (rebuilt)",
    ("cache/snapshots.py", "get_default_dtype"): "front key mode; guard default dtype (rebuilt)",
    ("ir/chunked_hash.py", "cpu_count"): "hashing threads only: the digest does not depend on "
    "them (tests/ir/test_chunked_hash.py)",
    ("codegen/native_hash.py", "cpu_count"): "hashing threads only: the digests do not depend "
    "on them (tests/codegen/test_native_hash.py)",
    ("codegen/native_hash.py", "os.environ"): "PLAIT_NATIVE_HASH: how chunks are hashed, never "
    "the digest (tests/codegen/test_native_hash.py)",
    ("cache/weight_digests.py", "cpu_count"): "hashing threads only: the same digests",
    ("export/guards.py", "is_grad_enabled"): "names the grad-mode guard a loaded artifact "
    "discharges (it runs under no_grad); reads nothing",
    ("export/guards.py", "get_default_dtype"): "names the default-dtype guard a loaded artifact "
    "discharges (its IR spells out every dtype); reads nothing",
    ("api.py", "is_grad_enabled"): "whether to prefetch the weights digest (freezing is "
    "decided, and guarded, in backends.py)",
    ("settings.py", "is_grad_enabled"): _PROTOCOL,
    ("specialization.py", "is_grad_enabled"): "a docstring example: the settings key it prints",
    ("settings.py", "get_default_dtype"): _PROTOCOL,
    ("settings.py", "is_autocast_enabled"): _PROTOCOL,
    ("settings.py", "get_num_threads"): _PROTOCOL,
    ("settings.py", "float32_matmul_precision"): _PROTOCOL,
    ("settings.py", "allow_tf32"): _PROTOCOL,
    ("settings.py", "fp32_precision"): _PROTOCOL,
    ("settings.py", "deterministic_algorithms"): _PROTOCOL,
    ("settings.py", "mkldnn.enabled"): _PROTOCOL,
    ("settings.py", "cudnn."): _PROTOCOL,
    ("settings.py", "flush_denormal"): _PROTOCOL,
    ("frontend/pyvalues.py", "os.environ"): "guard: the environment's contents, where the "
    "program reads them (os.environ, os.getenv): the Python values guard's root",
    ("frontend/process_reads.py", "os.environ"): "its docstring: the root "
    "frontend/pyvalues.py guards",
    ("frontend/library_reads.py", "fastpath_enabled"): "guard: the Python values guard's "
    "root on torch.backends.mha's global, wherever a frame of get_fastpath_enabled runs in a "
    "capture (the program's, nn.MultiheadAttention's, nn.TransformerEncoderLayer's)",
    ("frontend/nested_fast_path.py", "fastpath_enabled"): "its docstring and refusal message "
    "name torch.backends.mha.set_fastpath_enabled; the flag is read by the attention modules "
    "(guard: frontend/library_reads.py's root)",
    ("frontend/library_reads.py", "_get_warnAlways"): "guard: the Python values guard's getter "
    "check, where a frame of torch.is_warn_always_enabled runs in a capture",
    ("frontend/library_reads.py", "cudnn."): "its docstring: a backends module's property "
    "the program names is the Python values guard's getter check",
    ("frontend/mutable_library_values.py", "_get_cudnn"): _READER,
    ("frontend/mutable_library_values.py", "_get_mkldnn"): _READER,
    ("frontend/mutable_library_values.py", "_get_deterministic"): _READER,
    ("frontend/mutable_library_values.py", "is_anomaly_enabled"): _READER,
    ("frontend/mutable_library_values.py", "_get_warnAlways"): _READER,
    ("logs.py", "os.environ"): "PLAIT_LOGS: which log records are shown, never what compiles",
    ("codegen/packed.py", "_get_mkldnn"): "not a setting: mkldnn._get_mkldnn_serialized_md, a "
    "prepacked weight's descriptor (entries are keyed by PyTorch's build and the CPU)",
}


def _reads() -> set[tuple[str, str]]:
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(SKIP):
            continue
        for match in PATTERN.finditer(path.read_text()):
            found.add((rel, match.group(0)))
    return found


def test_every_ambient_read_is_covered() -> None:
    unclassified = sorted(_reads() - set(COVERED))
    assert not unclassified, f"ambient reads with no guard or key part: {unclassified}"


def test_the_table_has_no_stale_rows() -> None:
    assert not set(COVERED) - _reads()


def test_process_settings_are_key_parts() -> None:
    fixed = process_settings()
    assert set(fixed) == {
        "cpu",
        "gpu_capability",
        "mkldnn_available",
        "torch_build_sha256",
        "onednn_env",
    }
    assert fixed["mkldnn_available"] == torch.backends.mkldnn.is_available()
    assert fixed["gpu_capability"] is None or torch.cuda.is_available()


def test_onednn_environment_is_a_key_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """ONEDNN_MAX_CPU_ISA narrows the kernels oneDNN may pick (and the fused calls it accepts)
    for the whole process: a process with another value must not load this one's artifacts."""
    assert process_settings()["onednn_env"] == onednn_environment()  # NOTE: read once
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    before = onednn_environment()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    after = onednn_environment()
    assert ["ONEDNN_MAX_CPU_ISA", "AVX2"] in after and after != before


def test_call_settings_read_the_live_values() -> None:
    now = call_settings()
    assert now["torch.get_num_threads()"] == torch.get_num_threads()
    assert now["torch.backends.mkldnn.enabled"] == torch.backends.mkldnn.enabled
    assert now["torch.are_deterministic_algorithms_enabled()"] == (
        torch.are_deterministic_algorithms_enabled()
    )


def test_torch_build_memo_gives_the_hash_of_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk memo of torch.__config__.show()'s hash: the same value as asking PyTorch; a memo
    for another library file, or garbage, is not believed."""
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    truth = ambient._torch_build_now()
    ambient._torch_build.cache_clear()
    try:
        assert ambient._torch_build() == truth  # NOTE: computed, then remembered
        memo = tmp_path / "torch_build.json"
        saved = json.loads(memo.read_text())
        assert saved["value"]["sha256"] == truth
        memo.write_text(json.dumps({"identity": ["other"], "value": {"sha256": "0" * 64}}))
        ambient._torch_build.cache_clear()
        assert ambient._torch_build() == truth
        memo.write_text("{garbage")
        ambient._torch_build.cache_clear()
        assert ambient._torch_build() == truth
    finally:
        ambient._torch_build.cache_clear()
