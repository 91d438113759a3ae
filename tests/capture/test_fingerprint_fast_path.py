"""The fingerprint's shortcut for exact builtin values (and tuples of them) gives what the
general rules give: a front key does not depend on which path described a value."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.snapshots import fingerprint as fp


class Color(enum.Enum):
    RED = 1


class MyInt(int):
    pass


def _general(value: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(fp, "_EXACT_PLAIN", {})
        return fp._fp(value, "x", {}, 0)


plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.complex_numbers(),
    st.text(max_size=5),
    st.binary(max_size=5),
)


@given(st.one_of(plain, st.tuples(plain, plain), st.lists(plain, max_size=3).map(tuple)))
def test_shortcut_agrees_with_the_general_rules(value: Any) -> None:
    with pytest.MonkeyPatch.context() as m:
        assert fp._fp(value, "x", {}, 0) == _general(value, m)


@pytest.mark.parametrize("value", [Color.RED, MyInt(3), (Color.RED, 1), (MyInt(2),), ((1, 2), 3)])
def test_values_the_shortcut_leaves_alone_are_described_as_before(value: Any) -> None:
    with pytest.MonkeyPatch.context() as m:
        general = _general(value, m)
    assert fp._fp(value, "x", {}, 0) == general
