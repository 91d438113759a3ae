from collections.abc import Iterator
from pathlib import Path

import pytest

from plait.codegen import timed_choices
from tests.codegen.stax_helpers import stax_batch, stax_cache

__all__ = ["fresh_timed_choices", "stax_batch", "stax_cache"]


@pytest.fixture(autouse=True)
def fresh_timed_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test times (or fakes timings) afresh: no library decision remembered from another
    test (``plait.codegen.timed_choices``)."""
    fresh = timed_choices.TimedChoices(tmp_path / "timed")
    monkeypatch.setattr(timed_choices, "store", lambda: fresh)
    yield
