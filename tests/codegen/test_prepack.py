"""The prepacking pool a saved plan's rebuild uses: every job runs (``close(finish=True)`` lets
the queue run out), a job's failure is raised where its weight is first used, and ``close``
ends the threads."""

from __future__ import annotations

import threading

import pytest
import torch

from plait.codegen.extern import PreparedWeight
from plait.codegen.onednn import Prepacker
from tests.util import assert_bitwise


@pytest.mark.parametrize("threads", [1, 2])
def test_every_job_runs(threads: int) -> None:
    prepack = Prepacker(threads)
    done: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            done.append(i)

    futures = [prepack(lambda i=i: job(i)) for i in range(20)]
    prepack.close(finish=True)
    for f in futures:
        f.result()
    assert sorted(done) == list(range(20))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_weight_waits_for_its_prepacking_and_raises_its_failure(threads: int) -> None:
    prepack = Prepacker(threads)
    try:
        w = torch.randn(4, 3)
        good = PreparedWeight(lambda t: t * 2)
        good.pending = prepack(lambda: good.prepare(w))
        bad = PreparedWeight(lambda t: t * 2)
        bad.pending = prepack(lambda: 1 / 0)
        assert_bitwise(good(w), w * 2)
        with pytest.raises(ZeroDivisionError):
            bad(w)
        # NOTE: once waited for, a weight converts on its own (the failure is not sticky)
        assert_bitwise(bad(w), w * 2)
    finally:
        prepack.close()
    prepack.close()  # NOTE: idempotent
