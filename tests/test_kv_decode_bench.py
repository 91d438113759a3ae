"""The decoding benchmark (benchmarks/kv_decode.py): a quick run of eager and plait on tiny
Hugging Face configs reports every system with parity from the contract and plait's
specializations; unknown names are usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import kv_decode


@pytest.mark.slow
def test_quick_run_reports_parity_and_specializations(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    argv = ["--quick", "--systems", "eager,plait", "--steps", "6", "--prompt", "5"]
    assert kv_decode.main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    for name in kv_decode.MODELS:
        systems = results["models"][name]["systems"]
        assert set(systems) == {"eager", "plait"}
        assert all(r["parity"] for r in systems.values())
        # NOTE: prefill, the first decode call, then one symbolic length for every later call
        assert 1 <= systems["plait"]["specializations"] <= 4
        assert systems["eager"]["decode_vs_eager"] == 1.0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--models", "gpt3"], "unknown model gpt3"),
        (["--systems", "eager,ort"], "unknown system ort"),
        (["--systems", "plait"], "must include eager"),
    ],
)
def test_bad_names_are_usage_errors(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        kv_decode.main(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
