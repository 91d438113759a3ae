"""Warm starts without capture: a captured program saved under a key a new process can compute
before it runs anything.

Capture is the largest cost a warm start has left once the compiled artifact loads from the
cache: the artifact's key is made of what capture mints (the semantic hash and the guards). A
*snapshot* entry keeps the captured program itself (:mod:`plait.frontend.snapshot`) under a
*front key* made of what is known before capture:

- ``callable``: the module tree (classes, every plain attribute of every submodule and class,
  training flags; :func:`plait.frontend.deps.module_fingerprint`) or the function's name;
- ``inputs`` and ``state``: the call's structure, its tensors' dtype, shape, device and
  requires_grad, its other arguments' values, and the same for parameters and buffers;
- ``mode``: grad mode, default dtype, autocast; ``request``: backend, fullgraph, dynamic and
  options as requested; ``toolchain``: Python, PyTorch, plait.

A snapshot is used only when, in this process, every function the capture ran (recorded at
capture, PyTorch's and the standard library's own excepted) is found again by name with the same
bytecode, defaults and module-level values, and the guards rebuilt from the saved plan and this
call write the same key texts as capture's. The program then goes through the artifact cache as
a captured one would (same full key: a hit loads the compiled artifact). Anything else (no
snapshot, a changed function, a program that could not be pinned down) captures, and the
manifest's ``cache.capture`` says which and why.

Example:
    >>> import tempfile, torch
    >>> from plait.cache import LocalStore
    >>> from plait.frontend import InputAdapter
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> lin = torch.nn.Linear(2, 2)
    >>> spec, leaves, paths = InputAdapter(lin).flatten((torch.randn(3, 2),), {})
    >>> parts = front_parts(lin, spec, leaves, {"backend": "stax"})
    >>> sorted(parts)
    ['callable', 'format', 'inputs', 'mode', 'request', 'state', 'toolchain']
    >>> load_snapshot(store, parts, spec, leaves, paths)[1]
    'captured: no snapshot for this front key'
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from plait.cache.key import CacheKey
from plait.cache.store import CorruptEntryError, Store
from plait.frontend import CapturedProgram, ModuleState
from plait.frontend.deps import (
    CodeDep,
    Unpinnable,
    find_function,
    fingerprint,
    function_digest,
    module_fingerprint,
)
from plait.frontend.guard_build import autocast_on
from plait.frontend.snapshot import encode, program_doc, program_from_doc

FORMAT = "plait.snapshot/1"


def _tensor_sig(t: torch.Tensor) -> list[Any]:
    return [str(t.dtype), list(t.shape), str(t.device), bool(t.requires_grad)]


def front_parts(
    fn: Any, spec: Any, leaves: Sequence[Any], request: Mapping[str, Any]
) -> dict[str, Any]:
    """The front key's parts for calling ``fn`` with ``(spec, leaves)``; raises
    :class:`Unpinnable` for what cannot be described without capture."""
    if isinstance(fn, nn.Module):
        ms = ModuleState(fn)
        callable_ = {
            "modules": module_fingerprint(fn),
            "training": list(ms.training_flags()),
        }
        state = [[e.path, e.kind, *_tensor_sig(t)] for e, t in zip(ms.entries, ms.fetch())]
    else:
        name = getattr(fn, "__qualname__", None)
        if not callable(fn) or name is None or "<" in name:
            raise Unpinnable(f"a {type(fn).__name__} callable has no name to find it again by")
        callable_ = {"function": [getattr(fn, "__module__", None), name]}
        state = []
    inputs = [
        _tensor_sig(x) if isinstance(x, torch.Tensor) else fingerprint(x, "an argument")
        for x in leaves
    ]
    return {
        "format": FORMAT,
        "callable": callable_,
        "inputs": {"spec": encode(spec), "leaves": inputs},
        "state": state,
        "mode": {
            "grad": torch.is_grad_enabled(),
            "default_dtype": str(torch.get_default_dtype()),
            "autocast": autocast_on(),
        },
        "request": json.loads(json.dumps(dict(request), sort_keys=True, default=_refuse)),
        "toolchain": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "plait": sys.modules["plait"].__version__,
        },
    }


def _refuse(obj: Any) -> Any:
    raise Unpinnable(f"an option of type {type(obj).__name__} has no JSON form")


def save_snapshot(
    store: Store, parts: Mapping[str, Any], prog: CapturedProgram, deps: Sequence[CodeDep]
) -> str:
    """Publish ``prog`` under the front key ``parts``; returns the key. Raises
    :class:`Unpinnable` for a program that has no saved form."""
    doc = {
        "format": FORMAT,
        "front": dict(parts),
        "deps": [[d.module, d.qualname, d.digest] for d in deps],
        "program": program_doc(prog),
    }
    key = CacheKey(dict(parts)).digest
    payload = json.dumps(doc, sort_keys=True).encode()
    store.put(key, payload, {"kind": "snapshot", "source": prog.semantic_hash})
    return key


def load_snapshot(
    store: Store,
    parts: Mapping[str, Any],
    spec: Any,
    leaves: Sequence[Any],
    paths: Sequence[str],
    ms: ModuleState | None = None,
    state: Sequence[torch.Tensor] = (),
) -> tuple[CapturedProgram | None, str]:
    """The saved program for this front key and call, or None; and what happened, for the
    manifest (``"snapshot <key>"`` or ``"captured: <why>"``)."""
    key = CacheKey(dict(parts)).digest
    try:
        payload = store.get(key)
    except CorruptEntryError as exc:
        return None, f"captured: {exc}"
    except OSError as exc:
        return None, f"captured: cache unavailable ({exc})"
    if payload is None:
        return None, "captured: no snapshot for this front key"
    try:
        doc = json.loads(bytes(payload))
        if doc.get("format") != FORMAT or doc.get("front") != dict(parts):
            raise Unpinnable("the snapshot was saved for another front key")
        for module, qualname, digest in doc["deps"]:
            fn = find_function(module, qualname)
            if fn is None:
                raise Unpinnable(f"{module}.{qualname} is not loaded in this process")
            if function_digest(fn) != digest:
                raise Unpinnable(f"{module}.{qualname} changed since the capture")
        prog = program_from_doc(doc["program"], spec, leaves, paths, ms, state)
    except Unpinnable as exc:
        return None, f"captured: {exc}"
    except (ValueError, KeyError, TypeError) as exc:
        store.delete(key)
        return None, f"captured: the snapshot did not load ({type(exc).__name__}: {exc})"
    return prog, f"snapshot {key[:16]}…"
