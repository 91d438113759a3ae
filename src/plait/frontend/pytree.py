"""Flatten nested program inputs and outputs into leaves, with readable paths, and rebuild them.

Containers: tuple, list, dict (and dict subclasses, ``defaultdict`` with its factory),
namedtuples, structseqs (``torch.return_types.sort`` and the other C struct sequences) and
dataclass instances (model output dataclasses, Hugging Face ``ModelOutput`` included). A rebuild
gives back the same Python type. Everything else is a leaf. A spec is a hashable nested tuple,
so two calls with the same structure have equal specs (a cheap guard).

NOTE: a leaf plait cannot look into must not hold a traced tensor: :func:`find_hidden` says
where one hides (capture refuses such a result rather than keep it as a constant).

Example:
    >>> spec, leaves, paths = flatten({"a": (1, 2), "b": [3]}, "x")
    >>> leaves, paths
    ([1, 2, 3], ["x['a'][0]", "x['a'][1]", "x['b'][0]"])
    >>> unflatten(spec, [10, 20, 30])
    {'a': (10, 20), 'b': [30]}
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

Spec = tuple[Any, ...]
LEAF: Spec = ("*",)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and isinstance(getattr(type(obj), "_fields", None), tuple)


def is_structseq_type(cls: type) -> bool:
    """A C struct sequence (``torch.return_types.*``, ``os.stat_result``) whose fields are all
    in its sequence, so ``cls(items)`` rebuilds it."""
    n_fields = getattr(cls, "n_fields", None)
    return (
        issubclass(cls, tuple)
        and isinstance(n_fields, int)
        and n_fields == getattr(cls, "n_sequence_fields", None)
        and getattr(cls, "n_unnamed_fields", 0) == 0
    )


def _structseq_fields(cls: type) -> tuple[str, ...]:
    names = getattr(cls, "__match_args__", None)
    if isinstance(names, tuple) and len(names) == cls.n_fields:  # type: ignore[attr-defined]
        return names
    return tuple(str(i) for i in range(cls.n_fields))  # type: ignore[attr-defined]


def is_named_sequence(obj: Any) -> bool:
    """A namedtuple or a structseq (a tuple whose type :func:`same_type` rebuilds)."""
    return _is_namedtuple(obj) or (isinstance(obj, tuple) and is_structseq_type(type(obj)))


def same_type(like: tuple | list, items: list[Any]) -> Any:
    """``items`` as a tuple, list, namedtuple or structseq of ``like``'s type (other
    sequence types become a plain tuple)."""
    cls = type(like)
    if cls in (tuple, list):
        return cls(items)
    if _is_namedtuple(like):
        return cls(*items)
    if isinstance(like, tuple) and is_structseq_type(cls):
        return cls(items)
    return tuple(items)


def _dataclass_fields(obj: Any) -> list[str] | None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj) if f.init]
    return None


def flatten(obj: Any, path: str) -> tuple[Spec, list[Any], list[str]]:
    """Return ``(spec, leaves, paths)`` for ``obj``; ``path`` names ``obj`` itself."""
    leaves: list[Any] = []
    paths: list[str] = []
    spec = _flatten(obj, path, leaves, paths)
    return spec, leaves, paths


def _flatten(obj: Any, path: str, leaves: list[Any], paths: list[str]) -> Spec:
    if _is_namedtuple(obj):
        kids = tuple(_flatten(v, f"{path}.{f}", leaves, paths) for f, v in zip(obj._fields, obj))
        return ("namedtuple", type(obj), kids)
    if type(obj) in (tuple, list):
        kids = tuple(_flatten(v, f"{path}[{i}]", leaves, paths) for i, v in enumerate(obj))
        return (type(obj).__name__, len(obj), kids)
    if isinstance(obj, tuple) and is_structseq_type(type(obj)):
        names = _structseq_fields(type(obj))
        kids = tuple(_flatten(v, f"{path}.{f}", leaves, paths) for f, v in zip(names, obj))
        return ("structseq", type(obj), kids)
    fields = _dataclass_fields(obj)
    if fields is not None:
        kids = tuple(_flatten(getattr(obj, f), f"{path}.{f}", leaves, paths) for f in fields)
        return ("dataclass", type(obj), tuple(fields), kids)
    if isinstance(obj, defaultdict):
        keys = tuple(obj)
        kids = tuple(_flatten(obj[k], f"{path}[{k!r}]", leaves, paths) for k in keys)
        return ("defaultdict", type(obj), obj.default_factory, keys, kids)
    if isinstance(obj, dict):
        keys = tuple(obj)
        kids = tuple(_flatten(obj[k], f"{path}[{k!r}]", leaves, paths) for k in keys)
        return ("dict", type(obj), keys, kids)
    leaves.append(obj)
    paths.append(path)
    return LEAF


def unflatten(spec: Spec, leaves: list[Any]) -> Any:
    """Rebuild the structure described by ``spec`` from ``leaves`` (in flatten order)."""
    it = iter(leaves)
    out = _build(spec, it)
    if next(it, _END) is not _END:
        raise ValueError("unflatten: more leaves than the spec holds")
    return out


_END = object()


def _build(spec: Spec, it: Iterator[Any]) -> Any:
    tag = spec[0]
    if tag == "*":
        value = next(it, _END)
        if value is _END:
            raise ValueError("unflatten: fewer leaves than the spec holds")
        return value
    if tag in ("tuple", "list"):
        items = [_build(s, it) for s in spec[2]]
        return tuple(items) if tag == "tuple" else items
    if tag == "namedtuple":
        return spec[1](*[_build(s, it) for s in spec[2]])
    if tag == "structseq":
        return spec[1]([_build(s, it) for s in spec[2]])
    if tag == "dataclass":
        values = {f: _build(s, it) for f, s in zip(spec[2], spec[3])}
        return spec[1](**values)
    if tag == "defaultdict":
        cls, factory, keys, kids = spec[1], spec[2], spec[3], spec[4]
        return cls(factory, [(k, _build(s, it)) for k, s in zip(keys, kids)])
    if tag == "dict":
        cls, keys, kids = spec[1], spec[2], spec[3]
        pairs = [(k, _build(s, it)) for k, s in zip(keys, kids)]
        return dict(pairs) if cls is dict else cls(pairs)
    raise ValueError(f"unflatten: bad spec tag {tag!r}")


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf of ``obj`` and rebuild it."""
    spec, leaves, _ = flatten(obj, "")
    return unflatten(spec, [fn(x) for x in leaves])


def find_hidden_in(obj: Any, wanted: Callable[[Any], bool], path: str) -> str | None:
    """The path of a ``wanted`` object that :func:`flatten` of ``obj`` would not give as a leaf
    (see :func:`find_hidden`), looking into its leaves and into what its dataclasses hold
    besides their ``__init__`` fields. None when there is none."""
    if (
        _is_namedtuple(obj)
        or type(obj) in (tuple, list)
        or (isinstance(obj, tuple) and is_structseq_type(type(obj)))
    ):
        for i, v in enumerate(obj):
            found = find_hidden_in(v, wanted, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    fields = _dataclass_fields(obj)
    if fields is not None:
        for f in fields:
            found = find_hidden_in(getattr(obj, f), wanted, f"{path}.{f}")
            if found is not None:
                return found
        # NOTE: a ModelOutput is also a dict of its non-None fields: those are the fields
        extras = [(k, v) for k, v in vars(obj).items() if k not in fields]
        if isinstance(obj, dict):
            extras += [
                (k, v) for k, v in obj.items() if k not in fields or v is not getattr(obj, k)
            ]
        for k, v in extras:
            found = find_hidden(v, wanted, f"{path}.{k}")
            if found is not None:
                return found
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            found = find_hidden(k, wanted, f"{path} (a key)") or find_hidden_in(
                v, wanted, f"{path}[{k!r}]"
            )
            if found is not None:
                return found
        return None
    return None if wanted(obj) else find_hidden(obj, wanted, path)


def find_hidden(obj: Any, wanted: Callable[[Any], bool], path: str, depth: int = 8) -> str | None:
    """The path of a ``wanted`` object (a traced tensor) held inside ``obj`` where
    :func:`flatten` does not look: a set, a tuple or list subclass, an object's attributes or
    slots, a dataclass field left out of its ``__init__``. None when there is none."""
    seen: set[int] = set()

    def visit(x: Any, where: str, left: int) -> str | None:
        if wanted(x):
            return where
        if left == 0 or id(x) in seen or isinstance(x, (str, bytes, int, float, type)):
            return None
        seen.add(id(x))
        kids: list[tuple[str, Any]] = []
        if isinstance(x, dict):
            kids += [(f"{where}[{k!r}]", v) for k, v in x.items()]
            kids += [(f"{where} (a key)", k) for k in x]
        elif isinstance(x, (tuple, list, set, frozenset)):
            kids += [(f"{where}[{i}]", v) for i, v in enumerate(x)]
        kids += [(f"{where}.{k}", v) for k, v in getattr(x, "__dict__", {}).items()]
        for cls in type(x).__mro__:
            for name in cls.__dict__.get("__slots__", ()):
                if isinstance(name, str) and hasattr(x, name):
                    kids.append((f"{where}.{name}", getattr(x, name)))
        for kid_path, kid in kids:
            found = visit(kid, kid_path, left - 1)
            if found is not None:
                return found
        return None

    return visit(obj, path, depth)
