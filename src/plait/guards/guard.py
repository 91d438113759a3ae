"""Guards: what a captured program's behaviour depended on, recorded as data.

A :class:`Guard` reads one thing from a call (an input's type, a size the program compared, a
Python scalar argument, the modules' training flags, grad mode, ...) and holds when that reading
equals the value seen at capture. A :class:`GuardSet` checks all of them in a fixed order (cheap
ones that make later reads safe first) and, when one fails, explains which guards failed with
the expected and the actual value, the program's own comparisons first.

The fast path (:meth:`GuardSet.holds`) runs a compiled evaluator when its maker passed one: each
guard may describe its read as data (``native``: one of the ``Read*`` classes below) and the
evaluator (:mod:`plait.guards.native`'s, which the API passes to its specializations' guard sets)
checks those reads in C++; a guard without a description is checked by its Python ``read``,
called from the evaluator. Without an evaluator the guards run in Python, and
:attr:`GuardSet.evaluator` says why. Explanations always use the Python reads.

Example:
    >>> env = GuardEnv((), [3])
    >>> g = Guard("scalar", "arg n", "n == 4", 4, lambda env: env.leaves[0])
    >>> GuardSet([g]).holds(env), GuardSet([g]).explain(env)
    (False, ['n == 4: expected 4, got 3'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from plait.errors import NotSavableError
from plait.guards.sampled import Sample

# NOTE: reasons list the program's own reads first: they are what the user can act on.
_PRIORITY = {
    "dim": 0,
    "scalar": 1,
    "python": 1,
    "training": 2,
    "grad_mode": 3,
    "requires_grad": 4,
    "tensor": 5,
    "layout": 5,
    "alias": 6,
    "state": 7,
    "ambient": 8,
    "structure": 9,
}


def float_bits(value: float) -> int:
    """The IEEE-754 bit pattern of ``value`` as a signed 64-bit int: ``-0.0`` and ``0.0``
    differ, a NaN equals the same NaN (``==`` says neither)."""
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def canonical(value: Any) -> str:
    """A process-independent text for a guard's expected value (dtypes, devices, sizes, nested
    tuples, types by qualified name). ``repr`` of anything else that has no address in it."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(canonical(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text:
        raise NotSavableError(f"{text}: has no process-independent text")
    return text


# ---------------------------------------------------------------------------------------------
# A guard's read as data: what a compiled evaluator checks instead of calling the read. Each must
# hold exactly when ``guard.read(env) == guard.expected`` does (tests/guards/test_native.py).


@dataclass(frozen=True)
class TensorCheck:
    """What is checked of one tensor: ``env.leaves[index]`` (``where="leaf"``) or
    ``env.state[index]`` (``"state"``). Each field that is not None must equal the tensor's:
    ``identity`` (``id``), ``version`` (``_version``), ``data_ptr``, ``dtype`` and ``device``
    (both or neither), ``shape`` (None for a dim of any size), ``requires_grad``; ``sample``:
    the strides and the digest of the sampled elements (:mod:`plait.guards.sampled`)."""

    where: str
    index: int
    identity: int | None = None
    version: int | None = None
    data_ptr: int | None = None
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    shape: tuple[int | None, ...] | None = None
    requires_grad: bool | None = None
    sample: Sample | None = None


@dataclass(frozen=True)
class ReadStructure:
    """``(env.spec, kinds of env.leaves)``: a leaf's kind is ``"tensor"`` or its type's name."""

    spec: Any
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class ReadTensors:
    """All the checks hold (expected: the guard's expected value, whatever its form)."""

    checks: tuple[TensorCheck, ...]


@dataclass(frozen=True)
class ReadEdges:
    """``tables[i].get(keys[i]) is children[i]`` for every i (dicts)."""

    tables: tuple[dict, ...]
    keys: tuple[str, ...]
    children: tuple[Any, ...]


@dataclass(frozen=True)
class ReadAttrs:
    """``tuple(getattr(o, name) for o in objects)`` (the guard expects a tuple)."""

    objects: tuple[Any, ...]
    name: str


@dataclass(frozen=True)
class ReadCall:
    """``fn()``. With ``exact=False``, ``fn() == expected`` only implies that the guard holds;
    otherwise the guard's own read decides."""

    fn: Callable[[], Any]
    exact: bool = True


@dataclass(frozen=True)
class ReadCalls:
    """``tuple(fn() for fn in fns)`` (the guard expects a tuple). With ``expected`` and
    ``exact=False``, ``fns`` are other reads whose values, when they equal ``expected``, imply
    that the guard holds; otherwise the guard's own read decides."""

    fns: tuple[Callable[[], Any], ...]
    expected: tuple[Any, ...] | None = None
    exact: bool = True


@dataclass(frozen=True)
class ReadLeaf:
    """``env.leaves[index] is value`` (``identity=True``, the guard expects True), else
    ``(type(leaf), leaf)`` (the guard expects ``(type, value)``); with ``bits=True`` (a float
    ``value``) ``(type(leaf), ("bits", IEEE-754 bits of leaf))``: ``-0.0`` is not ``0.0``, a
    NaN is the same NaN."""

    index: int
    value: Any
    identity: bool = False
    bits: bool = False


@dataclass(frozen=True)
class ReadIdentity:
    """Which objects the tensor leaves ``leaves`` are: each reads as the index of the first of
    them it is, as ``-1 - k`` for the state entry ``k`` it is (``state``: the state is
    scanned), or as ``HELD - c`` for ``held[c]``; the guard holds where these are ``codes``."""

    leaves: tuple[int, ...]
    codes: tuple[int, ...]
    state: bool
    held: tuple[Any, ...]

    HELD = -(1 << 40)


@dataclass(frozen=True)
class ReadPyValues:
    """Python values the program read (:mod:`plait.frontend.pyreads`): ``checks`` are
    identity checks that, when all hold, imply the guard holds (any other answer: the guard's
    own read decides). Each is a tuple ``(kind, ...)``: ``(0, mapping, keys, values)`` each
    ``mapping.get(key, absent) is value``; ``(1, cell, value)``; ``(2, fn, code, defaults,
    kwdefaults)``; ``(3, obj, type)``; ``(4, dict, keys, values)`` the dict's items are exactly
    these objects, in order; ``(5, list, items)`` likewise; ``(6,)`` never (the read decides);
    ``(7, cls, names, values)`` the MRO lookup of each name on ``cls`` is its value;
    ``(8, fn, value)`` ``fn()`` is ``value`` (a library's getter of process state); ``(9, set,
    items)`` an exact set holding exactly these items (classes and strings). ``rearm``: called
    with the guard's read when a check failed and the read found the value unchanged, returns
    the checks of the objects that read saw (they replace ``checks``), or None (keep them)."""

    checks: tuple[tuple[Any, ...], ...]
    absent: Any
    rearm: Callable[[Any], tuple[tuple[Any, ...], ...] | None] | None = None


NativeRead = (
    ReadStructure
    | ReadTensors
    | ReadEdges
    | ReadAttrs
    | ReadCall
    | ReadCalls
    | ReadLeaf
    | ReadPyValues
    | ReadIdentity
)


class GuardEnv:
    """One call's view for guards: the input spec, its flattened leaves, the module."""

    __slots__ = ("leaves", "module", "spec", "state")

    def __init__(
        self, spec: Any, leaves: Sequence[Any], module: Any = None, state: Sequence[Any] = ()
    ) -> None:
        self.spec = spec
        self.leaves = leaves
        self.module = module
        self.state = state


@dataclass(frozen=True, eq=False)
class Guard:
    """One recorded dependency. ``kind`` is one of the keys of the priority table; ``source``
    says what it reads (``"x.shape[0]"``, ``"arg scale"``, ``"self.training"``); ``text`` is the
    predicate as a human reads it (``"x.shape[0] > 2"``); ``expected`` is the value seen at
    capture (for a comparison: its outcome)."""

    kind: str
    source: str
    text: str
    expected: Any
    read: Callable[[GuardEnv], Any]
    detail: Callable[[GuardEnv], str] | None = None
    # NOTE: a gate guard makes the reads of later guards safe (structure, ranks); when it fails,
    # the explanation stops there.
    gate: bool = False
    # NOTE: a redundant guard is implied by others (a comparison of a static size is implied by
    # the input's type guard); the fast path skips it, explanations still report it.
    redundant: bool = False
    fmt: Callable[[Any], str] = repr  # how a reading is shown in a failure message
    # NOTE: a batch guard checks, in one read, what the redundant guards listed after it check
    # one by one: the fast path runs it instead of them; texts, keys and explanations skip it.
    batch: bool = False
    # NOTE: a guard whose expected value only means something in this process (an object's
    # identity) makes its specialization unfit for the artifact cache.
    portable: bool = True
    key: str | None = None  # the guard in a cache key (default: kind, text, expected value)
    # NOTE: a batch guard may take over the fast-path duty of the guards with this source: a
    # specialization then checks them only to explain a miss.
    replaces: str | None = None
    # NOTE: the read as data, for a compiled evaluator; None: the evaluator calls ``read``.
    native: NativeRead | None = None

    def holds(self, env: GuardEnv) -> bool:
        return bool(self.read(env) == self.expected)

    def failure(self, env: GuardEnv) -> str | None:
        """None when the guard holds, else ``"<text>: expected <e>, got <a>"``."""
        try:
            actual = self.read(env)
        except Exception as exc:  # a guard whose input is missing or of another kind
            return f"{self.text}: could not read it ({type(exc).__name__}: {exc})"
        if actual == self.expected:
            return None
        msg = f"{self.text}: expected {self.fmt(self.expected)}, got {self.fmt(actual)}"
        if self.detail is not None:
            # NOTE: a detail is a courtesy; never let it hide the failure
            with contextlib.suppress(Exception):
                msg += f" ({self.detail(env)})"
        return msg

    def key_text(self) -> str:
        """The guard as a cache key part: what it reads and the value it expects, written the
        same way in every process. Raises ``ValueError`` for a guard that is not portable."""
        if not self.portable:
            raise NotSavableError(f"{self.text}: holds for an object of this process only")
        if self.key is not None:
            return self.key
        # NOTE: a guard is immutable (frozen, its expected value a capture-time reading), so its
        # text is written once: a warm start asks for it twice (snapshot check, cache key).
        text = self.__dict__.get("_key_text")
        if text is None:
            text = f"{self.kind}|{self.source}|{self.text}|{canonical(self.expected)}"
            object.__setattr__(self, "_key_text", text)
        return text

    def to_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "source": self.source,
            "text": self.text,
            "expected": self.fmt(self.expected),
        }

    def __str__(self) -> str:
        return self.text


class Evaluators(Protocol):
    """What a :class:`GuardSet` is given to compile itself: ``compile(guards)`` returns a
    callable that holds for an env exactly when every guard does (stopping at the first that
    fails) and a description, or None and the reason there is none."""

    def compile(self, guards: Sequence[Guard]) -> tuple[Callable[[GuardEnv], bool] | None, str]: ...


class GuardSet:
    """The guards of one specialization, in check order.

    ``holds(env)`` is the fast path: every guard in order, stopping at the first that fails. The
    first call compiles it with ``evaluators`` (None: the guards' Python reads; see the module
    doc); :attr:`evaluator` says what runs it."""

    holds: Callable[[GuardEnv], bool]

    def __init__(self, guards: Sequence[Guard], evaluators: Evaluators | None = None) -> None:
        taken = {g.replaces for g in guards if g.replaces is not None}
        self.guards = [
            dataclasses.replace(g, redundant=True) if g.source in taken and not g.batch else g
            for g in guards
        ]
        self._fast = [(g.read, g.expected) for g in self.guards if not g.redundant]
        self._evaluators = evaluators
        self._evaluator: str | None = None
        self.holds = self._compile_and_hold

    def __iter__(self) -> Iterator[Guard]:
        return iter(self.guards)

    def __len__(self) -> int:
        return len(self.guards)

    def _compile_and_hold(self, env: GuardEnv) -> bool:
        self._compile()
        return self.holds(env)

    def _compile(self) -> None:
        fn: Callable[[GuardEnv], bool] | None = None
        what = "python: no evaluator given (plait.api gives its specializations the native one)"
        if self._evaluators is not None:
            try:
                fn, what = self._evaluators.compile([g for g in self.guards if not g.redundant])
            except Exception as exc:  # NOTE: never silent: the reason is the description
                fn, what = None, f"python: the evaluator failed ({type(exc).__name__}: {exc})"
        self.holds = fn if fn is not None else self.holds_python
        self._evaluator = what

    @property
    def evaluator(self) -> str:
        """What runs :meth:`holds`: ``"native"``, or ``"python: <why>"`` (compiles it now if no
        call did yet)."""
        if self._evaluator is None:
            self._compile()
        assert self._evaluator is not None
        return self._evaluator

    def stale(self, env: GuardEnv) -> bool:
        """Whether a guard on the Python values the program read fails for ``env``: then the
        specialization admits no call, whatever its inputs, until those values change back.
        Checked natively first, as :meth:`holds` (its own guard set, made on first use)."""
        check = self.__dict__.get("_stale_check")
        if check is None:
            python = [g for g in self.guards if g.kind == "python" and not g.redundant]
            check = GuardSet(python, self._evaluators).holds if python else bool
            self.__dict__["_stale_check"] = check
        try:
            return not check(env)
        except Exception:  # NOTE: an unreadable value: not known to be stale
            return False

    def holds_python(self, env: GuardEnv) -> bool:
        """The guards' Python reads, in order, stopping at the first that fails (the reference
        for every compiled evaluator)."""
        try:
            for read, expected in self._fast:
                if read(env) != expected:
                    return False
        except Exception:  # NOTE: an unreadable guard (e.g. a missing input) is a failed one
            return False
        return True

    def explain(self, env: GuardEnv) -> list[str]:
        """Every failed guard as ``"<text>: expected <e>, got <a>"``, the program's own reads
        first; stops after a failed gate guard (later reads would be meaningless)."""
        failed: list[tuple[int, int, str]] = []
        for i, g in enumerate(self.guards):
            if g.batch:
                continue
            msg = g.failure(env)
            if msg is None:
                continue
            failed.append((_PRIORITY.get(g.kind, 99), i, msg))
            if g.gate:
                break
        return [m for _, _, m in sorted(failed)]

    def texts(self) -> list[str]:
        return [g.text for g in self.guards if not g.batch]

    def key_texts(self) -> list[str]:
        """Every guard as a cache key part (see :meth:`Guard.key_text`)."""
        return [g.key_text() for g in self.guards if not g.batch]

    @property
    def portable(self) -> bool:
        return all(g.portable for g in self.guards)

    def __str__(self) -> str:
        return "\n".join(self.texts())

    def __repr__(self) -> str:
        return f"GuardSet({self.texts()!r})"
