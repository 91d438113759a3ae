"""Tensors capture finds outside the module state (a layer kept in a plain list, a tensor
attribute) are graph inputs of kind ``const`` that each call binds from its own capture: their
values are in neither the key nor the entry. An entry of such a program is a plain hit for
another instance with other values, and answers with that instance's values (it used to be
refused on every load, "constant const0 is missing from the entry", warned, rebuilt, and
written again; the warning was attributed to a torch frame, which pytest's filter ignores).

The assertions are on results and on the manifest's cache status and events, and every
warning is recorded here, whatever the filters say."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.cache.lookup import CacheWarning
from tests.util import assert_bitwise

_TOL = plait.contract.load().tolerance("model", torch.float32)


class PlainList(nn.Module):
    """A layer in a plain list and a tensor attribute: neither is a parameter or buffer of
    the module, so capture reads both as constants."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(3, 4)]
        self.scale = torch.rand(4) + 0.5
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers[0](x).relu() * self.scale)


def _fresh(seed: int) -> torch.Tensor:
    return torch.randn(5, 3, generator=torch.Generator().manual_seed(9100 + seed))


def _compile_and_run(net: nn.Module, backend: str, cache: Path) -> tuple[Any, list[str]]:
    """Compile ``net`` in the cache at ``cache``, check it bitwise against eager on fresh
    inputs; its specialization's manifest and every cache warning raised meanwhile."""
    compiled = plait.compile(net, backend=backend, options={"cache": str(cache)})
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for seed in range(3):
            x = _fresh(seed)
            got, expected = compiled(x), net(x)
            if backend == "eager":  # NOTE: the interpreter keeps eager's arithmetic order
                assert_bitwise(got, expected, f"draw {seed}")
            else:  # NOTE: Stax fuses the pointwise tail: held to the contract's budget
                torch.testing.assert_close(got, expected, rtol=_TOL.rtol, atol=_TOL.atol)
    (spec,) = compiled.specializations
    cache_warnings = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    return spec.manifest, cache_warnings


@pytest.mark.parametrize("backend", ["eager", "stax"])
@pytest.mark.parametrize("global_hook", [False, True])
def test_an_entry_with_captured_constants_is_a_hit_with_another_instances_values(
    tmp_path: Path, backend: str, global_hook: bool
) -> None:
    torch.manual_seed(31)
    first, second = PlainList().eval(), PlainList().eval()
    # NOTE: the frozen parameters (the key's weights part) the same, the constants not
    second.out.load_state_dict(first.out.state_dict())
    assert not torch.equal(first.layers[0].weight, second.layers[0].weight)
    assert not torch.equal(first.scale, second.scale)
    # NOTE: the reported case: compiled again while a global forward hook is set (the hook
    # runs inside the program). The hook table is a Python value capture reads, so it is
    # guarded and part of the key: both compiles run under the same hook.
    hook = nn.modules.module.register_module_forward_hook(lambda mod, i, o: o)
    if not global_hook:
        hook.remove()
    try:
        m, caught = _compile_and_run(first, backend, tmp_path)
        assert m.cache["status"] == "miss" and m.cache["events"] == [] and caught == [], m.cache
        m2, caught = _compile_and_run(second, backend, tmp_path)
    finally:
        hook.remove()
    assert m2.cache_key["digest"] == m.cache_key["digest"]
    assert m2.cache["status"] == "hit", m2.cache
    assert m2.cache["events"] == [] and caught == [], (m2.cache, caught)
