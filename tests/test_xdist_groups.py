"""Under ``pytest -n 2 --dist loadgroup`` (``make pytest``), a test's ``xdist_group`` mark reaches
the scheduler: its node id carries ``@group``, and the tests of one group run on one worker.

The heavy module fixtures (the batched kernel compiles of tests/codegen/test_opdb.py and
test_special_values.py, the model groups) are built once per group only while this holds.
pytest 9.2 keeps node ids in a structured field that pytest-xdist 3.8 does not update: every
group mark was then dropped without a word and each fixture built on both workers (constraints.txt
pins the pair that works).
"""

import pytest


@pytest.mark.xdist_group("xdist-group-mark")
def test_group_mark_reaches_the_scheduler(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist with --dist loadgroup (make pytest)")
    assert request.node.nodeid.endswith("@xdist-group-mark"), (
        f"{request.node.nodeid}: the xdist_group mark did not reach the scheduler "
        "(pytest and pytest-xdist versions that do not work together: constraints.txt)"
    )
