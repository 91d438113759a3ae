"""A dataclass the program returns comes back in the state eager's has.

Its fields outside ``__init__`` and the attributes the program sets on it after construction
carry this call's values; a ``__post_init__`` that transforms its fields is not run a second
time on values it already made. A mapping dataclass (transformers' ``ModelOutput``) is rebuilt
by its constructor, which fills the mapping from the fields.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.utils import ModelOutput

import plait


@dataclasses.dataclass
class Counted:
    logits: torch.Tensor
    n_tokens: int = dataclasses.field(default=0, init=False)


@dataclasses.dataclass
class WithDerived:
    a: torch.Tensor
    b: torch.Tensor | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.b = None


@dataclasses.dataclass
class Doubling:
    x: torch.Tensor
    n: int = 1

    def __post_init__(self) -> None:
        self.x = self.x * 2
        self.n = self.n + 1


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    y: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "y", 5)


@dataclasses.dataclass
class Output(ModelOutput):  # type: ignore[misc]
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def program(x: torch.Tensor, k: int) -> tuple[Counted, WithDerived, Doubling, Frozen, Output]:
    counted = Counted(x * k)
    counted.n_tokens = x.shape[0] * k
    counted.note = f"k={k}"  # type: ignore[attr-defined]
    derived = WithDerived(x)
    derived.b = x * 3  # NOTE: a tensor in a field outside __init__: an output of the graph
    return counted, derived, Doubling(x + k), Frozen(x - k), Output(logits=x.relu(), hidden=None)


def _state(obj: object) -> dict[str, object]:
    return dict(vars(obj))


def test_dataclass_results_keep_eager_state() -> None:
    compiled = plait.compile(program, options={"cache": False})
    for seed, k in ((1, 1), (2, 2), (3, 3)):
        x = torch.randn(seed + 1, 4, generator=torch.Generator().manual_seed(seed))
        for want, got in zip(program(x, k), compiled(x, k)):
            assert type(got) is type(want)
            a, b = _state(want), _state(got)
            assert a.keys() == b.keys(), (a, b)
            for name, w in a.items():
                g = b[name]
                assert torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w, (name, w, g)
            if isinstance(want, dict):
                assert list(got.keys()) == list(want.keys())
