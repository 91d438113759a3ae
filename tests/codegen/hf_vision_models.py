"""Hugging Face vision models built from small configs with random weights (32x32 images): what
several test files compile and check against eager."""

from __future__ import annotations

from typing import Any

import transformers


def mobilenet_v2() -> Any:
    cfg = transformers.MobileNetV2Config(depth_multiplier=0.25, image_size=32)
    return transformers.MobileNetV2Model(cfg)


def efficientnet() -> Any:
    cfg = transformers.EfficientNetConfig(
        width_coefficient=0.25, depth_coefficient=0.25, image_size=32, hidden_dim=320
    )
    return transformers.EfficientNetModel(cfg)
