"""Shared test configuration: hypothesis profiles (CI runs the same examples as developers), one
kernel cache directory for the whole session (never the user's own cache), and Triton's
interpreter on a machine without CUDA."""

import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    # NOTE: Triton reads its interpreter switch when it is imported: a test module collected
    # first that imports Triton (a GPU test's importorskip) left it out of interpreter mode for
    # every Triton test of that process, whose modules set the switch as they are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session", autouse=True)
def plait_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Kernels and artifacts built by tests go to a session directory shared by xdist workers."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = str(root / "plait-cache")
    previous = os.environ.get("PLAIT_CACHE_DIR")
    os.environ["PLAIT_CACHE_DIR"] = path
    yield path
    if previous is None:
        os.environ.pop("PLAIT_CACHE_DIR", None)
    else:
        os.environ["PLAIT_CACHE_DIR"] = previous


@pytest.fixture(params=["native", "python"])
def evaluator(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test that takes ``evaluator`` runs with the native guard evaluator and with the
    guards' Python reads."""
    from plait.api import _Engine

    if request.param == "python":
        monkeypatch.setattr(_Engine, "guard_evaluators", None)
    return str(request.param)
