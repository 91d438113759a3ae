"""Failing-first: every deliberately wrong candidate must be caught, at the right place.

The kill rate is printed in pytest's terminal summary (see conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import plait.conformance
from tests.conformance.mutants import MUTANTS, REQUIRED, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed(mutant: Mutant, record_property: Callable[[str, object], None]) -> None:
    setup = mutant.build()
    report = plait.conformance.check(
        setup.reference, setup.candidate, setup.inputs, **setup.options
    )
    killed = report.caught(mutant.where, mutant.check)
    record_property("mutant_killed", killed)
    assert not report.ok, f"mutant {mutant.name} survived:\n{report}"
    assert killed, (
        f"mutant {mutant.name} caught, but not at {mutant.where!r}/{mutant.check}:\n{report}"
    )


def test_catalogue_covers_every_required_miscompile() -> None:
    covered = {m.covers for m in MUTANTS}
    missing = [item for item in REQUIRED if item not in covered]
    assert not missing, f"no mutant for: {missing}"
    assert len(MUTANTS) >= 15
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
