"""Prints the mutant suite's kill rate in pytest's terminal summary (works under xdist: the
verdict travels in each test report's user_properties), and shares the cores among xdist workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _workers_share_the_cores() -> Iterator[None]:
    # NOTE: under pytest-xdist each worker would start as many torch threads as there are cores;
    # OpenMP threads spin while they wait, so two workers on two cores ran a ResNet-18 gate call
    # ~15x slower. Each worker gets its share of the cores (the numerics must not depend on it).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    before = torch.get_num_threads()
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield
    torch.set_num_threads(before)


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
