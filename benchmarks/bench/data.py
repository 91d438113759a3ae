"""The image set and the model with its fixed weights.

Images: scikit-learn's ``digits`` (1797 grayscale 8x8 images of handwritten digits, 10 classes,
shipped inside the scikit-learn package: nothing is downloaded), in the order the package ships
them. Each image is scaled to [0, 1], upsampled bilinearly to the requested size, replicated to
three channels and standardised with the whole set's mean and standard deviation. Where
scikit-learn is missing (or ``data="synthetic"``), a deterministic synthetic set takes its place:
8x8 images drawn from a seeded generator, through the same pipeline.

Weights: a seeded initialization (the model's own: Kaiming for convolutions), BatchNorm affine
parameters drawn from a seeded generator, and running statistics calibrated on the first
images of the set (cumulative average over two training-mode batches). The classifier is untrained,
so its accuracy is chance and means nothing; parity is still meaningful: the logits are a fixed,
non-trivial function of the weights and the image, and every BatchNorm has non-trivial statistics
for BN folding to fold.

Example:
    >>> data = load_images(16, "digits")
    >>> x, y = data.batch(0, 4)
    >>> tuple(x.shape), y.tolist()
    ((4, 3, 16, 16), [0, 1, 2, 3])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.resnet import resnet18, resnet50

NUM_CLASSES = 10
CALIBRATION_BATCHES = 2
CALIBRATION_SIZE = 16


@dataclass
class ImageSet:
    """Small images (N, 1, 8, 8) in [0, 1], upsampled on demand; batches in a fixed order."""

    name: str
    source: str
    small: torch.Tensor
    labels: torch.Tensor
    image_size: int
    mean: float
    std: float
    _cache: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return int(self.small.shape[0])

    def images(self, indices: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(
            self.small[indices], size=(self.image_size,) * 2, mode="bilinear", align_corners=False
        )
        return ((x - self.mean) / self.std).expand(-1, 3, -1, -1).contiguous()

    def batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of ``size`` images: images ``index*size ...`` in set order, cycling."""
        idx = torch.arange(index * size, (index + 1) * size) % len(self)
        key = (index, size)
        if key not in self._cache:
            self._cache[key] = self.images(idx)
        return self._cache[key], self.labels[idx]

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "images": len(self),
            "classes": NUM_CLASSES,
            "image_size": self.image_size,
            "preprocessing": "x/16 -> bilinear upsample 8x8 -> size x size -> standardise "
            f"(mean {self.mean:.6f}, std {self.std:.6f}) -> 3 channels",
            "order": "as shipped, batches taken consecutively, cycling",
        }


def _digits() -> tuple[torch.Tensor, torch.Tensor, str]:
    import sklearn
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    return images, labels, f"sklearn.datasets.load_digits (scikit-learn {sklearn.__version__})"


def _synthetic(seed: int = 1234, n: int = 1797) -> tuple[torch.Tensor, torch.Tensor, str]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 8, 8, generator=gen)
    labels = torch.arange(n) % NUM_CLASSES
    return images, labels, f"deterministic synthetic 8x8 images (torch.Generator seed {seed})"


def load_images(image_size: int, data: str = "digits") -> ImageSet:
    """The benchmark's image set at ``image_size``; ``data`` is ``digits`` or ``synthetic``
    (``digits`` falls back to ``synthetic`` when scikit-learn is not installed)."""
    name = data
    if data == "digits":
        try:
            images, labels, source = _digits()
        except ImportError:
            name = "synthetic"
            images, labels, source = _synthetic()
            source += " (scikit-learn is not installed: digits unavailable)"
    elif data == "synthetic":
        images, labels, source = _synthetic()
    else:
        raise ValueError(f"data {data!r}: choose digits or synthetic")
    small = images.unsqueeze(1)
    up = F.interpolate(small, size=(image_size,) * 2, mode="bilinear", align_corners=False)
    mean, std = float(up.mean()), float(up.std())
    return ImageSet(name, source, small, labels, image_size, mean, std)


def build_model(name: str, seed: int, data: ImageSet) -> nn.Module:
    """The benchmark's model in eval mode, with fixed weights (see the module docstring)."""
    torch.manual_seed(seed)
    model = {"resnet18": resnet18, "resnet50": resnet50}[name](num_classes=NUM_CLASSES)
    gen = torch.Generator().manual_seed(seed + 1)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in bns:
            bn.weight.uniform_(0.5, 1.5, generator=gen)
            bn.bias.normal_(0.0, 0.1, generator=gen)
        model.train()
        momenta = [bn.momentum for bn in bns]
        for bn in bns:
            bn.momentum = None  # NOTE: cumulative average: the statistics of the batches seen.
        for i in range(CALIBRATION_BATCHES):
            model(data.batch(i, CALIBRATION_SIZE)[0])
        for bn, momentum in zip(bns, momenta):
            bn.momentum = momentum
    return model.eval()


def weights_record(name: str, seed: int) -> dict[str, Any]:
    return {
        "model": name,
        "init": f"seeded (torch.manual_seed({seed})): Kaiming-normal convolutions, default "
        f"linear; BatchNorm weight ~ U(0.5, 1.5), bias ~ N(0, 0.1) (generator seed {seed + 1})",
        "bn_calibration": f"running statistics from {CALIBRATION_BATCHES} training-mode batches "
        f"of {CALIBRATION_SIZE} images (the set's first), cumulative average",
        "trained": False,
        "note": "untrained: accuracy is chance and is not reported; parity is meaningful "
        "(fixed non-trivial logits, non-trivial BatchNorm statistics)",
    }
