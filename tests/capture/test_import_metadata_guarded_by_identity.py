"""A program that reads its whole module namespace (``globals()``, ``eval``, ``__import__``)
has its module's import metadata (``__loader__``, ``__spec__``) guarded by identity, not walked
by content: a loader (pytest's assertion-rewriting hook, an editable install's finder, any custom
loader) holds an object graph of the import system's that changes as the process runs. Changing
what the loader holds recompiles nothing; rebinding the loader, changing a global the program
reads, defining a global it looks up, or changing a builtin that ``eval``'d code reads does
recompile, and each call equals eager on fresh random inputs. An import-system object (a loader,
a finder) reached inside a config object is compared by identity too, while the config's own
fields stay guarded. A warm start rebuilds these roots as capture made them."""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.util
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import plait
from plait.frontend.pyreads import PyReads
from plait.frontend.pyvalues import keyed, saved_form
from plait.frontend.saved_roots import resolve
from tests.util import contract_tol

_SOURCE = """
SCALE = 2.0

def through_import(x):
    return x * SCALE + __import__("operator").index(3)

def through_globals(x):
    return x * globals()["SCALE"]

def through_eval(x):
    return eval("x * SCALE + PLAIT_NSGUARD_OFFSET")

def through_lookup(x):
    return x * globals().get("LATE", 1.5)
"""
_NAMES = itertools.count()


class HoldingLoader:
    """A custom loader (duck-typed, no importlib base class) whose state grows as the process
    runs, as pytest's hook collects items: ``held`` reaches a few thousand objects."""

    def __init__(self) -> None:
        self.loaded = 0
        self.held = [types.SimpleNamespace(item=i, marks=[i, str(i)]) for i in range(2000)]

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        self.loaded += 1
        exec(compile(_SOURCE, f"<{module.__name__}>", "exec"), vars(module))

    def grow(self) -> None:
        self.loaded += 1
        self.held.append(types.SimpleNamespace(item=len(self.held), marks=[]))
        self.held[0].marks.append("seen")


class HoldingFinder(importlib.abc.MetaPathFinder):
    """An import hook (a finder of importlib's kind) holding state of its own."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        self.seen.append(fullname)
        return None


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A module loaded through :class:`HoldingLoader` (its ``__loader__`` and ``__spec__``)."""
    name = f"plait_nsguard_probe_{next(_NAMES)}"
    loader = HoldingLoader()
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    monkeypatch.setattr(builtins, "PLAIT_NSGUARD_OFFSET", 1.0, raising=False)
    loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


def _same_as_eager(compiled: Any, eager: Callable[..., Any], seed: int) -> None:
    torch.manual_seed(seed)
    x = torch.randn(4, 6)
    with torch.no_grad():
        got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))


def _calls(compiled: Any, eager: Callable[..., Any], seeds: range, specializations: int) -> None:
    for seed in seeds:
        _same_as_eager(compiled, eager, seed)
    assert len(compiled.specializations) == specializations, compiled.recompile_reasons
    assert all(s.fallback_reason is None for s in compiled.specializations)


PROGRAMS = ("through_import", "through_globals", "through_eval")


@pytest.mark.parametrize("program", PROGRAMS)
def test_what_the_loader_holds_changing_recompiles_nothing(
    evaluator: str, probe: types.ModuleType, program: str
) -> None:
    eager = getattr(probe, program)
    compiled = plait.compile(eager, options={"cache": False})
    _calls(compiled, eager, range(1, 3), 1)
    probe.__loader__.grow()
    _calls(compiled, eager, range(3, 5), 1)


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_loader_rebound_recompiles(
    evaluator: str, probe: types.ModuleType, program: str
) -> None:
    eager = getattr(probe, program)
    compiled = plait.compile(eager, options={"cache": False})
    _calls(compiled, eager, range(1, 3), 1)
    probe.__loader__ = HoldingLoader()
    _calls(compiled, eager, range(3, 5), 2)
    assert "__loader__" in compiled.recompile_reasons[-1]


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_global_the_namespace_read_covers_recompiles(
    evaluator: str, probe: types.ModuleType, program: str
) -> None:
    eager = getattr(probe, program)
    compiled = plait.compile(eager, options={"cache": False})
    _calls(compiled, eager, range(1, 3), 1)
    probe.SCALE = -3.5
    _calls(compiled, eager, range(3, 5), 2)
    assert "SCALE" in compiled.recompile_reasons[-1]


def test_a_builtin_read_by_eval_recompiles(
    evaluator: str, probe: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``eval``'d code finds builtins through the namespace's ``__builtins__``: each of them
    stays guarded by value, as a builtin the program names is."""
    eager = probe.through_eval
    compiled = plait.compile(eager, options={"cache": False})
    _calls(compiled, eager, range(1, 3), 1)
    monkeypatch.setattr(builtins, "PLAIT_NSGUARD_OFFSET", 7.25)
    _calls(compiled, eager, range(3, 5), 2)
    assert "PLAIT_NSGUARD_OFFSET" in compiled.recompile_reasons[-1]


def test_a_global_defined_after_capture_recompiles(evaluator: str, probe: types.ModuleType) -> None:
    """A namespace read whole has the names it holds guarded: one it lacked may be looked up."""
    eager = probe.through_lookup
    compiled = plait.compile(eager, options={"cache": False})
    _calls(compiled, eager, range(1, 3), 1)
    probe.LATE = 4.0
    _calls(compiled, eager, range(3, 5), 2)
    assert "names of" in compiled.recompile_reasons[-1]


CONFIG = types.SimpleNamespace(scale=2.0, finder=HoldingFinder())


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * CONFIG.scale


def test_a_finder_inside_a_config_is_compared_by_identity(evaluator: str) -> None:
    CONFIG.scale, CONFIG.finder = 2.0, HoldingFinder()
    compiled = plait.compile(_scaled, options={"cache": False})
    _calls(compiled, _scaled, range(1, 3), 1)
    CONFIG.finder.find_spec("anything", None)  # NOTE: its state changes, not the binding
    _calls(compiled, _scaled, range(3, 5), 1)
    CONFIG.scale = 0.75
    _calls(compiled, _scaled, range(5, 7), 2)
    assert "scale" in compiled.recompile_reasons[-1]


def test_a_warm_start_rebuilds_the_namespace_roots(probe: types.ModuleType) -> None:
    """The saved form of a namespace read whole finds each root again, compared alike: the
    import metadata and ``__builtins__`` by identity, the names held, the builtins' entries."""
    with PyReads(program=probe.through_eval) as reads:
        probe.through_eval(torch.ones(2))
    roots = reads.finish()
    again = [resolve(d, None) for d in saved_form(roots)]
    assert [r.identity for r in again] == [r.identity for r in roots]
    assert [keyed(r).key for r in again] == [k.key for k in reads.keys]
    shows = {r.show: r.identity for r in again}
    name = probe.__name__
    assert shows[f"global {name}.__loader__"] and shows[f"global {name}.__spec__"]
    assert shows[f"global {name}.__builtins__"] and not shows["builtin PLAIT_NSGUARD_OFFSET"]
    assert f"the names of {name}" in shows and "the names of builtins" in shows
