"""Warm starts without capture (opt-in: ``options={"warm_start": "fingerprint"}``; the default
warm start captures): a captured program saved under a key a new process can compute before it
runs anything.

Capture is the largest cost a warm start has left once the compiled artifact loads from the
cache: the artifact's key is made of what capture mints (the semantic hash and the guards). A
*snapshot* entry keeps the captured program itself (:mod:`plait.snapshots.snapshot`) under a
*front key* made of what is known before capture:

- ``callable``: the module tree (classes with their bases, attributes and methods by name, every
  attribute of every submodule, training flags;
  :func:`plait.snapshots.modules.module_fingerprint`) or the function, found again by name;
- ``inputs`` and ``state``: the call's structure, its tensors' dtype, shape, device and
  requires_grad (and class, for a subclass), its other arguments' values, and the same for
  parameters and buffers with every path that holds each (tied weights);
- ``mode``: grad mode, default dtype, autocast; ``request``: backend, fullgraph, dynamic and
  options as requested; ``toolchain``: Python, PyTorch, plait (version and code digest), NumPy,
  SymPy, mpmath.

A snapshot is used only when, in this process, every function the capture ran (recorded at
capture, PyTorch's and the standard library's own excepted) is found again by name with the same
digest (:mod:`plait.snapshots.fingerprint`: bytecode, defaults, the values it reads), every set
the capture's code could have iterated (one held under a name that code read) iterates in the
order it did at capture (:mod:`plait.snapshots.set_order`: the front key and the digests
describe sets in sorted order, so that a set of strings does not make each hash seed a key of
its own), and the guards
rebuilt from the saved plan and this call write the same key texts as capture's and hold. The
program then goes through the artifact cache as a captured one would (same full key: a hit loads
the compiled artifact). Anything else (no snapshot, a changed function, a program that could not
be pinned down, a document this plait cannot read) captures, and the manifest's
``cache.capture`` says which and why.

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

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from plait.cache import code_identity
from plait.cache.key import canonical_json, text_digest
from plait.cache.lookup import warn_at_caller
from plait.cache.store import CorruptEntryError, Store
from plait.errors import StoreFormatError
from plait.frontend import CapturedProgram, ModuleState
from plait.frontend.guard_build import autocast_state
from plait.snapshots import set_order
from plait.snapshots.deps import CodeDep
from plait.snapshots.fingerprint import Unpinnable, dep_digest, fingerprint
from plait.snapshots.modules import module_fingerprint
from plait.snapshots.set_order import SetOrder
from plait.snapshots.snapshot import encode, program_doc, program_from_doc

# NOTE: /2: the front key's parts are kept as their canonical JSON text (compared as text);
# /3: sets in sorted order, with the orders of those the capture could iterate beside
FORMAT = "plait.snapshot/3"


class FrontParts(dict[str, Any]):
    """The front key's parts, and (``orders``, not part of the key) the iteration orders of
    the sets they describe in sorted order."""

    orders: list[SetOrder]


_PLAIN_TENSORS = (torch.Tensor, nn.Parameter)


def _tensor_sig(t: torch.Tensor) -> list[Any]:
    sig = [str(t.dtype), list(t.shape), str(t.device), bool(t.requires_grad)]
    if type(t) not in _PLAIN_TENSORS:
        sig.append(f"{type(t).__module__}.{type(t).__qualname__}")  # NOTE: a tensor subclass
    return sig


def _state_part(ms: ModuleState) -> list[Any]:
    """Each parameter and buffer: every path that holds it (a tied weight and what it is tied
    to), its kind and signature."""
    prefix = {id(m): p for p, m in ms.modules}
    out = []
    for e, t in zip(ms.entries, ms.fetch()):
        paths = [f"{prefix[id(m)]}.{a}" if prefix[id(m)] else a for m, a in e.slots]
        out.append([paths, e.kind, *_tensor_sig(t)])
    return out


def front_parts(
    fn: Any,
    spec: Any,
    leaves: Sequence[Any],
    request: Mapping[str, Any],
    ms: ModuleState | None = None,
) -> dict[str, Any]:
    """The front key's parts for calling ``fn`` with ``(spec, leaves)``; raises
    :class:`Unpinnable` for what cannot be described without capture. ``ms``: the module's
    state as the caller already holds it (one is made when None)."""
    try:
        with set_order.collecting() as orders:
            parts = FrontParts(_front_parts(fn, spec, leaves, request, ms))
        parts.orders = orders
        return parts
    except Unpinnable:
        raise
    except Exception as exc:  # NOTE: never fail a call over what a warm start could skip
        raise Unpinnable(f"the front key could not be made ({type(exc).__name__}: {exc})") from None


def _front_parts(
    fn: Any,
    spec: Any,
    leaves: Sequence[Any],
    request: Mapping[str, Any],
    ms: ModuleState | None,
) -> dict[str, Any]:
    if isinstance(fn, nn.Module):
        ms = ms if ms is not None and ms.module is fn else ModuleState(fn)
        callable_: dict[str, Any] = {
            "modules": module_fingerprint(fn),
            "training": list(ms.training_flags()),
        }
        state = _state_part(ms)
    else:
        name = getattr(fn, "__qualname__", None)
        if not callable(fn) or name is None or "<" in name:
            raise Unpinnable(f"a {type(fn).__name__} callable has no name to find it again by")
        # NOTE: found again by name, and not a method bound to an object whose state it reads
        callable_ = {"function": fingerprint(fn, "the compiled callable")}
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
            "autocast": list(autocast_state()),
        },
        "request": json.loads(json.dumps(dict(request), sort_keys=True, default=_refuse)),
        "toolchain": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "plait": sys.modules["plait"].__version__,
            "plait_code": code_identity.plait_code_digest(),  # NOTE: capture's own code
            # NOTE: their code is not recorded either (plait.snapshots.deps): their versions pin it
            **{
                name: str(getattr(sys.modules.get(name), "__version__", None))
                for name in ("numpy", "sympy", "mpmath")
            },
        },
    }


def _refuse(obj: Any) -> Any:
    raise Unpinnable(f"an option of type {type(obj).__name__} has no JSON form")


def save_snapshot(
    store: Store,
    parts: Mapping[str, Any],
    prog: CapturedProgram,
    deps: Sequence[CodeDep],
    artifact: str | None = None,
    read: frozenset[str] | None = None,
) -> str:
    """Publish ``prog`` under the front key ``parts``; returns the key. ``artifact``: the key
    of the artifact entry this call compiled to (a hint: a warm start reads it ahead while the
    program loads; the artifact key computed from the loaded program decides). ``read``: the
    names the capture's code read (the sets held under one of them keep their order; None:
    every set does). Raises :class:`Unpinnable` for a program that has no saved form."""
    front = canonical_json(dict(parts))
    orders = getattr(parts, "orders", None)
    if orders is None:
        raise Unpinnable("the front key's set orders are unknown (its parts are not FrontParts)")
    doc = {
        "format": FORMAT,
        "front": front,
        "orders": set_order.to_doc(orders, read),
        "deps": [[d.module, d.qualname, d.digest, set_order.to_doc(d.orders, read)] for d in deps],
        "program": program_doc(prog),
        "artifact": artifact,
    }
    key = text_digest(front)
    try:
        payload = json.dumps(doc, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise Unpinnable(f"the snapshot has no JSON form ({exc})") from None
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
    front = canonical_json(dict(parts))
    key = text_digest(front)
    try:
        payload = store.get(key)
    except CorruptEntryError as exc:  # NOTE: damaged, or stored under another key: warned
        warn_at_caller(f"plait cache: {exc}; captured again")
        return None, f"captured: {exc}"
    except OSError as exc:  # NOTE: warned once, by the artifact lookup of the same store
        return None, f"captured: cache unavailable ({exc})"
    if payload is None:
        return None, "captured: no snapshot for this front key"
    try:
        doc = json.loads(bytes(payload))
        if not isinstance(doc, dict):
            raise StoreFormatError("not a snapshot document")
        if doc.get("format") != FORMAT or doc.get("front") != front:
            raise Unpinnable("the snapshot was saved for another front key")
        changed = set_order.changed(doc["orders"], getattr(parts, "orders", []))
        if changed is not None:
            raise Unpinnable(changed)
        for module, qualname, digest, orders in doc["deps"]:
            _check_dep(module, qualname, digest, orders)
        if isinstance(doc.get("artifact"), str):
            store.read_ahead(doc["artifact"])  # NOTE: its hash is checked while this loads
        prog = program_from_doc(doc["program"], spec, leaves, paths, ms, state)
        prog.snapshot_key = key
    except Unpinnable as exc:
        return None, f"captured: {exc}"
    except Exception as exc:  # NOTE: a document this plait cannot read: replaced by capture
        with contextlib.suppress(OSError):
            store.delete(key)
        return None, f"captured: the snapshot did not load ({type(exc).__name__}: {exc})"
    return prog, f"snapshot {key[:16]}…"


def forget_snapshot(store: Store | None, key: str | None) -> None:
    """Remove the snapshot under ``key`` (one that turned out unreadable); never raises."""
    if store is not None and key is not None:
        with contextlib.suppress(OSError):
            store.delete(key)


def _check_dep(module: str, qualname: str, digest: str, orders: Any) -> None:
    try:
        now, now_orders = dep_digest(module, qualname)
    except Unpinnable as exc:
        text = str(exc)
        if not text.startswith(f"{module}.{qualname}"):
            text = f"{module}.{qualname} cannot be checked now: {text}"
        raise Unpinnable(text) from None
    except Exception as exc:  # NOTE: user code ran while finding it (a property, __getattr__)
        raise Unpinnable(
            f"{module}.{qualname} could not be checked ({type(exc).__name__}: {exc})"
        ) from None
    if now != digest:
        raise Unpinnable(f"{module}.{qualname} changed since the capture")
    changed = set_order.changed(orders, now_orders)
    if changed is not None:
        raise Unpinnable(f"{module}.{qualname} reads {changed}")
