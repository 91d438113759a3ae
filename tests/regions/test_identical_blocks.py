"""Identical blocks (same classes, same parameter shapes and dtypes, other weights) share one
capture and one compiled artifact, counted by the region engines; a block whose guards fail
recompiles on its own."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning
from tests.regions import models

TOL = plait.contract.load().tolerance("model", torch.float32)
N_BLOCKS = 4


def _close(got: Any, want: Any) -> None:
    torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


def _x(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _engines(cm: Any) -> dict[str, Any]:
    tree = cm._plait.tree
    return {e.path: e for e in tree.order}


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_n_blocks_capture_and_compile_once(backend: str) -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=N_BLOCKS).eval()
    cm = plait.compile(model, backend=backend, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            _close(cm(_x(5, 8, seed=1)), model(_x(5, 8, seed=1)))
        for seed in range(2, 5):
            _close(cm(_x(5, 8, seed=seed)), model(_x(5, 8, seed=seed)))
    sharing = plait.explain(cm).regions["sharing"]
    # NOTE: inp, blocks.0 and head capture and compile; blocks.1..3 take blocks.0's
    assert sharing == {
        "captures": 3,
        "compiles": 3,
        "programs_shared": N_BLOCKS - 1,
        "artifacts_shared": N_BLOCKS - 1,
    }
    engines = _engines(cm)
    first = engines["blocks.0"].specializations[0]
    for k in range(1, N_BLOCKS):
        spec = engines[f"blocks.{k}"].specializations[0]
        assert spec.compiled is first.compiled  # NOTE: one artifact: one executor, one build
        assert spec.program.graph is first.program.graph
        assert spec.program is not first.program  # NOTE: guards of its own (its weights)
    if backend == "stax":
        assert first.compiled.program is not None
    # NOTE: parameters stay graph inputs: each block runs with its own weights
    assert first.manifest.options["freeze"] is False
    assert first.manifest.graph["frozen"] == []
    regions = {r["module"]: r for r in plait.explain(cm).regions["regions"]}
    assert regions["blocks.2"]["shares_artifact_with"] == ["blocks.0", "blocks.1", "blocks.3"]


def test_a_block_whose_guard_fails_recompiles_alone() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=3).eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            cm(_x(5, 8, seed=1))
        cm(_x(5, 8, seed=1))  # NOTE: the regions compile from the call after the refusal
        model.blocks[1].scale = 0.25  # NOTE: a Python value the block's program read
        for seed in range(2, 5):
            _close(cm(_x(5, 8, seed=seed)), model(_x(5, 8, seed=seed)))
    engines = _engines(cm)
    assert [len(engines[f"blocks.{k}"].specializations) for k in range(3)] == [1, 2, 1]
    (reason,) = engines["blocks.1"].recompile_reasons
    assert "scale" in reason
    # NOTE: its new program reads 0.25 where the others read 1.0: captured for itself
    assert engines["blocks.1"].specializations[1].compiled is not (
        engines["blocks.0"].specializations[0].compiled
    )
    assert len(cm.specializations) == 1  # NOTE: the root did not recompile


def _hooked(model: nn.Module, at: str) -> list[torch.Tensor]:
    """What the forward hook registered on ``model``'s submodule ``at`` saw, call by call."""
    seen: list[torch.Tensor] = []
    module = model.get_submodule(at)
    module.register_forward_hook(lambda mod, args, out: seen.append(out) or out * 3)
    return seen


def _calls(compiled: Any, eager: Any) -> None:
    """The calls of the hook tests: a first call, then three of ``compiled`` each checked
    against ``eager`` on the same input."""
    with torch.no_grad():
        compiled(_x(5, 8, seed=1))
        for seed in range(2, 5):
            _close(compiled(_x(5, 8, seed=seed)), eager(_x(5, 8, seed=seed)))


def _twin_saw(model: nn.Module, at: str) -> list[torch.Tensor]:
    """What the same hook sees on an eager copy of ``model`` making the calls of
    :func:`_calls` (the compiled and the eager calls alike eager)."""
    twin = copy.deepcopy(model)
    seen = _hooked(twin, at)
    _calls(twin, twin)
    return seen


def _same_calls(seen: list[torch.Tensor], twin: list[torch.Tensor]) -> None:
    """A hook's Python runs once per call, compiled or eager, on the call's own tensors: as
    often as on the eager twin, with its values."""
    assert len(seen) == len(twin)
    assert all(type(t) is torch.Tensor for t in seen)
    for got, want in zip(seen, twin):
        _close(got, want)


def test_a_block_with_a_hooked_submodule_is_split_and_the_others_share() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=3).eval()
    twin = _twin_saw(model, "blocks.2.fc2")
    seen = _hooked(model, "blocks.2.fc2")
    cm = plait.compile(model, options={"cache": False})
    with pytest.warns(CaptureFallbackWarning):
        _calls(cm, model)
    report = plait.explain(cm).regions
    regions = {r["module"]: r for r in report["regions"]}
    # NOTE: the hook runs on each call: blocks.2 runs split, its fc2 a region of its own
    assert regions["blocks.2"]["status"] == "split"
    assert regions["blocks.2.fc2"]["status"] == "compiled"
    # NOTE: the refused first call went on eagerly from the branch: its hook ran once
    _same_calls(seen, twin)
    (hooked,) = [b for b in report["boundaries"] if b["module"] == "blocks.2"]
    assert "fc2 has hooks" in hooked["reason"]
    assert regions["blocks.1"]["shares_artifact_with"] == ["blocks.0"]


def test_hooks_on_blocks_run_eagerly_on_every_call_and_blocks_still_share() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=3).eval()
    twin = _twin_saw(model, "blocks.1")
    seen = _hooked(model, "blocks.1")
    cm = plait.compile(model, options={"cache": False})
    with pytest.warns(CaptureFallbackWarning):
        _calls(cm, model)
    # NOTE: a Python side effect of a hook runs once per call, compiled or eager, on the
    # call's own tensors: the refused first call went on eagerly from the branch (its hook
    # ran once, on the call's tensors)
    _same_calls(seen, twin)
    _close(seen[1], seen[2])  # NOTE: the same input, compiled (1) and eager (2)
    assert plait.explain(cm).regions["sharing"]["programs_shared"] == 2


def test_blocks_trained_with_gradients_share_and_match_eager() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=3).train()
    cm = plait.compile(model, backend="eager", options={"cache": False})
    x = _x(5, 8, seed=1)
    with pytest.warns(CaptureFallbackWarning):
        cm(x).sum().backward()
    for seed in range(2, 4):
        model.zero_grad()
        x = _x(5, 8, seed=seed)
        cm(x).square().sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        for g, p in zip(got, model.parameters()):
            _close(g, p.grad)
    assert plait.explain(cm).regions["sharing"]["artifacts_shared"] == 2


@pytest.mark.slow
def test_gpt2_blocks_compile_once() -> None:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(
        n_layer=3,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2Model(config).eval()

    def validate(module: nn.Module, args: tuple, kwargs: dict) -> None:
        # NOTE: a user's input check reads the mask's data: the root cannot be one graph
        if not bool(kwargs["attention_mask"].any()):
            raise ValueError("an all-padding batch")

    model.register_forward_pre_hook(validate, with_kwargs=True)
    cm = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(0)

    def inputs() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (2, 7), generator=gen)
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1, 5:] = 0  # NOTE: a padded row
        return {"input_ids": ids, "attention_mask": mask}

    with torch.no_grad():
        first = inputs()
        with pytest.warns(CaptureFallbackWarning):
            got = cm(**first)
        _close(got.last_hidden_state, model(**first).last_hidden_state)
        for _ in range(3):
            batch = inputs()
            _close(cm(**batch).last_hidden_state, model(**batch).last_hidden_state)
    report = plait.explain(cm).regions
    regions = {r["module"]: r for r in report["regions"]}
    blocks = [f"h.{k}" for k in range(3)]
    assert all(regions[b]["status"] == "compiled" for b in blocks)
    engines = _engines(cm)
    shared = engines["h.0"].specializations[0].compiled
    assert all(engines[b].specializations[0].compiled is shared for b in blocks)
    # NOTE: wte, wpe, drop, h.0 and ln_f capture and compile; h.1 and h.2 take h.0's
    assert report["sharing"] == {
        "captures": 5,
        "compiles": 5,
        "programs_shared": 2,
        "artifacts_shared": 2,
    }
    assert report["ops"]["compiled_share"] > 0.5


def test_blocks_of_different_shapes_do_not_share() -> None:
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = models.Block(8), models.Block(8)
            self.c = models.Block(8)
            self.c.fc1 = nn.Linear(8, 24)
            self.c.fc2 = nn.Linear(24, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.c(self.b(self.a(x)))
            return x if x.sum() > 0 else -x

    model = Net().eval()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            cm(_x(3, 8, seed=0))
        for seed in range(1, 4):
            _close(cm(_x(3, 8, seed=seed)), model(_x(3, 8, seed=seed)))
    sharing = plait.explain(cm).regions["sharing"]
    assert sharing == {"captures": 2, "compiles": 2, "programs_shared": 1, "artifacts_shared": 1}
