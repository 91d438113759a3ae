"""Measurements behind the model rule's factor and floor (docs/conformance.md, "Statistics").

Not a test: run ``python -m benchmarks.conformance_dot_products [trials]``. For dot products of K
float32 terms it compares eager (PyTorch's blocked kernels) with other summation orders and
prints, per order and output count, how often the model rule (as the contract declares it: the
RMS error with ``factor``, the worst error with ``tail_factor``, for a single case) would fail the
candidate, and beside it how often contract 1.0.0's rule did (the worst error with ``factor``).
Correct multi-accumulator orders should print 0; the naive sequential loop is the one that shows
why codegen must not emit it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

import plait.contract

Order = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def split_k(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.shape[1] // 2
    return x[:, :h] @ w[:h] + x[:, h:] @ w[h:]


def lanes8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    parts = (x * w).reshape(x.shape[0], -1, 8)
    acc = torch.zeros(x.shape[0], 8)
    for j in range(parts.shape[1]):
        acc = acc + parts[:, j]
    return acc.sum(1)


def sequential(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(x.shape[0])
    for j in range(x.shape[1]):
        acc = acc + x[:, j] * w[j]
    return acc


def failure_rate(
    order: Order, outputs: int, k: int, trials: int, draws: int = 1
) -> tuple[float, float]:
    """How often the model rule fails ``order``, its errors pooled over ``draws`` draws: this
    contract's rule (RMS and tail), and contract 1.0.0's (worst error, ``factor``)."""
    contract = plait.contract.load()
    factor, floor = contract.model_factor("float32"), contract.model_floor("float32")
    tail = contract.model_tail_factor("float32")
    u = torch.finfo(torch.float32).eps / 2
    fails = fails_1_0 = 0
    for trial in range(trials):
        err_e, err_c, exact = [], [], []
        for draw in range(draws):
            gen = torch.Generator().manual_seed(trial * draws + draw)
            x = torch.randn(outputs, k, generator=gen)
            w = torch.randn(k, generator=gen) * 0.2
            z = x.double() @ w.double()
            err_e.append((x @ w).double() - z)
            err_c.append(order(x, w).double() - z)
            exact.append(z)
        e, c, z = torch.cat(err_e).abs(), torch.cat(err_c).abs(), torch.cat(exact).abs()
        rms = lambda t: float(t.square().mean().sqrt())
        worst = lambda t: float(t.max())
        fails += rms(c) > factor * rms(e) + floor * u * rms(z) or (
            worst(c) > tail * worst(e) + floor * u * worst(z)
        )
        fails_1_0 += worst(c) > factor * worst(e) + floor * u * worst(z)
    return fails / trials, fails_1_0 / trials


def main(trials: int) -> None:
    torch.set_num_threads(1)
    print("fails: this contract's rule (contract 1.0.0's rule)")
    for k in (64, 512):
        for outputs in (1, 4, 16, 64):
            for name, order in (
                ("split_k", split_k),
                ("lanes8", lanes8),
                ("sequential", sequential),
            ):
                rate, old = failure_rate(order, outputs, k, trials)
                print(f"K={k:4d} outputs={outputs:3d} {name:10s} fails {rate:.1%} ({old:.1%})")
        for name, order in (("split_k", split_k), ("lanes8", lanes8)):
            rate, old = failure_rate(order, 1, k, trials, draws=4)
            print(f"K={k:4d} a scalar pooled over 4 draws {name:10s} fails {rate:.1%} ({old:.1%})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
