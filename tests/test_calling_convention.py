"""A compiled module accepts exactly what the module accepts: positional, keyword, defaults left
to the callable, ``**kwargs`` passed through, also through decorators that fill in arguments
themselves (as Hugging Face's do around ``forward``)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning

TOL = plait.contract.load().tolerance("model", torch.float32)


def _fills_use_cache(forward: Callable[..., Any]) -> Callable[..., Any]:
    """As transformers' decorators do: put a named parameter into ``kwargs`` when absent."""

    @functools.wraps(forward)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("use_cache", self.default_use_cache)
        return forward(self, *args, **kwargs)

    return wrapper


class Decorated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
        self.default_use_cache = True

    @_fills_use_cache
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        scale: float = 2.0,
        **kwargs: Any,
    ) -> torch.Tensor:
        y = self.fc(x) * scale
        if mask is not None:
            y = y * mask
        if use_cache:
            y = y + 1
        for value in kwargs.values():
            y = y - value
        return y


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CALLS: list[Callable[[int], tuple[tuple[Any, ...], dict[str, Any]]]] = [
    lambda s: ((_x(s, 3, 6),), {}),
    lambda s: ((_x(s, 3, 6), _x(s + 1, 3, 4)), {}),
    lambda s: ((_x(s, 3, 6),), {"mask": _x(s + 1, 3, 4)}),
    lambda s: ((), {"x": _x(s, 3, 6), "use_cache": False}),
    lambda s: ((_x(s, 3, 6),), {"scale": 0.5, "extra": _x(s + 2, 3, 4)}),
    # NOTE: a named argument after every one before it: passed on by name, as made (by position
    # the decorator's own use_cache collided with it)
    lambda s: ((_x(s, 3, 6), _x(s + 1, 3, 4)), {"use_cache": False}),
    lambda s: ((), {"x": _x(s, 3, 6), "mask": _x(s + 1, 3, 4), "use_cache": False, "scale": 0.5}),
]


@pytest.mark.parametrize("call", range(len(CALLS)))
def test_a_decorated_forward_is_called_as_the_module_is(call: int) -> None:
    model = Decorated().eval()
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    with torch.no_grad():
        for seed in (10, 20):  # NOTE: twice, on fresh values: the second call is no capture
            args, kwargs = CALLS[call](seed)
            torch.testing.assert_close(
                compiled(*args, **kwargs), model(*args, **kwargs), rtol=TOL.rtol, atol=TOL.atol
            )


def test_a_decorated_forward_refuses_what_the_module_refuses_after_a_named_call() -> None:
    """The same values passed by position where a named call was compiled: the decorator's
    use_cache collides with it in eager, and so in the compiled module (the call's structure
    says how each argument came, so the named call's program is not reused)."""
    model = Decorated().eval()
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    x, mask = _x(1, 3, 6), _x(2, 3, 4)
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(x, mask, use_cache=False),
            model(x, mask, use_cache=False),
            rtol=TOL.rtol,
            atol=TOL.atol,
        )
        with pytest.raises(TypeError) as eager:
            model(x, mask, False)
        with pytest.raises(TypeError) as got:
            compiled(x, mask, False)
    assert str(got.value) == str(eager.value)


def test_hugging_face_llama_called_by_name_as_generate_calls_it() -> None:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    compiled = plait.compile(model, options={"cache": False})
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 64, (2, 7), generator=gen)
        mask = torch.ones(2, 7, dtype=torch.long)
        pos = torch.arange(7).unsqueeze(0)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            # NOTE: every argument before use_cache named too, as generate() calls the model
            named = {"input_ids": ids, "attention_mask": mask, "position_ids": pos,
                     "cache": None, "inputs_embeds": None, "use_cache": False}  # fmt: skip
            got = compiled(**named).last_hidden_state
            want = model(**named).last_hidden_state
        torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


@pytest.mark.slow
def test_hugging_face_bert_runs_as_the_module() -> None:
    import transformers

    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=1000,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    compiled = plait.compile(model, options={"cache": False})
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 1000, (2, 7), generator=gen)
        mask = (torch.rand(2, 7, generator=gen) > 0.2).long()
        with torch.no_grad(), warnings.catch_warnings():
            # NOTE: capture coverage of BERT is another matter: here, the calling convention
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(ids, attention_mask=mask, output_hidden_states=True)
            want = model(ids, attention_mask=mask, output_hidden_states=True)
        assert type(got) is type(want)
        for name in ("last_hidden_state", "pooler_output"):
            torch.testing.assert_close(
                getattr(got, name), getattr(want, name), rtol=TOL.rtol, atol=TOL.atol
            )
        assert len(got.hidden_states) == len(want.hidden_states) == 3
