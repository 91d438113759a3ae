"""The prepacking pool a saved plan's rebuild uses: every job runs before ``wait`` returns, the
first failure is raised there, and ``close`` ends the threads."""

from __future__ import annotations

import threading

import pytest

from plait.codegen.onednn import Prepacker


@pytest.mark.parametrize("threads", [1, 2])
def test_every_job_runs_before_wait_returns(threads: int) -> None:
    prepack = Prepacker(threads)
    done: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            done.append(i)

    try:
        for i in range(20):
            prepack(lambda i=i: job(i))
        prepack.wait()
        assert sorted(done) == list(range(20))
    finally:
        prepack.close()


def test_a_failure_is_raised_by_wait() -> None:
    prepack = Prepacker(2)
    try:
        prepack(lambda: None)
        prepack(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            prepack.wait()
    finally:
        prepack.close()
    prepack.close()  # NOTE: idempotent
