"""Prints the mutant suite's kill rate in pytest's terminal summary (works under xdist: the
verdict travels in each test report's user_properties)."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    verdicts = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            props = dict(getattr(report, "user_properties", []))
            if "mutant_killed" in props:
                verdicts.append(bool(props["mutant_killed"]))
    if verdicts:
        killed = sum(verdicts)
        rate = killed / len(verdicts)
        terminalreporter.write_line(
            f"conformance mutants: killed {killed}/{len(verdicts)} (kill rate {rate:.0%})"
        )
