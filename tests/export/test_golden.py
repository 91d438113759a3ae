"""Golden artifacts of every released format version (tests/export/golden, written by
make_golden.py) load and verify in this plait: an artifact written once keeps loading."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import plait
from plait.errors import ExportWarning
from plait.export.archive import SUPPORTED_VERSIONS

GOLDEN = Path(__file__).parent / "golden"
EXPECTED = {
    name: entry
    for listing in sorted(GOLDEN.glob("expected-v*.json"))
    for name, entry in json.loads(listing.read_text()).items()
}


def test_every_supported_version_has_golden_artifacts() -> None:
    versions = {entry["format_version"] for entry in EXPECTED.values()}
    assert versions == set(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_golden_artifact_loads_and_verifies(name: str) -> None:
    path, expected = GOLDEN / name, EXPECTED[name]
    assert path.stat().st_size == expected["bytes"]
    with warnings.catch_warnings():
        # NOTE: the dynamic golden runs on the interpreter, which its load says
        warnings.simplefilter("ignore", ExportWarning)
        loaded = plait.load(path)
        result = plait.verify(path)
    assert loaded.format_version == expected["format_version"]
    assert loaded.semantic_hash == expected["semantic_hash"]
    assert loaded.digest == expected["digest"]
    assert result.ok, str(result)
    args, kwargs = loaded.references.call(0)
    assert loaded(*args, **kwargs) is not None
