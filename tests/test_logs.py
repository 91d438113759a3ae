"""Structured logs (plait.logs, ``PLAIT_LOGS``): off by default; on, a recompile names its failed
guard, a cache miss its reason, a fallback the user's line, each pass its rules, each Stax
program what runs its nodes; debug records carry the graphs; unknown channels are refused."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import plait
from plait import logs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def channels_off() -> Iterator[None]:
    """Each test starts with every channel off (and plait's records reaching caplog's handler),
    and leaves the setting as the environment has it."""
    logs.configure("")
    yield
    logs.configure(os.environ.get(logs.ENVIRONMENT, ""))


def _records(caplog: pytest.LogCaptureFixture, channel: str, event: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == f"plait.{channel}" and getattr(r, "event", None) == event
    ]


def _fn(x: torch.Tensor) -> torch.Tensor:
    return x.relu() if x.shape[0] > 2 else x.sigmoid()


def test_parse() -> None:
    assert logs.parse("") == {}
    assert logs.parse(" guards , +cache,") == {"guards": logging.INFO, "cache": logging.DEBUG}
    assert logs.parse("all") == dict.fromkeys(logs.CHANNELS, logging.INFO)
    assert logs.parse("+all,guards")["guards"] == logging.DEBUG  # NOTE: the lower level wins
    with pytest.raises(ValueError, match="unknown channel 'gaurds'"):
        logs.parse("gaurds")
    with pytest.raises(ValueError, match="unknown log channels"):
        logs.configure({"nope": logging.INFO})


def test_off_by_default_even_under_an_info_root_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # NOTE: the application's root logger at DEBUG
    f = plait.compile(_fn, dynamic=False, options={"cache": False})
    f(torch.randn(4, 3))
    f(torch.randn(1, 3))
    assert not [r for r in caplog.records if r.name.startswith("plait")]


def test_a_recompile_logs_its_failed_guard(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plait.guards")
    f = plait.compile(_fn, backend="eager", dynamic=False, options={"cache": False})
    f(torch.randn(4, 3))
    f(torch.randn(1, 3))
    (recompile,) = _records(caplog, "guards", "recompile")
    assert "x.shape[0] > 2: expected True, got False" in recompile.getMessage()
    assert any("x.shape[0] > 2" in failed for failed in recompile.fields["failed"])  # type: ignore[attr-defined]
    made = _records(caplog, "guards", "specialization")
    assert [r.fields["index"] for r in made] == [0, 1]  # type: ignore[attr-defined]
    assert made[0].fields["reason"] is None  # type: ignore[attr-defined]
    assert "first call" in made[0].getMessage() and "recompiled" in made[1].getMessage()


def test_a_cache_miss_logs_its_reason_and_a_hit_its_key(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger="plait.cache")
    for _ in range(2):
        f = plait.compile(lambda x: x * 3, options={"cache": str(tmp_path)})
        f(torch.randn(5))
    (miss,) = _records(caplog, "cache", "miss")
    (hit,) = _records(caplog, "cache", "hit")
    assert "an empty cache" in miss.getMessage()
    assert miss.fields["miss"] in miss.getMessage()  # type: ignore[attr-defined]
    assert hit.fields["key"] == miss.fields["key"]  # type: ignore[attr-defined]
    caplog.clear()
    g = plait.compile(lambda x: x * 3, options={"cache": str(tmp_path)})
    g(torch.randn(6))  # NOTE: another size: the nearest entry differs in its guards
    (miss,) = _records(caplog, "cache", "miss")
    assert "guards" in miss.getMessage()


def _branchy(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # the line the fallback names
        return x * 2
    return x


def test_a_fallback_logs_the_users_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plait.capture")
    f = plait.compile(_branchy, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f(torch.ones(3))
    (fallback,) = _records(caplog, "capture", "fallback")
    line = _branchy.__code__.co_firstlineno + 1
    assert f"{__file__}:{line}" in fallback.getMessage()
    assert fallback.fields["reason"].startswith(f"{__file__}:{line}")  # type: ignore[attr-defined]


def test_passes_and_codegen(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plait.passes")
    caplog.set_level(logging.INFO, logger="plait.codegen")
    caplog.set_level(logging.INFO, logger="plait.capture")
    f = plait.compile(lambda x: (x.relu() * 1 + 2).sum(0), options={"cache": False})
    with torch.no_grad():
        f(torch.randn(4, 3))
    manifest = f.specializations[0].manifest
    passes = _records(caplog, "passes", "pass")
    assert [r.fields["name"] for r in passes] == [p["name"] for p in manifest.passes]  # type: ignore[attr-defined]
    simplify = next(r for r in passes if r.fields["name"] == "simplify")  # type: ignore[attr-defined]
    assert simplify.fields["changed"] and "simplify." in simplify.getMessage()  # type: ignore[attr-defined]
    (program,) = _records(caplog, "codegen", "program")
    assert program.fields["counts"] == manifest.executor["evidence"]["counts"]  # type: ignore[attr-defined]
    (graph,) = _records(caplog, "capture", "graph")
    assert graph.fields["semantic_hash"] == manifest.source_hash  # type: ignore[attr-defined]
    # NOTE: records name the code that logged them, not plait.logs
    assert {r.module for r in caplog.records} >= {"manager", "backends", "frontend"}


def test_debug_records_carry_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("+passes,guards")
    f = plait.compile(lambda x: x * 1 + 0, options={"cache": False})
    with torch.no_grad():
        f(torch.randn(3))
    err = capsys.readouterr().err
    assert "D " in err and "[plait.passes] after simplify:\ngraph(" in err
    assert "I " in err and "[plait.guards]" in err and "(first call)" in err
    assert "inputs: (x: tensor)" not in err  # NOTE: guards at INFO: not their debug list
    logs.configure("")
    f = plait.compile(lambda x: x * 1 + 0, backend="eager", options={"cache": False})
    f(torch.randn(3))
    assert capsys.readouterr().err == ""


def test_the_environment_setting(tmp_path: Path) -> None:
    code = (
        "import torch, plait\n"
        "f = plait.compile(lambda x: x + 1, backend='eager', options={'cache': False})\n"
        "f(torch.randn(2))\n"
    )
    env = dict(os.environ, PLAIT_LOGS="guards", PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
    proc = run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "[plait.guards] <lambda>: specialization 0 (first call)" in proc.stderr
    env["PLAIT_LOGS"] = "guards,typo"
    proc = run([sys.executable, "-c", "import plait.logs"], env=env, capture_output=True,
               text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and "unknown channel 'typo'" in proc.stderr
