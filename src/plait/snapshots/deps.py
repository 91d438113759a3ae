"""What a capture ran: :class:`CodeRecorder` records every Python function that runs during a
capture (a profile hook, installed only for the capture, with the cyclic collector paused), each
digested (:mod:`plait.snapshots.fingerprint`) when it is first called, so that what it reads then
is what the capture saw. Pinned code (PyTorch's, plait's, the standard library's), what such
libraries generate and run themselves, and what the import system runs are left out; a
namedtuple's or a dataclass's generated methods count as their class. A lambda or nested
function that runs (its closure cannot be read back by name) or module-level code makes the
program :class:`~plait.snapshots.fingerprint.Unpinnable`: it is captured on every warm start.
The names the code that ran reads (a library's too, plait's own excepted: :func:`read_names`)
say which sets the capture could have iterated (:mod:`plait.snapshots.set_order`).

Example:
    >>> import json
    >>> with CodeRecorder() as rec:
    ...     _ = json.dumps([1])  # NOTE: the standard library's code: pinned, not recorded
    >>> rec.deps()
    []
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from plait.frontend.code_origin import IMPORT_SYSTEM, find_function, generated_for, is_pinned
from plait.snapshots.code_digest import names_of, read_names
from plait.snapshots.fingerprint import Unpinnable, class_orders, function_orders
from plait.snapshots.set_order import SetOrder

# NOTE: nested code of these kinds is part of its enclosing function's digest, which also ran.
_INLINE = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


@dataclass(frozen=True)
class CodeDep:
    """A function (or a class whose generated methods ran) the capture ran: ``module`` and
    ``qualname`` find it again; ``digest`` covers its code, defaults and the values it reads
    (sets by their contents); ``orders``: the iteration orders of the sets among those."""

    module: str
    qualname: str
    digest: str
    orders: tuple[SetOrder, ...] = ()


# --- recording ------------------------------------------------------------------------------
class CodeRecorder:
    """Records the code that runs while active (``with CodeRecorder() as rec:``), each function
    digested when first called: what it reads then is what the capture saw.

    NOTE: a profile hook is per thread; one already installed (a profiler) is left alone and
    nothing is recorded (``refusal`` says so)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.found: dict[tuple[str, str], CodeDep] = {}
        self.refusal: str | None = None
        # NOTE: the names the code that ran reads by (all of it: a library's code may iterate
        # a set it finds by a name): which sets the capture could have iterated
        self.names: set[str] = set()
        self._alive: list[types.CodeType] = []  # NOTE: keeps the ids in `seen` from reuse
        self._outside: set[int] = set()  # NOTE: the frames on the stack when recording began
        self._frames: list[types.FrameType] = []
        self._installed = False
        self._gc_was_enabled = False

    def _hook(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if id(code) in self.seen:
            return
        module = str(frame.f_globals.get("__name__", ""))
        pinned = is_pinned(module)
        try:
            # NOTE: plait's own code (capture) reads no value of the program by its name
            if not (module == "plait" or module.startswith("plait.")):
                self.names |= names_of(code) if pinned else read_names(code)
        except Exception as exc:  # NOTE: never in user code: recorded as a refusal
            self.refusal = self.refusal or f"reading the names of {code.co_name} failed ({exc!r})"
        if self.refusal is None and not pinned:
            if self._under_import(frame):
                return  # NOTE: not marked seen: the program proper may run it later
            # NOTE: an exception must never leave a profile hook: it would surface in user code
            try:
                dep = _frame_dep(frame)
            except Unpinnable as exc:
                self.refusal = str(exc)
            except Exception as exc:
                self.refusal = f"recording the code the capture ran failed ({exc!r})"
            else:
                if dep is not None:
                    self.found.setdefault((dep.module, dep.qualname), dep)
        self.seen.add(id(code))
        self._alive.append(code)

    def _under_import(self, frame: types.FrameType) -> bool:
        """Whether ``frame`` runs for an import begun during the recording (a finder such as
        setuptools' or pytest's, a module's body): the import system's business, not the
        program's. What the program then calls of that module is recorded, and a module not
        loaded in a later process makes its functions not found there."""
        caller = frame.f_back
        while caller is not None and id(caller) not in self._outside:
            if caller.f_globals.get("__name__") in IMPORT_SYSTEM:
                return True
            caller = caller.f_back
        return False

    def __enter__(self) -> CodeRecorder:
        if sys.getprofile() is not None:
            self.refusal = "a profiler was active during capture"
        else:
            outer: types.FrameType | None = sys._getframe(1)
            while outer is not None:
                self._outside.add(id(outer))
                self._frames.append(outer)  # NOTE: alive, so that no new frame takes its id
                outer = outer.f_back
            # NOTE: no cyclic collection while recording: what it runs (gc.callbacks, the
            # __del__ of unrelated garbage) is not the program's code, and whether it runs
            # depends on allocation history (hypothesis' gc callback made snapshots flaky).
            self._gc_was_enabled = gc.isenabled()
            gc.disable()
            sys.setprofile(self._hook)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            sys.setprofile(None)
            self._installed = False
            if self._gc_was_enabled:
                gc.enable()
        self._frames.clear()

    def deps(self) -> list[CodeDep]:
        """The recorded code as :class:`CodeDep` items; raises :class:`Unpinnable`."""
        if self.refusal is not None:
            raise Unpinnable(self.refusal)
        return sorted(self.found.values(), key=lambda d: (d.module, d.qualname))


def _frame_dep(frame: types.FrameType) -> CodeDep | None:
    """The dependency a frame's code makes (None: pinned or part of another one)."""
    code = frame.f_code
    module = str(frame.f_globals.get("__name__", ""))
    if is_pinned(module) or _generated_by_library(frame):
        return None
    qualname = code.co_qualname
    owner = generated_for(frame, module, qualname)
    if owner is not None:
        # NOTE: namedtuple's and dataclasses' generated methods follow from the class's fields
        if is_pinned(owner.__module__ or ""):
            return None
        digest, orders = class_orders(owner)
        return CodeDep(owner.__module__, owner.__qualname__, digest, tuple(orders))
    if qualname.rsplit(".", 1)[-1] in _INLINE:
        return None
    if qualname == "<module>":
        raise Unpinnable(f"the program ran the module-level code of {module} (an import)")
    if "<" in qualname:
        raise Unpinnable(
            f"the program runs {module}.{qualname}: a nested function or lambda, whose "
            "closure cannot be checked without capturing"
        )
    fn = find_function(module, qualname)
    if fn is None or fn.__code__ is not code:
        raise Unpinnable(f"{module}.{qualname} ran but cannot be found again by its name")
    digest, orders = function_orders(fn)
    return CodeDep(module, qualname, digest, tuple(orders))


def _generated_by_library(frame: types.FrameType) -> bool:
    """Code a library made from a string and runs itself (``sympy.lambdify``'s, when plait
    builds the guards of a size comparison): no module, a ``<...>`` file, a pinned caller."""
    if "__name__" in frame.f_globals or not frame.f_code.co_filename.startswith("<"):
        return False
    caller = frame.f_back
    return caller is not None and is_pinned(str(caller.f_globals.get("__name__", "")))


@contextmanager
def recording(enabled: bool) -> Iterator[CodeRecorder | None]:
    """``with recording(on) as rec``: a :class:`CodeRecorder` when ``enabled``, else None."""
    if not enabled:
        yield None
        return
    with CodeRecorder() as rec:
        yield rec
