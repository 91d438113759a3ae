"""A call whose capture is refused while its program runs goes on eagerly, its Python once.

Capture runs every call for real on the samples (:mod:`plait.frontend.tracer`), so at a read
of tensor data it refuses (``bool(y.sum() > 0)``, ``.item()``) the values the program has
computed so far are eager's. Running the program again eagerly from the start (the fallback)
made every Python side effect before that point twice in that call (``self.calls += 1``, a
list's append, a global counter). Instead, where :meth:`Continuation.begin` finds it sound, the
capture *continues*: the samples of the call's tensors, buffers and constants become the
caller's own (what the program wrote into them so far is copied in first; each traced view is
made again on the caller's tensor), the random number generator gets the caller's state back,
and every torch call from then on, the refused read first, runs for real on the samples and
returns plain tensors (:meth:`Continuation.call`). When the program returns, its result, the
containers of its arguments, its module's attributes and the Python values it read hold
samples in place of tracers (:func:`untraced`); the capture ends as the recorded fallback, and
the call returns that result (``CapturedProgram.this_call``, a :class:`~plait.frontend.program.
Continued`). Later calls run eagerly, as every fallback's do.

``plait.compile`` asks for it for functions and modules alike: a module's fallback is
regional, and the call that goes on runs its submodules as written, so its regions are captured
from its next call on (docs/capture.md, "Regional compilation").

NOTE: the capture continues only where every sample is the caller's tensor or computed exactly
as eager computes it, so it never does in
- a capture that ran the program's Python before (a restart with sizes made static, or a
  resample computing every call): its side effects happened already (``capture_program``
  continues its first attempt alone);
- with grad mode on, a call whose calls before the refusal cannot be made again
  (:mod:`plait.frontend.grad_replay`): samples are computed under ``no_grad``, without the
  history eager's tensors carry, so the tape makes them again on the caller's tensors instead
  of the swaps below;
- a capture holding values it did not compute (``arithmetic="skip"`` where
  :mod:`plait.frontend.late_values` could not compute them);
- a capture whose random number generator moved (capture draws from another state);
- a call whose tensor, buffer or constant has strides its clone did not keep (a view of it
  could not be made again on the caller's), or a traced view that reads it as another dtype;
- a call whose tensor written before the refusal shares memory with another (the same tensor
  passed twice, an input viewing a buffer): each was traced through a clone of its own;
- ``fullgraph=True`` (the refusal raises) and ``plait.capture`` (a capture never writes the
  caller's tensors).
Refusals other than a read of tensor data (a call with no capture rule, a limitation) never
continue: their call may have run on the samples already.

A tracer the program keeps where :func:`untraced` does not look (the closure of a function it
does not reach through those, a global it never read) behaves as its sample from then on
(:class:`plait.frontend.capture_values.Tracer`); the closures of the functions it reaches (a
module's hooks, a function a global names) hold samples.
"""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from plait import logs
from plait.errors import GraphCaptureError
from plait.frontend import pytree, tensor_attr_writes
from plait.frontend.capture_values import Tracer
from plait.frontend.grad_replay import GradTape
from plait.frontend.guard_plan import _shares_memory
from plait.frontend.input_writes import InputObjects, write_back
from plait.frontend.pyrollback import Originals
from plait.frontend.pyvalues import _is_value_object
from plait.frontend.state import ModuleState
from plait.frontend.symints import TracedInt, TracedSize, plain_int
from plait.frontend.views import storage_id

if TYPE_CHECKING:
    from plait.frontend.capture_values import CaptureValues, Lift

_DEPTH = 64  # NOTE: how deep untraced looks into what the program holds


class Continuation:
    """Whether, and how, one capture continues its call eagerly (see the module doc)."""

    def __init__(self) -> None:
        self.tracers: list[weakref.ref[Tracer]] = []  # NOTE: every tracer made, while it lives
        self.on = False
        self.error: GraphCaptureError | None = None
        self.leaves: list[Any] = []  # NOTE: the caller's leaves and module state, by lift ref
        self.state: list[Any] = []
        self.result: Any = None  # NOTE: the call's, once its program returned
        # NOTE: under grad mode, the program's calls, to make its tensors again with eager's
        # history at a refusal (plait.frontend.grad_replay)
        self.tape: GradTape | None = GradTape() if torch.is_grad_enabled() else None

    def made(self, t: Tracer) -> None:
        self.tracers.append(weakref.ref(t))
        if self.tape is not None and t._lift is not None:
            self.tape.root(t._plain, t._lift)

    def original(self, lift: Lift) -> torch.Tensor:
        if lift.kind == "user":
            return self.leaves[lift.ref]
        if lift.kind in ("param", "buffer"):
            return self.state[lift.ref]
        return lift.ref

    def begin(self, cx: CaptureValues, err: GraphCaptureError) -> bool:
        """At the refusal ``err`` of a read of tensor data: continue the call eagerly where
        that is sound (the samples become the caller's tensors), else False."""
        live = [t for t in (r() for r in self.tracers) if t is not None]
        if self.tape is not None:
            return self._begin_with_grad(cx, err, live)
        why = _blocked(cx, live)
        clones: dict[int, tuple[Tracer, torch.Tensor]] = {}
        roots: list[tuple[Tracer, torch.Tensor]] = []
        for t in live:
            lift = t._lift
            if why is None and lift is not None and t._root is None:
                roots.append((t, self.original(lift)))
            if why is None and lift is not None and t._root is None and lift.kind != "param":
                orig = self.original(lift)
                if t._plain.stride() != orig.stride() or t._plain.dtype != orig.dtype:
                    why = f"{lift.name} has strides its clone did not keep"
                clones[storage_id(t._plain)] = (t, orig)
        why = why or _written_alias(cx, roots)
        for t in live:
            hit = clones.get(storage_id(t._plain))
            if why is None and hit is not None and t._plain.dtype != hit[1].dtype:
                why = "a traced view reads a tensor of the call as another dtype"
        if why is not None:
            logs.debug("capture", "continue", f"the call runs eagerly from the start: {why}")
            return False
        with torch._C.DisableTorchFunction(), torch.no_grad():
            for root, orig in clones.values():
                if id(root) in cx.mutated or root._plain._version:
                    orig.copy_(root._plain)  # NOTE: what the program wrote so far, once
            for t in live:
                hit = clones.get(storage_id(t._plain))
                if t._lift is not None and t._root is None:
                    t._plain = self.original(t._lift)
                elif hit is not None:
                    orig, p = hit[1], t._plain
                    offset = p.storage_offset() + orig.storage_offset()
                    t._plain = orig.as_strided(p.shape, p.stride(), offset)
        return self._going_on(cx, err, replayed=False)

    def _going_on(self, cx: CaptureValues, err: GraphCaptureError, *, replayed: bool) -> bool:
        """The call goes on eagerly from ``err``; the generator gets the caller's state back,
        unless a replay drew from it (then it is where eager's calls left it)."""
        if not replayed:
            torch.default_generator.set_state(cx.rng.caller)
        for t in [r() for r in self.tracers]:
            if t is not None:  # NOTE: the attributes it set so far are the caller's tensor's
                tensor_attr_writes.continued(t)
        self.tracers.clear()
        self.on, self.error = True, err
        logs.debug("capture", "continue", f"the call goes on eagerly after: {err}")
        return True

    def _begin_with_grad(self, cx: CaptureValues, err: GraphCaptureError, live: list) -> bool:
        """Under grad mode: the program's calls so far made again on the caller's tensors
        (:mod:`plait.frontend.grad_replay`), each tensor it holds then eager's, history
        included; False where the tape cannot."""
        assert self.tape is not None
        held = [t._plain for t in live]
        why = cx.rng.redrawable(cx.builder.graph.nodes) or self.tape.why_not(held)
        if why is not None:
            logs.debug("capture", "continue", f"the call runs eagerly from the start: {why}")
            return False
        # NOTE: the replay draws what eager drew, from the caller's state, and leaves the
        # generator where eager's calls left it
        torch.default_generator.set_state(cx.rng.caller)
        made = self.tape.replay(held, self.original)
        for t, m in zip(live, made):
            t._plain = m
        return self._going_on(cx, err, replayed=True)

    def finish(
        self,
        out: Any,
        objects: InputObjects,
        callers: list[Any],
        ms: ModuleState | None,
        originals: Originals,
        leaves: list[Any],
    ) -> None:
        """After the program returned ``out`` (or raised: None): its result (``result``), the
        containers of the call (written back into the caller's), its module's attributes,
        the Python values it read and the objects the call passed as they are hold samples in
        place of tracers, and the call's containers in place of capture's."""
        memo = {id(c): (c, callers[k]) for k, c in enumerate(objects.made)}
        written = objects.changed()
        if written:
            write_back(callers, written, untraced(objects.finals(written), memo))
        self.result = untraced(out, memo)
        for namespace in originals.namespaces():  # NOTE: whole: a store it never read too
            untraced(namespace, memo)
        for root in [ms.module] if ms is not None else []:
            untraced(root, memo)
        for leaf in leaves:
            untraced(leaf, memo)

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A torch call after the refusal: run for real on the samples, plain tensors out."""
        return func(*plain(args), **plain(kwargs))


def _blocked(cx: CaptureValues, live: list[Tracer]) -> str | None:
    if cx.ambient_grad:
        return "the call runs with grad mode on"
    if cx.unsampled is not None and cx.unsampled.storages:
        return "the capture holds values it did not compute"
    if not cx.rng.untouched():
        return "the random number generator moved during the capture"
    if cx.grad_enabled:
        return "the program turned grad mode on"
    return None


def _written_alias(cx: CaptureValues, roots: list[tuple[Tracer, torch.Tensor]]) -> str | None:
    """Why not, where the program wrote a tensor of the call (``roots``: each with the caller's)
    that shares memory with another whose sample is a copy of its own (an input viewing a
    buffer): what was read of the other before the refusal is not what eager read."""
    for t, orig in roots:
        if id(t) in cx.mutated or t._plain._version:
            for u, other in roots:
                apart = not _shares_memory(t._plain, [u._plain])
                if u is not t and apart and _shares_memory(orig, [other]):
                    return f"{t._lift.name if t._lift else 'a tensor'} shares memory with another"
    return None


def plain(x: Any) -> Any:
    """``x`` (a call's arguments) with each tracer its sample and each traced size an int."""
    cls = type(x)
    if cls is Tracer:
        return x._plain
    if cls is TracedInt:
        return plain_int(x)
    if cls is TracedSize or cls is torch.Size:
        return torch.Size(plain_int(d) for d in x)
    if cls is tuple or cls is list:
        return cls(plain(v) for v in x)
    if cls is dict:
        return {k: plain(v) for k, v in x.items()}
    if cls is slice:
        return slice(plain(x.start), plain(x.stop), plain(x.step))
    if isinstance(x, (list, tuple)) and pytree.is_named_sequence(x):
        return pytree.same_type(x, [plain(v) for v in x])
    return x


def kept_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """A call on a tensor of a finished capture, kept in Python state: on its sample where
    that capture continued its call (the sample is eager's tensor), else refused."""
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, Tracer) and t._cx.continued:
                return func(*plain(args), **plain(kwargs))
    _refuse_kept(func, args, kwargs)
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


def _refuse_kept(func: Any, args: Any, kwargs: dict) -> None:
    """Raises where a tensor of a finished capture is used: the program kept it in Python
    state (``self.last = y``, a global, a list), which a compiled call never sets again, so
    its value is the capture's, stale or never computed (a skipped convolution's)."""
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, Tracer) and t._cx.finished:
                raise GraphCaptureError(
                    "capture",
                    f"a tensor made by {t._made_by} while plait captured the program was kept "
                    f"in Python state (a module attribute, a global, a container) and is used "
                    f"now by {getattr(func, '__name__', func)}: a compiled call does not set "
                    "that state again, so its value is not the latest call's (return the "
                    "tensor from the program instead, or run the program without plait)",
                    kind="limitation",
                )


def untraced(x: Any, memo: dict[int, tuple[Any, Any]], depth: int = 0) -> Any:
    """``x`` with each tracer its sample and each traced size an int, changed in place where
    it is a list, a dict, a set, an object's attributes or a function's closure (a hook's,
    in a module's hook table; a tuple is rebuilt); ``memo``: by id, each object met and what
    it became (objects put there first become their value)."""
    if isinstance(x, Tracer):
        return x._plain
    if isinstance(x, (TracedInt, TracedSize)):
        return plain(x)
    met = memo.get(id(x))
    if met is not None:
        return met[1]
    if depth > _DEPTH or isinstance(x, (torch.Tensor, type, str, bytes, types.ModuleType)):
        return x
    memo[id(x)] = (x, x)
    more = depth + 1
    if isinstance(x, types.FunctionType):  # NOTE: its closure's cells (a hook's list)
        for cell in x.__closure__ or ():
            try:
                v = cell.cell_contents
            except ValueError:  # NOTE: a cell not set yet
                continue
            new = untraced(v, memo, more)
            if new is not v:
                cell.cell_contents = new
        return x
    if isinstance(x, tuple):
        items = [untraced(v, memo, more) for v in x]
        if any(a is not b for a, b in zip(items, x)):
            memo[id(x)] = (x, pytree.same_type(x, items) if type(x) is not tuple else tuple(items))
        return memo[id(x)][1]
    if isinstance(x, list):
        for i, v in enumerate(list.copy(x)):
            new = untraced(v, memo, more)
            if new is not v:
                x[i] = new
    elif isinstance(x, dict):
        for k, v in list(dict.items(x)):
            new = untraced(v, memo, more)
            if new is not v:
                x[k] = new
    elif isinstance(x, set):
        items = [untraced(v, memo, more) for v in x]
        if any(a is not b for a, b in zip(items, x)):
            x.clear()
            x.update(items)
    namespace = getattr(x, "__dict__", None)
    if type(namespace) is dict and (isinstance(x, nn.Module) or _is_value_object(x, type(x))):
        for k, v in list(namespace.items()):
            new = untraced(v, memo, more)
            if new is not v:
                if isinstance(x, nn.Module):
                    namespace[k] = new
                else:
                    object.__setattr__(x, k, new)
    return x
