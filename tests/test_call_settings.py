"""plait.settings: every setting a call runs under can be read and put back (the artifact
protocol applies the settings of a user's calls when the gate judges their specialization)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plait.guards.ambient import call_settings
from plait.settings import applied_state, call_state, settable

# NOTE: a value other than the default for each setting (bools flipped, tuples of bools flipped)
OTHER: dict[str, Any] = {
    "torch.get_default_dtype()": torch.float64,
    "torch.get_num_threads()": 1 if torch.get_num_threads() != 1 else 2,
    "torch.get_float32_matmul_precision()": "high",
    "torch.backends.mkldnn.matmul.fp32_precision": "bf16",
    "torch.backends.mkldnn.conv.fp32_precision": "bf16",
}


def _other(name: str, value: Any) -> Any:
    if name in OTHER:
        return OTHER[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, tuple) and all(isinstance(v, bool) for v in value):
        return tuple(not v for v in value)
    if name == "torch.autocast":
        return {d: (True, dtype) for d, (_, dtype) in value.items() if d == "cpu"}
    raise AssertionError(f"no other value known for {name} = {value!r}: add one to OTHER")


def test_every_setting_a_call_runs_under_can_be_put_back() -> None:
    assert set(call_settings()) <= set(call_state())
    assert settable(list(call_state())) == []


@pytest.mark.parametrize("name", sorted(call_state()))
def test_each_setting_is_applied_and_restored(name: str) -> None:
    before = call_state()
    wanted = _other(name, before[name])
    with applied_state({name: wanted}):
        now = call_state()[name]
        if name == "torch.autocast":
            assert now["cpu"] == wanted["cpu"]
        else:
            assert now == wanted
    assert call_state() == before


def test_a_setting_with_no_writer_is_refused_before_anything_changes() -> None:
    before = call_state()
    state = {"torch.is_grad_enabled()": False, "made.up": 1}
    with pytest.raises(ValueError, match="no writer"), applied_state(state):
        pass
    assert call_state() == before
