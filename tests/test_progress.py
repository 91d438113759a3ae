"""plait.progress: plain lines on stderr away from a terminal (first, last and at most one
every few seconds between), nothing when quiet, rich bars when asked for, modes checked."""

from __future__ import annotations

import pytest

from plait.progress import Progress


def test_plain_lines_are_few_and_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress("plain", every=3600.0) as progress:
        assert progress.mode == "plain"
        with progress.task("graphs", total=1000) as advance:
            for i in range(1000):
                advance(note=f"graph {i}")
        progress.log("one more line")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 4, lines  # NOTE: the start, the last unit, the end, the log line
    assert lines[0].endswith("graphs ...") and lines[1].endswith("graphs: graph 999 (1000/1000)")
    assert "graphs: done in" in lines[2] and lines[3].endswith("one more line")


def test_plain_lines_every_step_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("plain", every=0.0)
    assert list(progress.track(["a", "b", "c"], "letters")) == ["a", "b", "c"]
    assert capsys.readouterr().err.count("letters (") == 3


def test_quiet_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("quiet")
    assert list(progress.track(iter(range(5)), "numbers", total=5)) == list(range(5))
    progress.log("hidden")
    assert capsys.readouterr() == ("", "")


def test_auto_is_plain_without_a_terminal() -> None:
    assert Progress("auto").mode == "plain"  # NOTE: pytest captures stderr: no terminal


def test_rich_bars_when_asked() -> None:
    with Progress("rich") as progress:
        assert progress.mode == "rich"
        with progress.task("steps", total=2) as advance:
            advance()
            advance(note="last")


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="progress mode 'bars'"):
        Progress("bars")
