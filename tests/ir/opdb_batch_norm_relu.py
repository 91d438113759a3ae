"""Op-database samples for the batch norms fused with their ReLU (plait.ir.ops.batch_norm_relu):
ATen's functional training batch norm then relu, and ATen's backward of a ReLU-masked gradient,
each with and without running statistics or weights.

Registered into :data:`tests.ir.opdb.GENERATORS` by that module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch

# NOTE: imported by tests/ir/opdb.py at its end, after these names exist there.
from tests.ir.opdb import Maker, Sample

aten = torch.ops.aten
MOMENTUM, EPS = 0.1, 1e-5
REFS = [{"t": i} for i in range(5)]


def _stats(dtype: torch.dtype) -> torch.dtype:
    """The weights' and statistics' dtype: float32 for a 16-bit input, as under autocast (ATen's
    CPU kernels keep an all-16-bit call's batch statistics 16-bit, its meta kernel says float32:
    the aten node's type rule follows the meta kernel)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _forward_attrs(running: bool) -> dict[str, Any]:
    if running:
        literals = [*REFS, True, MOMENTUM, EPS]
        return {"name": "_native_batch_norm_legit_functional", "literals": json.dumps(literals)}
    literals = [REFS[0], REFS[1], REFS[2], True, MOMENTUM, EPS]
    return {
        "name": "_native_batch_norm_legit",
        "overload": "no_stats",
        "literals": json.dumps(literals),
    }


def gen_batch_norm_relu(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape in ((4, 6, 5, 3), (5, 6)):
        x, p = make(shape, dtype), _stats(dtype)
        w, b = make((6,), p), make((6,), p)
        rm, rv = make((6,), p), make((6,), p, positive=True)

        def eager(x: Any = x, w: Any = w, b: Any = b, rm: Any = rm, rv: Any = rv) -> Any:
            out = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
            return (torch.relu(out[0]), *out[1:])

        yield Sample(
            "batch_norm_relu", [[x, w, b, rm, rv]], _forward_attrs(True), eager, f"{shape}"
        )
    x, w, b = make((4, 6, 3), dtype), make((6,), _stats(dtype)), make((6,), _stats(dtype))

    def no_stats() -> Any:
        out = aten._native_batch_norm_legit.no_stats(x, w, b, True, MOMENTUM, EPS)
        return (torch.relu(out[0]), *out[1:])

    yield Sample("batch_norm_relu", [[x, w, b]], _forward_attrs(False), no_stats, "no_stats")


def gen_batch_norm_relu_backward(dtype: torch.dtype, make: Maker) -> Iterator[Sample]:
    for shape, weighted in (((4, 6, 5, 3), True), ((5, 6), False)):
        x, g, y = make(shape, dtype), make(shape, dtype), make(shape, dtype)
        y.view(-1)[::3] = 0  # NOTE: the mask's boundary: y <= 0 takes zero
        w = make((6,), _stats(dtype))
        _, mean, rstd = aten._native_batch_norm_legit.no_stats(x, w, None, True, MOMENTUM, EPS)
        mask = [True, weighted, weighted]
        tensors = [g, x, w, mean, rstd] if weighted else [g, x, mean, rstd]
        refs = [{"t": i} for i in range(len(tensors))]
        literals = (
            [*refs[:3], None, None, *refs[3:], True, EPS, mask]
            if weighted
            else [*refs[:2], None, None, None, *refs[2:], True, EPS, mask]
        )

        def eager(
            g: Any = g,
            x: Any = x,
            w: Any = w,
            m: Any = mean,
            r: Any = rstd,
            y: Any = y,
            k: Any = mask,
        ) -> Any:
            masked = torch.where(torch.le(y, 0), 0.0, g)
            out = aten.native_batch_norm_backward(
                masked, x, w if k[1] else None, None, None, m, r, True, EPS, k
            )
            kept = [t for t in out if t is not None]
            return kept[0] if len(kept) == 1 else tuple(kept)

        attrs = {"name": "native_batch_norm_backward", "literals": json.dumps(literals)}
        yield Sample("batch_norm_relu_backward", [[*tensors, y]], attrs, eager, f"{shape}")


GENERATORS = {
    "batch_norm_relu": gen_batch_norm_relu,
    "batch_norm_relu_backward": gen_batch_norm_relu_backward,
}
