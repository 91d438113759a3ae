"""The benchmark models with symbolic sizes: one compile serves batch sizes 2..64 (ResNet-18)
and sequence lengths 2..256 (the GPT-2 block), every call within the contract against eager
(the conformance gate, fresh inputs), run by Stax (native kernels and externs, no interpreter).
The full sweeps are slow; the fast tests take a few sizes at each end and in between."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch

import plait
import plait.conformance
from benchmarks.models.gpt2 import Block, GPT2Config
from benchmarks.models.resnet import resnet18


def _resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return resnet18(num_classes=10).eval()


def _block(attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPT2Config(block_size=256, n_head=4, d_model=64, attention=attention)
    return Block(cfg).eval()


def _sweep(
    model: torch.nn.Module,
    shape_of: Callable[[int], tuple[int, ...]],
    sizes: Iterable[int],
    dynamic: Any = True,
    first: torch.Tensor | None = None,
) -> Any:
    """Compile once (at ``first`` when given: a size that equals no other, as equal sizes share
    a symbol), judge every size by the gate on fresh inputs of ``shape_of(size)``; returns the
    compiled module."""
    compiled = plait.compile(model, dynamic=dynamic, fullgraph=True, options={"cache": False})
    if first is not None:
        with torch.no_grad():
            compiled(first)
    for n in sizes:
        shape = shape_of(n)

        def draw(seed: int, shape: tuple[int, ...] = shape) -> tuple[torch.Tensor]:
            return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

        with torch.no_grad():
            # NOTE: the subject is the sizes: the special-values draw only at the smallest (2, 3)
            report = plait.conformance.check(
                model, compiled, draw, draws=1, candidate_module=model,
                special_values=n not in range(4, 257), seed=n,
            )  # fmt: skip
        assert report.ok, f"size {n}: {report}"
    return compiled


def _native(compiled: Any, count: int = 1) -> None:
    """``count`` specializations, each run by Stax with no fallback, the last one symbolic."""
    report = plait.explain(compiled)
    assert len(report.specializations) == count, compiled.recompile_reasons
    for s in report.specializations:
        assert s.manifest.executor["backend"] == "stax", s.manifest.executor
        assert s.manifest.fallbacks == []
        counts = s.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0 and counts["native"] > 0
    graph = compiled.specializations[-1].graph
    assert not all(v.type.is_static for v in graph.inputs if v.kind == "user")


RESNET_FAST = (2, 3, 17, 64)
SEQ_FAST = (2, 3, 100, 256)


def test_resnet_one_compile_serves_batch_sizes() -> None:
    model = _resnet()
    compiled = _sweep(model, lambda b: (b, 3, 32, 32), RESNET_FAST)
    _native(compiled)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_gpt2_block_one_compile_serves_sequence_lengths(attention: str) -> None:
    model = _block(attention)
    sizes = [(2 + n % 3, n) for n in SEQ_FAST]
    compiled = _sweep(model, lambda k: (*sizes[k], 64), range(len(sizes)))
    _native(compiled)


def test_automatic_dynamic_compiles_twice_then_serves_every_size() -> None:
    """dynamic=None: the first size static, the second symbolic, the rest served."""
    model = _block("explicit")
    compiled = _sweep(model, lambda t: (2, t, 64), (7, 9, 2, 256, 31), dynamic=None)
    _native(compiled, count=2)
    dims = plait.explain(compiled).specializations[1].manifest.options["dynamic_dims"]
    assert dims == {"x.shape[1]": {"symbol": "s1", "sizes_seen": [7, 9]}}


@pytest.mark.slow
def test_resnet_batch_sizes_2_to_64() -> None:
    model = _resnet()
    compiled = _sweep(model, lambda b: (b, 3, 16, 16), range(2, 65))
    _native(compiled)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_gpt2_block_sequence_lengths_2_to_256(attention: str) -> None:
    model = _block(attention)
    first = torch.randn(3, 5, 64)
    compiled = _sweep(model, lambda t: (2, t, 64), range(2, 257), first=first)
    _native(compiled)
