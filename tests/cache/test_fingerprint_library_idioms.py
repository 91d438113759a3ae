"""Fingerprints of two idioms of library code (transformers' models and configs hold both):
a dataclass with a ``ClassVar`` (a pseudo-field whose ``kw_only`` stays ``MISSING``) and a method
whose ``__module__``/``__qualname__`` name another function (``@wraps(Mixin.method)``, or a copy
of a function made to carry its own docstring). Each describes the class, in JSON, instead of
refusing it as redefined (which left an automatic dynamic record unsaved: a new process
compiled static again) or failing at the call (``_MISSING_TYPE is not JSON serializable``)."""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import ClassVar

import pytest

from plait.cache.key import canonical_json
from plait.snapshots import fingerprint


@dataclasses.dataclass
class _Config:
    plan: ClassVar[dict[str, str]] = {}
    width: int = 8


class _Mixin:
    def push(self, n: int) -> int:
        return n + 1


class _Model(_Mixin):
    @functools.wraps(_Mixin.push)
    def push(self, n: int) -> int:
        return n + 2


def _copy(f: types.FunctionType) -> types.FunctionType:
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    return functools.update_wrapper(g, f)


class _Copied(_Mixin):
    pass


_Copied.push = _copy(_Mixin.push)  # type: ignore[method-assign]
_Model.push = _copy(_Model.push)  # type: ignore[method-assign]


def test_a_dataclass_with_a_class_variable_has_a_json_fingerprint() -> None:
    canonical_json(fingerprint.fingerprint(_Config, "config"))
    canonical_json(fingerprint.fingerprint(_Config(), "config"))


@pytest.mark.parametrize("cls", [_Model, _Copied])
def test_a_method_named_after_another_is_found_where_its_code_is(cls: type) -> None:
    canonical_json(fingerprint.fingerprint(cls, "cls"))


def test_a_redefined_function_is_still_refused() -> None:
    def push(self: object, n: int) -> int:
        return n

    push.__qualname__ = "_Mixin.push"
    push.__module__ = __name__
    with pytest.raises(fingerprint.Unpinnable):
        fingerprint.fingerprint(push, "push")
