"""Helpers for the tests of plait's native convolution kernels (depthwise, 1x1, stem): what the
running program reports for each node, and a draw with NaN and infinities written in."""

from __future__ import annotations

from typing import Any

import torch


def node_details(compiled: Any) -> dict[str, str]:
    """``op#id`` -> the evidence detail of each node of the last specialization's program."""
    program = compiled.specializations[-1].compiled.program
    ops = {n.id: n.op for n in program.graph.nodes}
    return {f"{ops[i]}#{i}": t.detail for i, t in program.evidence.nodes.items() if i in ops}


def special_values(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A fresh normal draw (times 4) with ten NaNs, ten +inf and ten -inf at random places."""
    x = torch.randn(shape, generator=gen) * 4
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=gen)[:30]
    flat[picks[:10]] = float("nan")
    flat[picks[10:20]] = float("inf")
    flat[picks[20:]] = float("-inf")
    return x


def special_values_match(
    model: Any, shapes: list[tuple[int, ...]], op_class: str, what: str, seed: int
) -> Any:
    """``model`` compiled for Stax, called on three draws of :func:`special_values` of
    ``shapes``, each result judged against eager's (NaN and infinities where eager has them,
    the rest within the contract's ``op_class`` row); the compiled model."""
    import plait
    from tests.codegen.test_special_values import assert_matches_eager

    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(3):
            args = [special_values(s, gen) for s in shapes]
            assert_matches_eager([compiled(*args)], [[model(*args)]], op_class, what)
    return compiled
