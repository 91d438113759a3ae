"""Which input dims a capture makes symbolic: ``dynamic=`` of :func:`plait.capture` and
:func:`plait.compile`.

- ``False`` / ``None``: none (``plait.compile``'s ``None`` is *automatic*: static first, then the
  dims seen changing; the engine passes the mapping below for them);
- ``True``: every user tensor dim;
- a mapping from an input's path (``"x"``, ``"y[0]"``, ``"kw['mask']"``: as capture names the
  arguments) to its dims: ``{"x": {0: "batch", 1: "seq"}}`` names each dim's symbol,
  ``{"x": [0]}`` (or a name ``None``) lets capture name it (``s0``, ``s1``, ...). Dims given the
  same name are the same size: a call where they differ is refused (``InvalidOptionError``
  naming both dims).

Sizes 0 and 1 are never symbolic, whatever the policy: a 1 broadcasts where a larger size does not
(the graph would differ), and 0 empties every loop over it; each gets a specialization of its
own. A symbolic dim is thus always at least 2, and the guards say so.

Example:
    >>> policy = DimPolicy.of({"x": {0: "batch"}, "y": [1]})
    >>> policy.wants("x", 0), policy.wants("x", 1), policy.name("x", 0), policy.name("y", 1)
    (True, False, 'batch', None)
    >>> DimPolicy.of(True).wants("anything", 3)
    True
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.errors import InvalidArgumentTypeError, InvalidOptionError
from plait.symbolic import UNBACKED_RE

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_AUTO = re.compile(r"s\d+\Z")


@dataclass(frozen=True)
class DimPolicy:
    """``every``: all dims; else ``dims``: path -> dim -> the symbol's name (None: automatic).
    ``automatic``: automatic dynamic's policy (:class:`AutomaticDims`): a path the call does not
    pass (an optional argument left out) has no dims to make symbolic, and is no error."""

    every: bool = False
    dims: Mapping[str, Mapping[int, str | None]] = field(default_factory=dict)
    automatic: bool = False

    @classmethod
    def of(cls, dynamic: Any) -> DimPolicy:
        """The policy of a ``dynamic=`` argument; raises ``ValueError``/``TypeError`` for a
        malformed one."""
        if isinstance(dynamic, DimPolicy):
            return dynamic
        if dynamic is None or dynamic is False:
            return cls()
        if dynamic is True:
            return cls(every=True)
        if not isinstance(dynamic, Mapping):
            raise InvalidArgumentTypeError(
                "dynamic must be True, False, None or a mapping of input paths to dims, got "
                f"{type(dynamic).__name__}"
            )
        out: dict[str, dict[int, str | None]] = {}
        for path, dims in dynamic.items():
            if not isinstance(path, str):
                raise InvalidArgumentTypeError(f"dynamic: an input path is a str, got {path!r}")
            named = dict(dims) if isinstance(dims, Mapping) else dict.fromkeys(dims)
            for d, name in named.items():
                if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                    raise InvalidOptionError(
                        f"dynamic[{path!r}]: a dim is a nonnegative int, got {d!r}"
                    )
                if name is not None and (
                    not isinstance(name, str)
                    or not _NAME.match(name)
                    or _AUTO.match(name)
                    or UNBACKED_RE.match(name)
                ):
                    raise InvalidOptionError(
                        f"dynamic[{path!r}][{d}]: {name!r} is no symbol name (an identifier, "
                        "not of the forms s<k> and dd<k>, which plait names itself)"
                    )
            out[path] = named
        return cls(dims=out)

    @property
    def active(self) -> bool:
        return self.every or any(self.dims.values())

    def wants(self, path: str, dim: int) -> bool:
        return self.every or dim in self.dims.get(path, {})

    def name(self, path: str, dim: int) -> str | None:
        return None if self.every else self.dims.get(path, {}).get(dim)

    def check_paths(self, tensors: list[str]) -> None:
        """NOTE: never silent: a path that names no tensor argument of the call is an error
        (automatic dynamic's own record of paths is not the user's request)."""
        unknown = sorted(set(self.dims) - set(tensors))
        if unknown and not self.automatic:
            raise InvalidOptionError(
                f"dynamic names {unknown}, which are not tensor arguments of this call; its "
                f"tensor arguments are {tensors}"
            )

    def record(self) -> Any:
        """The JSON form of the ``dynamic=`` argument this policy is."""
        if self.every:
            return True
        if not self.active:
            return False
        return {p: {str(d): n for d, n in sorted(dims.items())} for p, dims in self.dims.items()}


# NOTE: what capture takes as ``dynamic=`` (a DimPolicy: automatic dynamic's own)
DynamicSpec = bool | None | Mapping[str, Mapping[int, str | None] | Sequence[int]] | DimPolicy


class AutomaticDims:
    """Automatic dynamic (``dynamic=None``): the user input dims seen changing between calls,
    with the sizes seen. A program is captured static first; when a call misses every
    specialization and one of its dims differs from the static size a specialization captured,
    that dim is symbolic in the captures that follow (:meth:`policy`). ``refused`` names why
    symbolic captures stopped (Stax could not compile one: then every size specializes).

    Example:
        >>> auto = AutomaticDims()
        >>> auto.note("x", 0, [4, 8]), auto.policy().dims
        (True, {'x': {0: None}})
        >>> auto.sizes_seen("x", 0)
        [4, 8]
    """

    def __init__(self) -> None:
        self.seen: dict[str, dict[int, list[int]]] = {}
        self.refused: str | None = None

    def note(self, path: str, dim: int, sizes: Sequence[int]) -> bool:
        """Record ``sizes`` seen at ``path``'s dim ``dim``; True when the dim is newly dynamic."""
        dims = self.seen.setdefault(path, {})
        fresh = dim not in dims
        seen = dims.setdefault(dim, [])
        for n in sizes:
            if int(n) not in seen:
                seen.append(int(n))
        return fresh

    def observe(
        self, programs: Sequence[Any], leaves: Sequence[Any], paths: Sequence[str]
    ) -> list[str]:
        """The call ``leaves`` missed every program of ``programs``: note each of its tensor dims
        whose size differs from a static size a program captured (same rank); the sources
        (``x.shape[0]``) that became dynamic."""
        fresh: list[str] = []
        for prog in programs:
            plan = getattr(prog, "guard_plan", None)
            if plan is None:
                continue
            for i, t in plan.user_types.items():
                leaf = leaves[i] if i < len(leaves) else None
                if leaf is None or not hasattr(leaf, "shape") or len(leaf.shape) != t.rank:
                    continue
                for d, (was, now) in enumerate(zip(t.shape, leaf.shape)):
                    changed = isinstance(was, int) and was != int(now)
                    if changed and self.note(paths[i], d, [was, int(now)]):
                        fresh.append(f"{paths[i]}.shape[{d}]")
        return fresh

    def policy(self) -> DimPolicy | None:
        """The policy of the next capture (None: static); a path it names that a call does not
        pass is left out of that capture."""
        if self.refused is not None or not self.seen:
            return None
        dims = {p: dict.fromkeys(sorted(d)) for p, d in self.seen.items()}
        return DimPolicy(dims=dims, automatic=True)

    def sizes_seen(self, path: str, dim: int) -> list[int]:
        return list(self.seen.get(path, {}).get(dim, []))

    def report(self, symbolic: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """For a captured program's symbolic dims (source -> symbol): each automatic one's
        symbol and the sizes seen."""
        out: dict[str, dict[str, Any]] = {}
        for path, dims in self.seen.items():
            for d, sizes in sorted(dims.items()):
                source = f"{path}.shape[{d}]"
                if source in symbolic:
                    out[source] = {"symbol": symbolic[source], "sizes_seen": list(sizes)}
        return out

    def to_json(self) -> dict[str, Any]:
        return {p: {str(d): list(s) for d, s in dims.items()} for p, dims in self.seen.items()}

    def merge_json(self, doc: Any) -> None:
        """Add the dims of a saved record (:meth:`to_json`); a malformed one adds nothing."""
        if not isinstance(doc, Mapping):
            return
        for path, dims in doc.items():
            if not isinstance(path, str) or not isinstance(dims, Mapping):
                continue
            for d, sizes in dims.items():
                if str(d).isdigit() and isinstance(sizes, list):
                    self.note(path, int(d), [n for n in sizes if isinstance(n, int)])
