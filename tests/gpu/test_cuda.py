"""What needs CUDA: capture on CUDA tensors (bitwise against eager), device guards, and the
default backend's recorded choice on CUDA. Skipped where there is no CUDA device."""

from __future__ import annotations

import pytest
import torch

import plait
import plait.conformance
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.resnet import resnet18
from tests.capture.helpers import compare_module
from tests.capture.test_guards import _one_recompile
from tests.capture.test_models import MODES, _no_opaque

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("train", MODES)
def test_models_on_cuda(train: bool) -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).cuda().train(train)
    _no_opaque(
        compare_module(
            model,
            lambda i: torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(i)).cuda(),
            fullgraph=True,
        )
    )
    cfg = GPT2Config(vocab_size=96, block_size=32, n_layer=2, n_head=4, d_model=32, dropout=0.1)
    for attention in ("sdpa", "explicit"):
        cfg.attention = attention
        gpt = GPT2(cfg).cuda().train(train)
        _no_opaque(
            compare_module(
                gpt,
                lambda i: torch.randint(
                    0, 96, (2, 12), generator=torch.Generator().manual_seed(i)
                ).cuda(),
                fullgraph=True,
            )
        )


def test_cuda_device_change_recompiles_once() -> None:
    f = plait.compile(lambda x: x.relu() + 1, backend="eager")
    _one_recompile(f, (torch.randn(3),), (torch.randn(3, device="cuda"),), "on cuda:0")
    x = torch.randn(5, device="cuda")
    f(x)
    assert torch.equal(f(x), x.relu() + 1)


def test_default_backend_on_cuda_is_stax_with_triton_kernels() -> None:
    f = plait.compile(lambda x: x.relu() * 2)
    x = torch.randn(64, device="cuda")
    assert torch.equal(f(x), x.relu() * 2)
    m = f.specializations[0].manifest
    assert m.options["backend"] == "stax" and "Triton kernels" in m.options["backend_choice"]
    assert m.executor["target"] == "triton"
    assert m.toolchain["gpu_capability"] == list(torch.cuda.get_device_capability())


def test_default_backend_compiles_a_symbolic_cuda_program_to_triton_kernels() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.relu() * 2).sum(-1)

    f = plait.compile(fn, dynamic=True)
    for rows in (3, 17, 64):
        report = plait.conformance.check(fn, f, (torch.randn(rows, 40, device="cuda"),), draws=1)
        assert report.ok, str(report)
    assert len(f.specializations) == 1
    m = f.specializations[0].manifest
    assert m.options["backend"] == "stax" and "symbolic shapes" in m.options["backend_choice"]
    assert m.executor["target"] == "triton" and not m.executor["cuda_graph"]["used"]
