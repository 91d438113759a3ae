"""The artifact payload: a JSON document and named tensors in one safetensors file.

What a warm start needs to skip the passes, the planner's dry runs and the C++ compiler: the
optimized graph (IR text), its constants (frozen and folded weights), the backend's saved plan
and the manifest. It is one safetensors file (``{name: tensor}`` plus a ``plait`` metadata string
holding the JSON document), so loading never unpickles and never runs code from the file.

Example:
    >>> import torch
    >>> data = pack({"graph": "graph() { return }"}, {"w": torch.ones(2)})
    >>> doc, tensors = unpack(data)
    >>> doc["graph"], tensors["w"].tolist()
    ('graph() { return }', [1.0, 1.0])
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load as _load
from safetensors.torch import save as _save

FORMAT = "plait.artifact/1"


def pack(doc: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``doc`` (JSON) and ``tensors`` as safetensors bytes."""
    plain: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in sorted(tensors.items()):
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.storage_offset() or t.untyped_storage().nbytes() != t.nbytes:
            t = t.clone()  # NOTE: safetensors refuses tensors that share or slice a storage
        seen.add(t.untyped_storage().data_ptr())
        plain[name] = t
    meta = {"format": FORMAT, "plait": json.dumps(dict(doc), sort_keys=True)}
    return _save(plain, metadata=meta)


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(doc, tensors)``; raises ``ValueError`` for anything that is not such an artifact."""
    try:
        tensors = _load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"not a safetensors artifact: {exc}") from None
    meta = header.get("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise ValueError(f"artifact format {meta.get('format')!r}, expected {FORMAT!r}")
    return json.loads(meta["plait"]), tensors
