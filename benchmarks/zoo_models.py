"""The model zoo: models nobody on the project wrote, built from configs with random weights.

Every entry builds an ``nn.Module`` that takes one tensor (images or token ids) and returns one
tensor (logits or the last hidden state), and the example input it is measured on. Nothing is
downloaded: Hugging Face ``transformers`` models are built from their config classes, torchvision
and timm models with ``weights=None`` / ``pretrained=False``. Where the installed torchvision does
not import (the CPU machines' PyPI torchvision is a CUDA build that fails beside torch+cpu),
torchvision's pure-Python model definitions are used (:mod:`benchmarks.model_sources`; timm needs
them too). A source that is still missing makes its entries *skipped*, with the stated reason.

Each entry has two sizes: the full one (base sizes: ResNet-50, ViT-B/16, BERT-base, GPT-2 small,
...; batch 1, 224x224 images, 64 tokens) and a tiny one for ``--quick`` (CI smoke tests).

Example:
    >>> [m.name for m in MODELS][:3]
    ['hf-resnet50', 'hf-convnext-tiny', 'hf-vit-base']
    >>> build(entry("hf-bert-base"), quick=True, seed=0).example.dtype
    torch.int64
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks import model_sources

FULL_IMAGE, QUICK_IMAGE = 224, 32
FULL_TOKENS, QUICK_TOKENS = 64, 8
QUICK_VOCAB = 128
SOURCES = ("transformers", "torchvision", "timm")
IMPORT_CHECK_TIMEOUT_S = 120.0


class Selected(nn.Module):
    """The model called on one positional tensor, reduced to one output tensor: the attribute
    ``key`` of a Hugging Face ``ModelOutput``, or the result itself when ``key`` is None."""

    def __init__(self, model: nn.Module, key: str | None) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        return out if self.key is None else getattr(out, self.key)


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry. ``make(quick)`` returns the module (random weights) and, for text models,
    its vocabulary size (token ids are drawn below it)."""

    name: str
    family: str  # vision | text
    source: str  # transformers | torchvision | timm
    what: str  # the full size, in words
    make: Callable[[bool], tuple[nn.Module, int | None]]
    image_size: int | None = None  # full-size image side, when not FULL_IMAGE

    def input_desc(self, quick: bool) -> str:
        if self.family == "text":
            return f"1x{QUICK_TOKENS if quick else FULL_TOKENS} token ids"
        side = QUICK_IMAGE if quick else (self.image_size or FULL_IMAGE)
        return f"1x3x{side}x{side} image"


@dataclass
class Built:
    module: nn.Module
    example: torch.Tensor
    parameters: int


# --- Hugging Face transformers (configs; random weights) -----------------------------------------
def _hf(config: str, model: str, key: str | None, full: dict[str, Any], tiny: dict[str, Any]):
    def make(quick: bool) -> tuple[nn.Module, int | None]:
        import transformers

        cfg = getattr(transformers, config)(**(tiny if quick else full))
        module = getattr(transformers, model)(cfg)
        return Selected(module, key), getattr(cfg, "vocab_size", None)

    return make


_TINY_TEXT = {"vocab_size": QUICK_VOCAB}
_VISION_HEAD = {"num_labels": 10}

HF_MODELS = [
    ZooModel("hf-resnet50", "vision", "transformers", "ResNet-50 (ResNetConfig defaults)",
             _hf("ResNetConfig", "ResNetForImageClassification", "logits", {},
                 {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
                  **_VISION_HEAD})),
    ZooModel("hf-convnext-tiny", "vision", "transformers", "ConvNeXt-T (ConvNextConfig defaults)",
             _hf("ConvNextConfig", "ConvNextForImageClassification", "logits", {},
                 {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2,
                  **_VISION_HEAD})),
    ZooModel("hf-vit-base", "vision", "transformers", "ViT-B/16 (ViTConfig defaults)",
             _hf("ViTConfig", "ViTForImageClassification", "logits", {},
                 {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 64, "image_size": QUICK_IMAGE, "patch_size": 8,
                  **_VISION_HEAD})),
    ZooModel("hf-mobilenet-v2", "vision", "transformers", "MobileNetV2 1.0 (defaults)",
             _hf("MobileNetV2Config", "MobileNetV2ForImageClassification", "logits", {},
                 {"depth_multiplier": 0.25, "image_size": QUICK_IMAGE, **_VISION_HEAD})),
    ZooModel("hf-efficientnet-b0", "vision", "transformers", "EfficientNet-B0",
             _hf("EfficientNetConfig", "EfficientNetForImageClassification", "logits",
                 {"width_coefficient": 1.0, "depth_coefficient": 1.0, "image_size": FULL_IMAGE,
                  "hidden_dim": 1280},
                 {"width_coefficient": 0.25, "depth_coefficient": 0.25,
                  "image_size": QUICK_IMAGE, "hidden_dim": 320, **_VISION_HEAD})),
    ZooModel("hf-regnet-y-040", "vision", "transformers", "RegNetY-4.0GF (RegNetConfig defaults)",
             _hf("RegNetConfig", "RegNetForImageClassification", "logits", {},
                 {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1],
                  "groups_width": 8, **_VISION_HEAD})),
    ZooModel("hf-swin-tiny", "vision", "transformers", "Swin-T (SwinConfig defaults)",
             _hf("SwinConfig", "SwinForImageClassification", "logits", {},
                 {"image_size": QUICK_IMAGE, "patch_size": 4, "embed_dim": 16,
                  "depths": [1, 1], "num_heads": [2, 2], "window_size": 4, **_VISION_HEAD})),
    ZooModel("hf-bert-base", "text", "transformers", "BERT-base (BertConfig defaults)",
             _hf("BertConfig", "BertModel", "last_hidden_state", {},
                 {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 64, **_TINY_TEXT})),
    ZooModel("hf-gpt2", "text", "transformers", "GPT-2 small, LM head (GPT2Config defaults)",
             _hf("GPT2Config", "GPT2LMHeadModel", "logits", {},
                 {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
                  "bos_token_id": 0, "eos_token_id": 0, **_TINY_TEXT})),
    ZooModel("hf-distilbert-base", "text", "transformers", "DistilBERT-base (defaults)",
             _hf("DistilBertConfig", "DistilBertModel", "last_hidden_state", {},
                 {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, **_TINY_TEXT})),
    ZooModel("hf-t5-small-encoder", "text", "transformers", "T5-small encoder (T5Config defaults)",
             _hf("T5Config", "T5EncoderModel", "last_hidden_state", {},
                 {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
                  **_TINY_TEXT})),
    ZooModel("hf-llama-small", "text", "transformers",
             "Llama-style decoder, 8 layers, hidden 512, 8 heads / 4 KV heads, vocab 32000",
             _hf("LlamaConfig", "LlamaForCausalLM", "logits",
                 {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "intermediate_size": 1408, "vocab_size": 32000,
                  "max_position_embeddings": 512},
                 {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "intermediate_size": 64,
                  "max_position_embeddings": 64, **_TINY_TEXT})),
]  # fmt: skip


# --- torchvision and timm (used where they import; the GPU machine has them) ----------------------
def _torchvision(
    name: str, tiny: str, **tiny_kwargs: Any
) -> Callable[[bool], tuple[nn.Module, int | None]]:
    def make(quick: bool) -> tuple[nn.Module, int | None]:
        model_sources.use_torchvision()
        models = importlib.import_module("torchvision.models")
        if quick:
            return models.get_model(tiny, weights=None, **tiny_kwargs), None
        return models.get_model(name, weights=None), None

    return make


def _timm(name: str, tiny: str) -> Callable[[bool], tuple[nn.Module, int | None]]:
    def make(quick: bool) -> tuple[nn.Module, int | None]:
        model_sources.use_torchvision()
        timm = importlib.import_module("timm")
        return timm.create_model(tiny if quick else name, pretrained=False), None

    return make


OTHER_MODELS = [
    ZooModel("tv-resnet50", "vision", "torchvision", "ResNet-50",
             _torchvision("resnet50", "resnet18")),
    ZooModel("tv-mobilenet-v3-large", "vision", "torchvision", "MobileNetV3-Large",
             _torchvision("mobilenet_v3_large", "mobilenet_v3_small")),
    ZooModel("tv-efficientnet-b0", "vision", "torchvision", "EfficientNet-B0",
             _torchvision("efficientnet_b0", "efficientnet_b0")),
    ZooModel("tv-convnext-tiny", "vision", "torchvision", "ConvNeXt-T",
             _torchvision("convnext_tiny", "convnext_tiny")),
    ZooModel("tv-vit-b-16", "vision", "torchvision", "ViT-B/16",
             _torchvision("vit_b_16", "vit_b_16", image_size=QUICK_IMAGE)),
    ZooModel("timm-resnet50", "vision", "timm", "ResNet-50 (timm)", _timm("resnet50", "resnet18")),
    ZooModel("timm-vit-small", "vision", "timm", "ViT-S/16 (timm)",
             _timm("vit_small_patch16_224", "test_vit")),
    ZooModel("timm-efficientnet-b0", "vision", "timm", "EfficientNet-B0 (timm)",
             _timm("efficientnet_b0", "test_efficientnet")),
]  # fmt: skip

MODELS = HF_MODELS + OTHER_MODELS
# NOTE: the tiny models the quick preset runs by default (the others stay selectable).
QUICK_DEFAULT = ("hf-resnet50", "hf-vit-base", "hf-bert-base", "hf-gpt2")


def entry(name: str) -> ZooModel:
    for m in MODELS:
        if m.name == name:
            return m
    raise ValueError(f"unknown zoo model {name!r}; known: {[m.name for m in MODELS]}")


@functools.cache
def source_problem(source: str) -> str | None:
    """Why ``source`` cannot be used here, or None. A package that is installed is first
    imported in a child process: a broken build (a CUDA torchvision beside torch+cpu) must not
    leave half-registered operators in this one."""
    if source not in SOURCES:
        return f"unknown source {source!r}"
    if source == "transformers":
        return None if importlib.util.find_spec(source) else "transformers is not installed"
    if model_sources.use_torchvision() is None:
        return (
            "torchvision does not import here and its model definitions were not fetched "
            "(python -m benchmarks.model_sources fetch)"
        )
    if importlib.util.find_spec(source) is None:
        return f"{source} is not installed"
    try:
        # NOTE: the child imports the source as this process will (torchvision's Python files
        # where the installed torchvision does not import)
        check = (
            "from benchmarks import model_sources; model_sources.use_torchvision(); "
            f"import {source}.models"
        )
        proc = subprocess.run(
            [sys.executable, "-c", check],
            capture_output=True,
            text=True,
            timeout=IMPORT_CHECK_TIMEOUT_S,
            env=dict(os.environ),
            cwd=model_sources.ROOT,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"import {source} could not be checked: {exc}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return f"import {source} fails here: {lines[-1] if lines else proc.returncode}"[:500]
    return None


def _draw_zero_weights(module: nn.Module, seed: int) -> None:
    """Weight matrices a model initializes to zero (torchvision's ViT head) drawn from
    N(0, 0.02): with a zero head every logit is the bias, whatever the network computes, and
    parity on the logits would judge nothing."""
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2 and p.numel() and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.02)


def build(model: ZooModel, *, quick: bool, seed: int, batch: int = 1) -> Built:
    """The module (eval mode, seeded random weights) and its seeded example input."""
    torch.manual_seed(seed)
    module, vocab = model.make(quick)
    module = module.eval()
    _draw_zero_weights(module, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if model.family == "text":
        tokens = QUICK_TOKENS if quick else FULL_TOKENS
        example = torch.randint(0, vocab or QUICK_VOCAB, (batch, tokens), generator=gen)
    else:
        side = QUICK_IMAGE if quick else (model.image_size or FULL_IMAGE)
        example = torch.randn(batch, 3, side, side, generator=gen)
    if model.family == "vision":
        _calibrate_batch_norm(module, example, gen)
    params = sum(p.numel() for p in module.parameters())
    return Built(module, example, params)


def _calibrate_batch_norm(module: nn.Module, example: torch.Tensor, gen: torch.Generator) -> None:
    """BatchNorm with unit scale, zero shift and running statistics measured on random images:
    with their initial values (mean 0, variance 1; Hugging Face's EfficientNet also draws the
    scales near 0) the activations of deep random networks fade (EfficientNet's logits came out
    constant, whatever the input), and parity on an output that does not depend on the input
    would judge nothing."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        if m.affine:
            with torch.no_grad():
                m.weight.fill_(1.0)
                m.bias.zero_()
        m.momentum = None  # NOTE: a cumulative average over the calibration batches
    module.train()
    with torch.no_grad():
        for _ in range(2):
            module(torch.randn((4, *example.shape[1:]), generator=gen, dtype=example.dtype))
    module.eval()
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
