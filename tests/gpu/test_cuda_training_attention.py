"""Training a Hugging Face GPT-2 on CUDA under bfloat16 autocast: the compiled step passes the
gate (outputs and gradients), and attention's gradient is eager's fused kernel's backward
through autograd (a ``torch_vjp`` node), not float32 products. Skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

import plait
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.autograd.test_training_models import MODELS
from tests.conformance.models import seeded

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_gpt2_training_under_cuda_autocast_uses_eagers_attention_gradient() -> None:
    make, draw = MODELS["hf-gpt2"]
    model = seeded(0, make).cuda().train()
    compiled = plait.compile(copy.deepcopy(model))
    gate_bf16_training(model, compiled, lambda s: draw(s).cuda(), "cuda")
    (spec,) = compiled.specializations
    backward = spec.compiled.program.backward_graph
    vjps = [n.attrs["of"] for n in backward.nodes if n.op == "torch_vjp"]
    assert vjps.count("scaled_dot_product_attention") == 2  # NOTE: one per layer
    float32_products = [
        n
        for n in backward.nodes
        if n.op == "matmul" and all(v.type.dtype == torch.float32 for v in n.inputs)
    ]
    assert not float32_products
