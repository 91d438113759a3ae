"""Triton is pointed at PyTorch's ``ptxas`` before plait's first Triton compile (as inductor
points it at its first), unless the user chose one or Triton interprets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plait.codegen.triton_load import torch_ptxas


def _torch_dir(tmp_path: Path, executable: bool) -> Path:
    (tmp_path / "bin").mkdir()
    ptxas = tmp_path / "bin" / "ptxas"
    ptxas.write_text("#!/bin/sh\n")
    ptxas.chmod(0o755 if executable else 0o644)
    return tmp_path


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    return monkeypatch


def test_pytorchs_ptxas_is_chosen(tmp_path: Path, compiled: pytest.MonkeyPatch) -> None:
    torch_ptxas(_torch_dir(tmp_path, executable=True))
    assert os.environ["TRITON_PTXAS_PATH"] == str(tmp_path / "bin" / "ptxas")


def test_a_ptxas_that_cannot_run_is_not(tmp_path: Path, compiled: pytest.MonkeyPatch) -> None:
    torch_ptxas(_torch_dir(tmp_path, executable=False))
    assert "TRITON_PTXAS_PATH" not in os.environ


def test_the_users_choice_stays(tmp_path: Path, compiled: pytest.MonkeyPatch) -> None:
    compiled.setenv("TRITON_PTXAS_PATH", "/opt/cuda/bin/ptxas")
    torch_ptxas(_torch_dir(tmp_path, executable=True))
    assert os.environ["TRITON_PTXAS_PATH"] == "/opt/cuda/bin/ptxas"


def test_the_interpreter_needs_none(tmp_path: Path, compiled: pytest.MonkeyPatch) -> None:
    compiled.setenv("TRITON_INTERPRET", "1")
    torch_ptxas(_torch_dir(tmp_path, executable=True))
    assert "TRITON_PTXAS_PATH" not in os.environ
