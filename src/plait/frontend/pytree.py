"""Flatten nested program inputs and outputs into leaves, with readable paths, and rebuild them.

Containers: tuple, list, dict (and dict subclasses, ``defaultdict`` with its factory),
namedtuples, structseqs (``torch.return_types.sort`` and the other C struct sequences) and
dataclass instances (model output dataclasses, Hugging Face ``ModelOutput`` included). A rebuild
gives back the same Python type. Where the caller asks (``open_object``), a plain object is a
container of its attributes too, when Python's own copy protocol rebuilds it from them (a class
with no custom ``__reduce__``, ``__getstate__``, ``__setstate__``, ``__new__`` or ``__slots__``:
``copy.copy`` would make it as ``cls.__new__(cls)`` plus its ``__dict__``); Hugging Face's
``DynamicCache`` is one. Everything else is a leaf. A spec is a hashable nested tuple,
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

from plait.errors import InternalValueError, InvalidOptionError

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


def state_rebuildable(cls: type) -> bool:
    """Whether ``cls.__new__(cls)`` plus an update of its ``__dict__`` rebuilds an instance, as
    :func:`copy.copy` does for a class that leaves Python's copy protocol as ``object`` has it.

    Example:
        >>> class Box:
        ...     def __init__(self, x):
        ...         self.x = x
        >>> state_rebuildable(Box), state_rebuildable(int)
        (True, False)
    """
    if not isinstance(cls, type) or cls.__module__ == "builtins":
        return False
    try:
        plain = (
            cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and cls.__getstate__ is object.__getstate__
            and cls.__new__ is object.__new__
            and not hasattr(cls, "__setstate__")
            and "__dict__" in {k for c in cls.__mro__ for k in vars(c)}
        )
    except AttributeError:
        return False
    # NOTE: a slot holds state outside __dict__ (``abc.ABC``'s empty __slots__ holds none)
    return plain and not any(_slot_names(c) for c in cls.__mro__)


def _slot_names(cls: type) -> set[str]:
    slots = vars(cls).get("__slots__", ())
    names = {slots} if isinstance(slots, str) else set(slots)
    return names - {"__dict__", "__weakref__"}


def _dataclass_fields(obj: Any) -> list[str] | None:
    """A dataclass instance's state by name: its ``__init__`` fields first (the rebuild passes
    them to the constructor), then its other fields and the attributes set on it after
    construction (set on the rebuilt object); None for anything else."""
    init = _init_fields(obj)
    if init is None:
        return None
    rest = [f.name for f in dataclasses.fields(obj) if not f.init and hasattr(obj, f.name)]
    attrs = [k for k in getattr(obj, "__dict__", {}) if k not in init and k not in rest]
    return init + rest + attrs


def _init_fields(obj: Any) -> list[str] | None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj) if f.init]
    return None


Opener = Callable[[Any], bool]


def _never(obj: Any) -> bool:
    return False


def flatten(
    obj: Any, path: str, open_object: Opener = _never, keep: Opener = _never
) -> tuple[Spec, list[Any], list[str]]:
    """Return ``(spec, leaves, paths)`` for ``obj``; ``path`` names ``obj`` itself.
    ``open_object(x)``: whether an object ``x`` whose class is :func:`state_rebuildable` is
    a container of its attributes (else it is a leaf). ``keep(x)``: ``x`` is a leaf whatever
    it is (a container that stands for itself). Raises ValueError for such an object
    met twice (a rebuild would make two objects of one)."""
    leaves: list[Any] = []
    paths: list[str] = []
    spec = _Flattener(leaves, paths, open_object, keep).flatten(obj, path)
    return spec, leaves, paths


def flatten_call(
    named: dict[str, Any], open_object: Opener = _never
) -> tuple[tuple[tuple[str, Spec], ...], list[Any], list[str]]:
    """Flatten a call's named arguments as one structure, ``((name, spec), ...)``: a mutable
    container (a list, a plain dict, an opened object) met again, in the same argument or
    another (``f(cache, cache)``, an object holding a list also passed on its own), is
    ``("alias", k)``, the ``k``-th container of the call (the order :func:`containers` and
    :func:`unflatten` follow), so a rebuild shares it as the caller's call does and the
    structure guard holds the sharing. Raises ValueError for a cycle."""
    leaves: list[Any] = []
    paths: list[str] = []
    flattener = _Flattener(leaves, paths, open_object, _never, share=True)
    specs = tuple((name, flattener.flatten(value, name)) for name, value in named.items())
    return specs, leaves, paths


def always(obj: Any) -> bool:
    return True


class _Flattener:
    def __init__(
        self,
        leaves: list[Any],
        paths: list[str],
        open_object: Opener,
        keep: Opener,
        share: bool = False,
    ) -> None:
        self.leaves, self.paths, self.open_object, self.keep = leaves, paths, open_object, keep
        self.opened: dict[int, str] = {}
        self.share = share
        self.shared: dict[int, tuple[int, str]] = {}  # NOTE: id -> (container index, path)
        self.open_now: set[int] = set()  # the containers being flattened (a cycle's)
        self.alive: list[Any] = []  # NOTE: keeps each id in shared from being reused

    def flatten(self, obj: Any, path: str) -> Spec:
        if not self.share or not self._is_container(obj):
            return self._flatten(obj, path)
        key = id(obj)
        if key in self.shared:
            k, first = self.shared[key]
            if key in self.open_now:
                raise InvalidOptionError(f"{path} is {first}, which holds it: a cycle")
            return ("alias", k)
        self.shared[key] = (len(self.shared), path)
        self.alive.append(obj)
        self.open_now.add(key)
        try:
            return self._flatten(obj, path)
        finally:
            self.open_now.discard(key)

    def _is_container(self, obj: Any) -> bool:
        """What :func:`_flatten` makes a mutable container (see :func:`_mutable`)."""
        if self.keep(obj) or isinstance(obj, tuple) or type(obj) is bool:
            return False
        if type(obj) is list or isinstance(obj, dict) or _dataclass_fields(obj) is not None:
            return True
        return not isinstance(obj, list) and state_rebuildable(type(obj)) and self.open_object(obj)

    def _flatten(self, obj: Any, path: str) -> Spec:
        go = self.flatten
        if self.keep(obj):
            self.leaves.append(obj)
            self.paths.append(path)
            return LEAF
        if _is_namedtuple(obj):
            kids = tuple(go(v, f"{path}.{f}") for f, v in zip(obj._fields, obj))
            return ("namedtuple", type(obj), kids)
        if type(obj) in (tuple, list):
            kids = tuple(go(v, f"{path}[{i}]") for i, v in enumerate(obj))
            return (type(obj).__name__, len(obj), kids)
        if isinstance(obj, tuple) and is_structseq_type(type(obj)):
            names = _structseq_fields(type(obj))
            kids = tuple(go(v, f"{path}.{f}") for f, v in zip(names, obj))
            return ("structseq", type(obj), kids)
        fields = _dataclass_fields(obj)
        if fields is not None:
            kids = tuple(go(getattr(obj, f), f"{path}.{f}") for f in fields)
            # NOTE: a mapping dataclass (transformers' ModelOutput) is rebuilt by its
            # constructor, which fills the mapping from the fields; any other is its state
            init = len(_init_fields(obj) or ()) if isinstance(obj, dict) else None
            return ("dataclass", type(obj), tuple(fields), init, kids)
        if isinstance(obj, defaultdict):
            keys = tuple(obj)
            kids = tuple(go(obj[k], f"{path}[{k!r}]") for k in keys)
            return ("defaultdict", type(obj), obj.default_factory, keys, kids)
        if isinstance(obj, dict):
            keys = tuple(obj)
            kids = tuple(go(obj[k], f"{path}[{k!r}]") for k in keys)
            return ("dict", type(obj), keys, kids)
        if state_rebuildable(type(obj)) and self.open_object(obj):
            if id(obj) in self.opened:
                raise InvalidOptionError(
                    f"{path} is the object already at {self.opened[id(obj)]}: a rebuild would "
                    "make two objects of one"
                )
            self.opened[id(obj)] = path
            keys = tuple(vars(obj))
            kids = tuple(go(getattr(obj, k), f"{path}.{k}") for k in keys)
            return ("object", type(obj), keys, kids)
        self.leaves.append(obj)
        self.paths.append(path)
        return LEAF


def unflatten(spec: Spec, leaves: list[Any], made: list[Any] | None = None) -> Any:
    """Rebuild the structure described by ``spec`` from ``leaves`` (in flatten order).
    ``made``: gets each mutable container built (a list, a dict, an opened object), parents
    before their contents, in the order :func:`containers` finds a caller's."""
    it = iter(leaves)
    out = _build(spec, it, [] if made is None else made)
    if next(it, _END) is not _END:
        raise InternalValueError("unflatten: more leaves than the spec holds")
    return out


_END = object()


def _mutable(spec: Spec) -> bool:
    """A list, a dict (of any dict class), a dataclass or an opened object: what a program can
    change in place (NOTE: a changed dataclass is refused, not written back)."""
    return spec[0] in ("list", "object", "dict", "defaultdict", "dataclass")


def _build(spec: Spec, it: Iterator[Any], made: list[Any] | None = None) -> Any:
    if spec[0] == "alias":
        if made is None or spec[1] >= len(made) or made[spec[1]] is None:
            raise InternalValueError("unflatten: an alias of a container not built before it")
        return made[spec[1]]
    if made is None or not _mutable(spec):
        return _make(spec, it, made)
    k = len(made)
    made.append(None)  # NOTE: its place before its contents', as containers() finds them
    made[k] = out = _make(spec, it, made)
    return out


def _make(spec: Spec, it: Iterator[Any], made: list[Any] | None) -> Any:
    tag = spec[0]
    if tag == "*":
        value = next(it, _END)
        if value is _END:
            raise InternalValueError("unflatten: fewer leaves than the spec holds")
        return value
    if tag in ("tuple", "list"):
        items = [_build(s, it, made) for s in spec[2]]
        return tuple(items) if tag == "tuple" else items
    if tag == "namedtuple":
        return spec[1](*[_build(s, it, made) for s in spec[2]])
    if tag == "structseq":
        return spec[1]([_build(s, it, made) for s in spec[2]])
    if tag == "dataclass":
        values = [(f, _build(s, it, made)) for f, s in zip(spec[2], spec[4])]
        init = spec[3]
        if init is None:
            # NOTE: the object's state, set as it is: calling the constructor would run its
            # __post_init__ again on values it already made (x * 2 doubled twice)
            obj = spec[1].__new__(spec[1])
        else:
            obj, values = spec[1](**dict(values[:init])), values[init:]
        for f, v in values:  # NOTE: a frozen dataclass's too, as its own code sets them
            object.__setattr__(obj, f, v)
        return obj
    if tag == "object":
        cls = spec[1]
        if not state_rebuildable(cls):
            raise InternalValueError(
                f"unflatten: {cls.__qualname__} is not rebuilt from its attributes"
            )
        obj = cls.__new__(cls)
        obj.__dict__.update({k: _build(s, it, made) for k, s in zip(spec[2], spec[3])})
        return obj
    if tag == "defaultdict":
        cls, factory, keys, kids = spec[1], spec[2], spec[3], spec[4]
        return cls(factory, [(k, _build(s, it, made)) for k, s in zip(keys, kids)])
    if tag == "dict":
        cls, keys, kids = spec[1], spec[2], spec[3]
        pairs = [(k, _build(s, it, made)) for k, s in zip(keys, kids)]
        return dict(pairs) if cls is dict else cls(pairs)
    raise InternalValueError(f"unflatten: bad spec tag {tag!r}")


def containers(spec: Spec, obj: Any) -> list[Any]:
    """The mutable containers of ``obj`` (flattened as ``spec``) in the order
    :func:`unflatten` records the ones it builds: the caller's objects that a capture's stand
    for."""
    out: list[Any] = []

    def walk(s: Spec, x: Any) -> None:
        tag = s[0]
        if tag in ("*", "alias"):  # NOTE: an alias is a container met before
            return
        if _mutable(s):
            out.append(x)
        if tag in ("tuple", "list", "namedtuple", "structseq"):
            for sub, v in zip(s[2], x):
                walk(sub, v)
        elif tag in ("dataclass", "object"):
            for f, sub in zip(s[2], s[-1]):
                walk(sub, getattr(x, f))
        else:  # NOTE: a dict or defaultdict: its keys, then its kids
            for k, sub in zip(s[-2], s[-1]):
                walk(sub, x[k])

    walk(spec, obj)
    return out


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf of ``obj`` and rebuild it."""
    spec, leaves, _ = flatten(obj, "")
    return unflatten(spec, [fn(x) for x in leaves])


def find_hidden_in(
    obj: Any, wanted: Callable[[Any], bool], path: str, open_object: Opener = _never
) -> str | None:
    """The path of a ``wanted`` object that :func:`flatten` of ``obj`` (with the same
    ``open_object``) would not give as a leaf (see :func:`find_hidden`), looking into its
    leaves and into what its dataclasses hold besides their ``__init__`` fields. None when there
    is none."""
    if (
        _is_namedtuple(obj)
        or type(obj) in (tuple, list)
        or (isinstance(obj, tuple) and is_structseq_type(type(obj)))
    ):
        for i, v in enumerate(obj):
            found = find_hidden_in(v, wanted, f"{path}[{i}]", open_object)
            if found is not None:
                return found
        return None
    fields = _dataclass_fields(obj)
    if fields is not None:
        for f in fields:
            found = find_hidden_in(getattr(obj, f), wanted, f"{path}.{f}", open_object)
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
                v, wanted, f"{path}[{k!r}]", open_object
            )
            if found is not None:
                return found
        return None
    if wanted(obj):
        return None
    if state_rebuildable(type(obj)) and open_object(obj):
        for k, v in vars(obj).items():
            found = find_hidden_in(v, wanted, f"{path}.{k}", open_object)
            if found is not None:
                return found
        return None
    return find_hidden(obj, wanted, path)


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
