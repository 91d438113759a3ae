"""TVM tests run where Apache TVM is installed (``pip install plait[tvm]``; CI installs it), with
the session's kernel cache, never the user's."""

from __future__ import annotations

import importlib.util

import pytest

from tests.codegen.stax_helpers import stax_cache

__all__ = ["stax_cache"]

if importlib.util.find_spec("tvm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def _session_cache(stax_cache: object) -> None:
    """Kernels go to the session's cache."""
