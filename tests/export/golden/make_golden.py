"""Write the golden artifacts of the current export format version (run once per released
version; the files are checked in and every later plait must load and verify them):

    PYTHONPATH=src:. python -m tests.export.golden.make_golden

Small programs, no native kernels (a library is machine code for one toolchain), so each file
is a few KB.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

import plait
from plait.errors import ExportWarning
from plait.export import VERSION

HERE = Path(__file__).parent


def _function(x: torch.Tensor, *, scale: float = 0.5) -> dict[str, object]:
    return {"y": torch.tanh(x) * scale, "total": x.sum(dim=-1), "rows": 3}


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3)).eval()
    programs = {
        "mlp": (mlp, (torch.randn(2, 4, generator=gen),), {}, {}),
        "function": (_function, (torch.randn(3, 5, generator=gen),), {"scale": 2.0}, {}),
        "dynamic": (mlp, (torch.randn(5, 4, generator=gen),), {}, {"dynamic": True}),
    }
    expected = {}
    for name, (fn, args, kwargs, options) in programs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExportWarning)
            artifact = plait.export(fn, args, kwargs, native=False, **options)
        path = artifact.save(HERE / f"{name}-v{VERSION}.plait")
        expected[path.name] = {
            "format_version": VERSION,
            "semantic_hash": artifact.semantic_hash,
            "digest": artifact.digest,
            "bytes": path.stat().st_size,
        }
    (HERE / f"expected-v{VERSION}.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
