"""Input containers reached twice in one call, and input containers the program changes.

A list or an opened object met twice among a call's arguments (``f(cache, cache)``, an object
holding a list also passed on its own) is one container in the rebuilt call too: a change made
through one name shows through the other, as in eager, and a call whose arguments share nothing
is another specialization. An object plait passes as it is (slots, a set, a list subclass, a
cycle) that the program changes in place is refused: capture would change the caller's once,
compiled calls never again. A dict of any dict class (``defaultdict``, ``OrderedDict``) is
written back like a plain one; a dataclass the program changes is refused. Compared with eager
on copies of the same state, call after call.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.capture.helpers import assert_same
from tests.util import assert_bitwise


class Box:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def _fields(x: Any) -> Any:
    """What an object of this file's types is compared by (None: any other value)."""
    if isinstance(x, Box):
        return vars(x)
    if isinstance(x, Record):
        return [x.t, x.n]
    if isinstance(x, Slotted):
        return [x.n, x.seen]
    return None


def _same(a: Any, b: Any, what: str) -> None:
    assert_same(a, b, what, _fields)


def _against_eager(fn: Any, make: Any, calls: int = 4) -> None:
    compiled = plait.compile(fn)
    for i in range(calls):
        torch.manual_seed(i)
        args = make()
        eager_args = copy.deepcopy(args)
        _same(fn(*eager_args), compiled(*args), f"call {i}: result")
        _same(eager_args, args, f"call {i}: arguments after the call")


def test_list_passed_twice_shows_an_append_through_both_names() -> None:
    def fn(a: list, b: list, t: torch.Tensor) -> torch.Tensor:
        a.append(t * 2)
        return torch.stack(b).sum(0) + len(b)

    def make() -> tuple:
        shared = [torch.randn(3)]
        return shared, shared, torch.randn(3)

    _against_eager(fn, make)


def test_object_passed_twice_shows_a_counter_through_both_names() -> None:
    def fn(a: Box, b: Box) -> torch.Tensor:
        a.n = a.n + 1
        a.t = a.t * 2
        return b.t * b.n

    def make() -> tuple:
        shared = Box(n=0, t=torch.randn(3))
        return shared, shared

    _against_eager(fn, make)


def test_list_held_by_an_object_and_passed_on_its_own_is_one_list() -> None:
    def fn(o: Box, items: list, t: torch.Tensor) -> torch.Tensor:
        items.append(t)
        return torch.stack(o.items).sum(0)

    def make() -> tuple:
        items = [torch.randn(3)]
        return Box(items=items), items, torch.randn(3)

    _against_eager(fn, make)


def test_shared_and_separate_lists_are_different_specializations() -> None:
    def fn(a: list, b: list, t: torch.Tensor) -> torch.Tensor:
        a.append(1)
        return t * len(b)

    compiled = plait.compile(fn)
    for i in range(4):
        t = torch.randn(3)
        shared = [0]
        args = (shared, shared, t) if i % 2 == 0 else ([0], [0], t)
        eager_args = copy.deepcopy(args)
        _same(fn(*eager_args), compiled(*args), f"call {i}: result")
        _same(eager_args, args, f"call {i}: arguments after the call")


class Slotted:
    __slots__ = ("n", "seen")

    def __init__(self) -> None:
        self.n = 0
        self.seen: set[int] = set()


class Items(list):
    pass


def _same_object_each_call(fn: Any, args: tuple, calls: int = 4) -> None:
    """The same caller objects on every call (a change capture made once would show)."""
    compiled = plait.compile(fn)
    eager_args = copy.deepcopy(args)
    for i in range(calls):
        t = torch.randn(3)
        _same(fn(*eager_args, t), compiled(*args, t), f"call {i}: result")
        _same(eager_args, args, f"call {i}: arguments after the call")


def test_counter_in_a_slotted_object_is_bumped_on_every_call() -> None:
    def fn(s: Slotted, t: torch.Tensor) -> torch.Tensor:
        s.n += 1
        return t * s.n

    s = Slotted()
    with pytest.warns(CaptureFallbackWarning):
        _same_object_each_call(fn, (s,))
    assert s.n == 4


def test_set_held_by_an_input_object_grows_on_every_call() -> None:
    def fn(o: Box, t: torch.Tensor) -> torch.Tensor:
        o.seen.add(len(o.seen))
        return t + len(o.seen)

    o = Box(seen={0})
    with pytest.warns(CaptureFallbackWarning):
        _same_object_each_call(fn, (o,))
    assert o.seen == {0, 1, 2, 3, 4}


def test_list_subclass_argument_grows_on_every_call() -> None:
    def fn(items: Items, t: torch.Tensor) -> torch.Tensor:
        items.append(1)
        return t * len(items)

    items = Items([1])
    with pytest.warns(CaptureFallbackWarning):
        _same_object_each_call(fn, (items,))
    assert len(items) == 5


def test_changed_object_in_a_cycle_is_refused_under_fullgraph() -> None:
    def fn(o: Box, t: torch.Tensor) -> torch.Tensor:
        o.me.n += 1
        return t * o.n

    o = Box(n=0)
    o.me = o
    with pytest.raises(GraphCaptureError, match="changed"):
        plait.compile(fn, fullgraph=True)(o, torch.randn(3))
    assert o.n == 0


@dataclasses.dataclass
class Record:
    t: torch.Tensor
    n: int = 0


def test_defaultdict_argument_gets_the_entries_the_program_adds() -> None:
    def fn(d: collections.defaultdict, t: torch.Tensor) -> torch.Tensor:
        d["k"].append(t * 2)
        return t * len(d)

    _against_eager(fn, lambda: (collections.defaultdict(list), torch.randn(3)))


def test_ordered_dict_argument_gets_the_key_the_program_writes() -> None:
    def fn(d: collections.OrderedDict, t: torch.Tensor) -> torch.Tensor:
        d["z"] = t * 2
        d.move_to_end("a")
        return t * len(d)

    _against_eager(fn, lambda: (collections.OrderedDict(a=1, b=2), torch.randn(3)))


def test_changed_dataclass_argument_is_refused() -> None:
    def fn(r: Record) -> torch.Tensor:
        r.n += 1
        r.t = r.t * 2
        return r.t + r.n

    r = Record(torch.randn(3))
    with pytest.raises(GraphCaptureError, match="dataclass"):
        plait.compile(fn, fullgraph=True)(r)
    assert r.n == 0
    with pytest.warns(CaptureFallbackWarning):
        _against_eager(fn, lambda: (Record(torch.randn(3)),))


def test_program_raising_after_changing_inputs_leaves_eagers_partial_changes() -> None:
    def fn(o: Box, items: list, t: torch.Tensor) -> torch.Tensor:
        o.n += 1
        items.append(1)
        o.t = t * 2
        if o.n > 2:
            raise ValueError("past the end")
        return t + o.n

    compiled = plait.compile(fn)
    mine = (Box(n=0, t=torch.zeros(3)), [0])
    theirs = copy.deepcopy(mine)
    for i in range(4):
        t = torch.randn(3)
        if i < 2:
            _same(fn(*theirs, t), compiled(*mine, t), f"call {i}: result")
        else:
            with pytest.raises(ValueError, match="past the end"):
                fn(*theirs, t)
            with pytest.warns(CaptureFallbackWarning), pytest.raises(ValueError, match="past"):
                compiled(*mine, t)
        _same(theirs, mine, f"call {i}: arguments after the call")


class Scaled:
    scale = 2

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_class_constant_read_through_an_input_object_is_guarded() -> None:
    def fn(o: Scaled, x: torch.Tensor) -> torch.Tensor:
        return x * o.scale + o.t

    compiled = plait.compile(fn)
    try:
        for scale in (2, 3, 4, 3):
            Scaled.scale = scale
            o, x = Scaled(torch.randn(3)), torch.randn(3)
            assert_bitwise(fn(o, x), compiled(o, x), f"scale {scale}")
    finally:
        Scaled.scale = 2
