"""Whole models captured with fullgraph=True and run by the eager backend are bitwise equal to
eager PyTorch on fresh random inputs, in train and eval mode, in float32 and bfloat16.

Train mode: BatchNorm updates its running statistics (checked after every call); dropout draws
from torch's RNG, so both sides are seeded identically before each call (p > 0 in the MLP and
the GPT-2 models).
"""

from __future__ import annotations

import pytest
import torch

import plait
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.mlp import MLP
from benchmarks.models.resnet import resnet18, resnet50
from tests.capture.helpers import assert_state_equal, compare_module

DTYPES = [torch.float32, torch.bfloat16]
MODES = [pytest.param(False, id="eval"), pytest.param(True, id="train")]


def _no_opaque(compiled: plait.api.CompiledModule) -> None:
    assert len(compiled.specializations) == 1
    spec = compiled.specializations[0]
    assert spec.graph is not None and spec.fallback_reason is None
    assert spec.opaque_counts == {}
    assert not any(n.op == "opaque" for n in spec.graph.nodes)


def _images(dtype: torch.dtype, size: int = 32):
    def make(i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        return torch.randn(2, 3, size, size, generator=g).to(dtype)

    return make


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("train", MODES)
def test_mlp(train: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = MLP(16, 64, 8, dropout=0.2).to(dtype).train(train)
    compiled = compare_module(
        model,
        lambda i: torch.randn(5, 16, generator=torch.Generator().manual_seed(i)).to(dtype),
        fullgraph=True,
    )
    _no_opaque(compiled)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("train", MODES)
def test_resnet18(train: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).to(dtype).train(train)
    _no_opaque(compare_module(model, _images(dtype), fullgraph=True))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("train", MODES)
def test_resnet50(train: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = resnet50(num_classes=10).to(dtype).train(train)
    _no_opaque(compare_module(model, _images(dtype, 16), calls=2, fullgraph=True))


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("train", MODES)
def test_gpt2(attention: str, train: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=96,
        block_size=32,
        n_layer=2,
        n_head=4,
        d_model=32,
        dropout=0.1,
        attention=attention,
    )
    model = GPT2(cfg).to(dtype).train(train)

    def tokens(i: int) -> torch.Tensor:
        return torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(i))

    compiled = compare_module(model, tokens, fullgraph=True)
    _no_opaque(compiled)
    graph = compiled.specializations[0].graph
    assert graph is not None
    ops = {n.op for n in graph.nodes}
    assert ("scaled_dot_product_attention" in ops) == (attention == "sdpa")
    assert ("softmax" in ops) == (attention == "explicit")
    # NOTE: the output head is tied to the token embedding: one graph input for both.
    assert [v.name for v in graph.inputs].count("wte.weight") == 1


def test_batchnorm_buffers_update_once_per_call() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).train()
    compiled = compare_module(model, _images(torch.float32, 8), calls=3)
    bn = model[1]
    assert isinstance(bn, torch.nn.BatchNorm2d) and bn.num_batches_tracked is not None
    assert int(bn.num_batches_tracked) == 3
    assert len(compiled.specializations) == 1
    graph = compiled.specializations[0].graph
    assert graph is not None
    # NOTE: the running stats and the counter are graph outputs written back after each call.
    assert sum(n.op == "batch_norm_train" for n in graph.nodes) == 1
    assert len(compiled.specializations[0].program.mutations) == 3


@pytest.mark.parametrize("train", MODES)
def test_capture_leaves_no_trace(train: bool) -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).train(train)
    cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=1, n_head=2, d_model=16, dropout=0.5)
    gpt = GPT2(cfg).train(train)
    for m, args in ((model, (torch.randn(2, 3, 16, 16),)), (gpt, (torch.randint(0, 64, (2, 8)),))):
        before = {k: v.clone() for k, v in m.state_dict().items()}
        rng = torch.get_rng_state()
        plait.capture(m, args)
        assert torch.equal(torch.get_rng_state(), rng)
        after = m.state_dict()
        assert list(before) == list(after)
        for k in before:
            assert torch.equal(before[k], after[k]), k
        assert all(type(p) is torch.nn.Parameter for p in m.parameters())
        assert m.training == train


def test_compiled_train_then_eval_matches_eager() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).train()
    import copy

    reference = copy.deepcopy(model)
    compiled = plait.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 3, 32, 32)
    compiled(x)
    reference(x)
    compiled.eval()
    reference.eval()
    y = torch.randn(2, 3, 32, 32)
    assert torch.equal(compiled(y), reference(y))
    assert_state_equal(model, reference)
    assert len(compiled.specializations) == 2
