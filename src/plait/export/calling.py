"""The calling convention of an exported program, as JSON: how a call's arguments become the
program's inputs and how its outputs come back, with no Python object of the model's code.

What a call passes is bound to the exported signature (parameter names and kinds; defaults that
are plain values), flattened to leaves (tuples, lists and dicts with string or integer keys
hold them; every leaf is a tensor or a plain value: ``None``, a bool, int, float, string, dtype
or device) and checked against the guards. The program's inputs are, each, a leaf of the call or
a weight of the artifact; its outputs are rebuilt into the exported structure.

Example:
    >>> spec = ("tuple", 2, (("*",), ("dict", dict, ("a",), (("*",),))))
    >>> spec_from_json(spec_to_json(spec, "out")) == spec
    True
    >>> decode_value(encode_value(0.1, "x"), "x"), decode_value(encode_value(None, "x"), "x")
    (0.1, None)
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.errors import ArtifactFormatError, CompiledInputError, ExportError
from plait.frontend import pytree

_KINDS = {
    "positional_only": inspect.Parameter.POSITIONAL_ONLY,
    "positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "var_positional": inspect.Parameter.VAR_POSITIONAL,
    "keyword_only": inspect.Parameter.KEYWORD_ONLY,
    "var_keyword": inspect.Parameter.VAR_KEYWORD,
}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_MAX_DEPTH = 64


# --- plain values --------------------------------------------------------------------------------
def encode_value(x: Any, where: str) -> Any:
    """A plain value as JSON (floats by their hex text: exact, and NaN and infinities too);
    raises :class:`ExportError` for anything else."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return {"int": str(x)}
    if isinstance(x, float):
        return {"float": x.hex()}
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).removeprefix("torch.")}
    if isinstance(x, torch.device):
        return {"device": str(x)}
    raise ExportError(
        f"{where} is a {type(x).__name__}: an exported program takes and returns tensors and "
        "plain values (None, bool, int, float, str, dtype, device) in tuples, lists and dicts"
    )


def decode_value(j: Any, where: str) -> Any:
    if j is None or isinstance(j, (bool, str)):
        return j
    if isinstance(j, dict) and len(j) == 1:
        ((tag, body),) = j.items()
        if isinstance(body, str):
            try:
                if tag == "int":
                    return int(body)
                if tag == "float":
                    return float.fromhex(body)
                if tag == "dtype":
                    dtype = getattr(torch, body, None)
                    if isinstance(dtype, torch.dtype):
                        return dtype
                if tag == "device":
                    return torch.device(body)
            except (ValueError, RuntimeError, OverflowError):
                pass
    raise ArtifactFormatError(f"calling.json: {where}: {j!r} is not an encoded plain value")


# --- structures ----------------------------------------------------------------------------------
def spec_to_json(spec: Any, where: str) -> Any:
    """A pytree spec of tuples, lists and plain dicts as JSON; raises :class:`ExportError` for
    another container (a dataclass, a namedtuple: the model's own types)."""
    tag = spec[0]
    if tag == "*":
        return "*"
    if tag in ("tuple", "list"):
        return {tag: [spec_to_json(s, f"{where}[{i}]") for i, s in enumerate(spec[2])]}
    if tag == "dict" and spec[1] is dict:
        keys = spec[2]
        if not all(isinstance(k, str) or type(k) is int for k in keys):
            raise ExportError(f"{where}: a dict with keys that are not strings or integers")
        return {"dict": [[k, spec_to_json(s, f"{where}[{k!r}]")] for k, s in zip(keys, spec[3])]}
    kind = getattr(spec[1], "__qualname__", tag) if len(spec) > 1 else tag
    raise ExportError(
        f"{where} is a {kind}: an exported program's arguments and results are tensors and plain "
        "values in tuples, lists and dicts (its own types need its code to rebuild)"
    )


def spec_from_json(j: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise ArtifactFormatError("calling.json: a structure nested too deep")
    if j == "*":
        return pytree.LEAF
    if isinstance(j, dict) and len(j) == 1:
        ((tag, body),) = j.items()
        if tag in ("tuple", "list") and isinstance(body, list):
            kids = tuple(spec_from_json(s, depth + 1) for s in body)
            return (tag, len(kids), kids)
        if tag == "dict" and isinstance(body, list):
            pairs = [p for p in body if isinstance(p, list) and len(p) == 2]
            keys = tuple(k for k, _ in pairs)
            if len(pairs) != len(body) or not all(isinstance(k, (str, int)) for k in keys):
                raise ArtifactFormatError("calling.json: a dict entry is not [key, structure]")
            return ("dict", dict, keys, tuple(spec_from_json(s, depth + 1) for _, s in pairs))
    raise ArtifactFormatError(f"calling.json: {str(j)[:80]!r} is not a structure")


def count_leaves(spec: Any) -> int:
    if spec == pytree.LEAF:
        return 1
    return sum(count_leaves(k) for k in spec[-1])


# --- the signature -------------------------------------------------------------------------------
def signature_to_json(signature: inspect.Signature | None, defaults: bool) -> dict[str, Any]:
    """The signature a call binds to: each parameter's name, kind and (where it is a plain
    value) default. ``None`` (a callable without one) binds ``*args, **kwargs``."""
    if signature is None:
        params = [{"name": "args", "kind": "var_positional"}]
        params.append({"name": "kwargs", "kind": "var_keyword"})
        return {"parameters": params, "apply_defaults": False, "raw": True}
    out = []
    for p in signature.parameters.values():
        entry: dict[str, Any] = {"name": p.name, "kind": _KIND_NAMES[p.kind]}
        if p.default is not inspect.Parameter.empty:
            # NOTE: a default that is no plain value is not recorded: a loaded call passes it
            with contextlib.suppress(ExportError):
                entry["default"] = encode_value(p.default, f"the default of {p.name}")
        out.append(entry)
    return {"parameters": out, "apply_defaults": defaults, "raw": False}


@dataclass
class Binder:
    """Binds a loaded call's arguments as the exported callable's signature did, and flattens
    them as capture did: ``flatten(args, kwargs) -> (spec, leaves, paths)``."""

    signature: inspect.Signature
    apply_defaults: bool
    raw: bool
    name: str

    @classmethod
    def from_json(cls, doc: Any, name: str) -> Binder:
        try:
            params = []
            for entry in doc["parameters"]:
                kind = _KINDS[entry["kind"]]
                default = inspect.Parameter.empty
                if "default" in entry:
                    default = decode_value(entry["default"], f"default of {entry['name']}")
                params.append(inspect.Parameter(entry["name"], kind, default=default))
            signature = inspect.Signature(params)
            return cls(signature, bool(doc["apply_defaults"]), bool(doc["raw"]), name)
        except ArtifactFormatError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactFormatError(
                f"calling.json: the signature is malformed ({exc!r})"
            ) from None

    def arguments(self, named: dict[str, Any]) -> tuple[tuple, dict]:
        """Bound arguments (by name, in signature order) back into ``(args, kwargs)``."""
        if self.raw:
            return tuple(named.get("args", ())), dict(named.get("kwargs", {}))
        bound = inspect.BoundArguments(self.signature, dict(named))
        return tuple(bound.args), dict(bound.kwargs)

    def flatten(self, args: tuple, kwargs: dict) -> tuple[Any, list[Any], list[str]]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise CompiledInputError(f"{self.name}(): {exc}") from None
        if self.apply_defaults:
            bound.apply_defaults()
        named = dict(bound.arguments)
        if self.raw:
            named = {"args": tuple(named.get("args", ())), "kwargs": dict(named.get("kwargs", {}))}
        specs: list[Any] = []
        leaves: list[Any] = []
        paths: list[str] = []
        for name, value in named.items():
            spec, ls, ps = pytree.flatten(value, name)
            specs.append((name, spec))
            leaves += ls
            paths += ps
        return tuple(specs), leaves, paths


def call_spec_to_json(spec: Any) -> list[Any]:
    """The bound call's spec (``((name, structure), ...)``) as JSON."""
    return [[name, spec_to_json(sub, name)] for name, sub in spec]


def call_spec_from_json(j: Any) -> tuple[Any, ...]:
    if not isinstance(j, list) or not all(isinstance(p, list) and len(p) == 2 for p in j):
        raise ArtifactFormatError("calling.json: the call's structure is not [[name, spec], ...]")
    if not all(isinstance(name, str) for name, _ in j):
        raise ArtifactFormatError("calling.json: an argument name is not a string")
    return tuple((name, spec_from_json(sub)) for name, sub in j)


# --- leaves --------------------------------------------------------------------------------------
def leaves_to_json(leaves: Sequence[Any], paths: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, torch.Tensor):
            out.append({"path": path, "kind": "tensor"})
        else:
            out.append({"path": path, "kind": "value", "value": encode_value(leaf, path)})
    return out


def leaves_from_json(j: Any) -> list[dict[str, Any]]:
    if not isinstance(j, list):
        raise ArtifactFormatError("calling.json: 'leaves' is not a list")
    out = []
    for entry in j:
        ok = isinstance(entry, dict) and isinstance(entry.get("path"), str)
        if not ok or entry.get("kind") not in ("tensor", "value"):
            raise ArtifactFormatError(f"calling.json: leaf {str(entry)[:80]!r} is malformed")
        if entry["kind"] == "value":
            entry = {**entry, "value": decode_value(entry.get("value"), entry["path"])}
        out.append(entry)
    return out
