"""Each part of the cache key: perturb it and get a miss naming the part; perturb nothing and get a
hit. Weights that stay graph inputs never enter the key; frozen weights do."""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import plait
import plait.cache.lookup as lookup
import plait.guards.ambient as ambient
from plait.cache import LocalStore
from tests.cache.helpers import convnet, run, sample, status


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _warm(cache: Path, **kwargs: Any) -> Any:
    out, spec = run(convnet(), sample(), cache, **kwargs)
    assert status(spec) == "miss"
    return out, spec


def test_same_program_hits_with_the_same_answer(cache: Path) -> None:
    cold, first = _warm(cache)
    warm, spec = run(convnet(), sample(), cache)
    assert status(spec) == "hit"
    assert torch.equal(cold, warm)
    assert spec.manifest.deterministic() == first.manifest.deterministic()
    assert spec.manifest.cache_key == first.manifest.cache_key
    parts = spec.manifest.cache_key["parts"]
    assert {"source", "guards", "target", "options", "toolchain", "ambient", "weights"} <= set(
        parts
    )
    assert "timings" not in str(parts) and str(cache) not in str(parts)  # never a path


def _miss(cache: Path, part: str, model: Any = None, x: Any = None, **kwargs: Any) -> Any:
    _, spec = run(model or convnet(), sample() if x is None else x, cache, **kwargs)
    assert status(spec) == "miss", spec.manifest.cache
    differs = spec.manifest.cache["differs"]
    assert any(d == part or d.startswith(part + ".") or d.startswith(part + "[") for d in differs)
    assert part in spec.manifest.cache["miss"]
    return differs


def test_source_part(cache: Path) -> None:
    _warm(cache, backend="eager")

    def other(x: torch.Tensor) -> torch.Tensor:
        return x.sigmoid()

    def first(x: torch.Tensor) -> torch.Tensor:
        return x.relu()

    run(first, torch.randn(4), cache, backend="eager")
    _miss(cache, "source", other, torch.randn(4), backend="eager")


def test_guards_part(cache: Path) -> None:
    """A guard that changes nothing in the graph (an argument the program compares but does not
    compute with): the same source, another guard."""

    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return x * 2

    for n, expected in ((1, "miss"), (1, "hit"), (2, "miss")):
        compiled = plait.compile(
            f, backend="eager", options={"warm_start": "fingerprint", "cache": str(cache)}
        )
        compiled(torch.randn(3), n)
        assert status(compiled.specializations[0]) == expected
    (differs,) = compiled.specializations[0].manifest.cache["differs"]
    assert differs.startswith("guards[")
    assert "n == 1" in compiled.specializations[0].manifest.cache["miss"]


def test_target_part(cache: Path) -> None:
    _warm(cache, backend="stax")
    _miss(cache, "target", backend="eager", options={"passes": "inference"})


def test_options_part(cache: Path) -> None:
    _warm(cache)
    assert "options.passes" in _miss(cache, "options", options={"passes": "canonicalize,dce"})
    assert "options.stax" in _miss(cache, "options", options={"stax": {"inplace": False}})


def test_toolchain_part(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _warm(cache)
    real = lookup.toolchain_parts
    monkeypatch.setattr(
        lookup, "toolchain_parts", lambda b, **kw: {**real(b, **kw), "torch": "9.9"}
    )
    assert _miss(cache, "toolchain") == ["toolchain.torch"]


def test_tvm_kernels_key_their_version_and_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """TVM kernels depend on TVM's version and the LLVM target it compiles for: both are key
    parts where the request's kernels are TVM's (backend="tvm" becomes these options)."""
    from plait.codegen import tvm_build

    record = {"tvm": "0.1", "target": {"kind": "llvm", "mcpu": "a"}}
    monkeypatch.setattr(tvm_build, "toolchain_record", lambda: dict(record))
    assert "tvm" not in lookup.toolchain_parts("stax")
    assert lookup.toolchain_parts("stax", kernels="tvm")["tvm"] == record
    req = types.SimpleNamespace(options={"stax": {"kernels": "tvm"}})
    assert lookup._kernels(req) == "tvm"
    before = lookup.toolchain_parts("stax", kernels=lookup._kernels(req))
    record["target"] = {"kind": "llvm", "mcpu": "b"}
    assert lookup.toolchain_parts("stax", kernels="tvm") != before


def test_triton_keys_the_programs_whose_kernels_may_be_tritons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton's version is a key part where the kernels may be Triton's (an input off the CPU,
    no tensor input, or the Triton target named on CPU tensors), and not for C++ kernels."""
    from plait.runtime import program

    monkeypatch.setattr(program, "triton_toolchain", lambda: {"triton": "9.9", "cuda": None})
    default = types.SimpleNamespace(options={})
    named = types.SimpleNamespace(options={"stax": {"target": "triton"}})
    assert not lookup._may_run_triton(default, ["cpu"])
    assert lookup._may_run_triton(default, ["cuda:0"])
    assert lookup._may_run_triton(default, [])
    assert lookup._may_run_triton(named, ["cpu"])
    assert "triton" not in lookup.toolchain_parts("stax", triton=False)
    assert lookup.toolchain_parts("stax")["triton"] == {"triton": "9.9", "cuda": None}


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_ambient_call_setting_part(cache: Path, threads: None) -> None:
    _warm(cache)
    torch.set_num_threads(2 if torch.get_num_threads() == 1 else 1)
    assert _miss(cache, "ambient") == ["ambient.torch.get_num_threads()"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("cpu", {"machine": "x86_64", "model": "other", "flags_sha256": "0" * 64}),
        ("gpu_capability", [[9, 0]]),
        ("torch_build_sha256", "1" * 64),
    ],
)
def test_ambient_process_setting_part(
    cache: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: Any
) -> None:
    """CPU features and GPU compute capability are fixed per process: key parts, not guards."""
    _warm(cache)
    fixed = dict(ambient.process_settings())
    monkeypatch.setattr(
        "plait.backends.process_settings", lambda cuda=False: {**fixed, name: value}
    )
    assert _miss(cache, "ambient") == [f"ambient.{name}"]


def test_frozen_weights_part(cache: Path) -> None:
    _warm(cache)
    model = convnet()
    with torch.no_grad():
        model.conv.weight.mul_(2)
    assert _miss(cache, "weights", model=model) == ["weights"]


def test_non_frozen_weights_are_not_in_the_key(cache: Path) -> None:
    """freeze=False: parameters are graph inputs; other values hit the same entry and give the
    answer of the new values."""
    _, first = _warm(cache, options={"freeze": False})
    assert first.manifest.cache_key["parts"]["weights"] == "none"
    model = convnet(seed=7)
    out, spec = run(model, sample(), cache, options={"freeze": False})
    assert status(spec) == "hit"
    with torch.no_grad():
        torch.testing.assert_close(out, model(sample()))


def test_hit_after_recompile_in_the_same_process(cache: Path) -> None:
    model = convnet()
    compiled = plait.compile(model, options={"warm_start": "fingerprint", "cache": str(cache)})
    with torch.no_grad():
        compiled(sample())
        compiled(torch.randn(3, 3, 8, 8))
        again = plait.compile(model, options={"warm_start": "fingerprint", "cache": str(cache)})
        again(torch.randn(3, 3, 8, 8))
    assert [status(s) for s in compiled.specializations] == ["miss", "miss"]
    assert status(again.specializations[0]) == "hit"
    kinds = [e.meta.get("kind", "artifact") for e in LocalStore(cache).list()]
    # NOTE: the second size made the batch symbolic (automatic dynamic), remembered in a record
    # and marked under its class
    assert sorted(kinds) == [
        "artifact",
        "artifact",
        "automatic dynamic dims",
        "automatic dynamic mark",
        "first-run hint",
        "snapshot",
        "snapshot",
    ]


def test_process_specific_guard_is_never_cached(cache: Path) -> None:
    class Config:
        __slots__ = ()  # NOTE: no attribute dict: a leaf guarded by identity, never opened
        scale = 3.0

    cfg = Config()

    def f(x: torch.Tensor, c: Any) -> torch.Tensor:
        return x * 2

    compiled = plait.compile(
        f, backend="eager", options={"warm_start": "fingerprint", "cache": str(cache)}
    )
    compiled(torch.randn(3), cfg)
    spec = compiled.specializations[0]
    assert status(spec) == "not cached"
    assert "specific to this process" in spec.manifest.cache["events"][0]
    assert LocalStore(cache).stat().entries == 0


def test_format_part(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _warm(cache)
    monkeypatch.setattr(lookup, "FORMAT", "plait.specialization/999")
    assert _miss(cache, "format") == ["format"]


def test_key_digest_is_canonical_json() -> None:
    from plait.cache import CacheKey

    a = CacheKey({"b": [1, {"y": 2, "x": 1}], "a": "s"})
    b = CacheKey({"a": "s", "b": [1, {"x": 1, "y": 2}]})
    assert a.digest == b.digest
    assert a.digest == "fc76477f3faaa4e6774397befd97e4b2a6af6aaff6aeea3c72487efaac3486d4"


def test_weights_digest_never_mistakes_a_new_tensor_for_a_freed_one() -> None:
    """The digest memo is keyed by identity, version and storage; a freed tensor's id and
    address can be reused by a new one with other values."""
    from plait.ir import weights_hash

    for i in range(50):
        t = torch.full((64,), float(i))
        assert lookup.weights_digest({"w": t}) == weights_hash({"w": t})
        del t


def test_training_programs_compile_and_say_they_are_not_cached(cache: Path) -> None:
    from plait.errors import CaptureFallbackWarning

    model = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    for _ in range(2):
        compiled = plait.compile(
            model, backend="stax", options={"warm_start": "fingerprint", "cache": str(cache)}
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", CaptureFallbackWarning)
            out = compiled(x)
        spec = compiled.specializations[0]
        assert status(spec) == "not cached"
        assert "training program" in spec.manifest.cache["events"][0]
        out.sum().backward()
        assert model.weight.grad is not None
        torch.testing.assert_close(out, model(x))
