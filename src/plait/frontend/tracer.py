"""The capture context: it records every torch-level call of one run of the program into a
graph, running each call for real on the samples of its tracers (the tensors and their IR values
are :mod:`plait.frontend.capture_values`'s).

NOTE: invariants.
- Every call runs for real on the samples, so shapes, dtypes, aliasing and data-dependent
  behaviour are exactly eager PyTorch's; the IR value a rule gives must have the type of eager's
  result (:meth:`CaptureContext.check`). The one exception, a capture that skips arithmetic,
  leaves the heaviest calls uncomputed and never reads what they would have computed
  (:mod:`plait.frontend.unsampled`).
- Sample computations run under ``DisableTorchFunctionSubclass`` and ``no_grad``; nothing inside
  the context ever calls torch on a Tracer.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> prog = capture_program(lambda x: x.relu() + 1, (torch.randn(2, 3),))
    >>> [n.op for n in prog.graph.nodes]
    ['relu', 'add']
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from plait.frontend import datadep, pytree, stride_choices
from plait.frontend.call_keywords import fit_rule
from plait.frontend.capture_values import CaptureValues, Tracer
from plait.frontend.compiling_flag import compiling
from plait.frontend.constant_reads import NOT_CONSTANT, constant_read
from plait.frontend.late_values import compute_or_resample
from plait.frontend.nested_fast_path import watching
from plait.frontend.op_names import op_name
from plait.frontend.opaque import run_opaque
from plait.frontend.pyvalues import Root
from plait.frontend.set_storage import refusing_set
from plait.frontend.symints import TracedInt, TracedSize, plain_int, pop_sink, push_sink
from plait.frontend.table import InPlace, NoIROp, Rule, Viewed, lookup
from plait.frontend.tensor_attr_writes import same_tensor
from plait.frontend.unsampled import SKIPPED, overwrites_garbage, probe, skippable
from plait.frontend.views import ViewStep, storage_id, tensors_in
from plait.frontend.writes import partial_overlap, write_targets
from plait.ir import TensorType, Value

_HINT_FULLGRAPH = (
    "plait captures whole graphs; with fullgraph=False, plait.compile runs such a program "
    "eagerly instead (with a warning, recorded)."
)


class _Mode(TorchFunctionMode):
    """Sees every torch call during capture, factories (no tensor argument) included."""

    plait_capture = True  # NOTE: plait.ambient_modes.capture_running looks for it

    def __init__(self, cx: CaptureContext) -> None:
        super().__init__()
        self.cx = cx

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.cx.dispatch(func, args, kwargs or {})


# NOTE: exact types that unwrap returns as they are (no tensor, size, traced int or container)
_KEPT = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        type(None),
        type(Ellipsis),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)


# NOTE: argument types whose use runs no Python of the program (exact types: a subclass of int
# or a tensor subclass may define Python methods that PyTorch calls)
_PLAIN_LEAVES = frozenset({Tracer, torch.Tensor, torch.nn.Parameter, TracedInt, *_KEPT})


# NOTE: callables hashed and named by identity alone (a torch function, a Python function)
_PLAIN_FUNCS = frozenset(
    {
        types.BuiltinFunctionType,
        types.FunctionType,
        types.MethodDescriptorType,
        types.WrapperDescriptorType,
        types.MethodWrapperType,
        types.BuiltinMethodType,
    }
)


def _plain_call(x: Any) -> bool:
    """Whether ``x`` (a call's arguments) holds only plain values (:data:`_PLAIN_LEAVES`) in
    tuples, lists, dicts, ``torch.Size``, traced sizes and slices."""
    cls = type(x)
    if cls in _PLAIN_LEAVES:
        return True
    if cls is tuple or cls is list or cls is torch.Size or cls is TracedSize:
        return all(_plain_call(v) for v in x)
    if cls is dict:
        return all(type(k) is str and _plain_call(v) for k, v in x.items())
    if cls is slice:
        return _plain_call((x.start, x.stop, x.step))
    return False


def _requires_grad(x: Any) -> bool:
    """Whether ``x`` (a call's arguments) holds a traced tensor that requires grad."""
    if isinstance(x, Tracer):
        return x._rg
    if isinstance(x, (tuple, list)):
        return any(_requires_grad(v) for v in x)
    if isinstance(x, dict):
        return any(_requires_grad(v) for v in x.values())
    return False


class CaptureContext(CaptureValues):
    """Records one run of the program into a graph: activation and the dispatch of each call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # NOTE: (leaf, name): a Python attribute the program looked for on an input tensor,
        # which lacked it (plait.frontend.tensor_attrs): guarded absent on later calls
        self.absent_attrs: set[tuple[int, str]] = set()
        # NOTE: (leaf, first): an input tensor that is the same object as an earlier leaf of
        # the call (``f(x, x)``): traced as that leaf, so ``a is b`` holds as in eager
        self.same_leaves: list[tuple[int, int]] = []
        # NOTE: (leaf, entry): an input tensor that is the module's parameter or buffer
        # ``entry`` (``m(m.weight)``): traced as that state tensor, as eager has one object
        self.state_leaves: list[tuple[int, int]] = []
        # NOTE: the Python values a refusal was decided by (the attention fast-path flag):
        # the fallback's guards hold them (plait.frontend.refused_after_run)
        self.refusal_reads: list[Root] = []

    # --- activation ---------------------------------------------------------------------------
    @contextmanager
    def activate(self) -> Iterator[None]:
        prev = CaptureValues.active
        CaptureValues.active = self
        push_sink(self)
        try:
            # NOTE: not with dynamic shapes: the compiling paths of transformers' masks index
            # with tensors on symbolic dims, which have no IR op and cannot be opaque nodes
            flag = compiling() if not self.dynamic else nullcontext()
            with _Mode(self), refusing_set(self), flag, watching():
                yield
            if self.grad_enabled != self.ambient_grad and not self.continued:
                self.limitation(
                    f"the program leaves grad mode {self.grad_enabled} (it was "
                    f"{self.ambient_grad}); a compiled call would not change it"
                )
        finally:
            pop_sink(self)
            CaptureValues.active = prev
            if not self.continued:  # NOTE: eager leaves what the program set, once it continued
                torch._C._set_grad_enabled(self.ambient_grad)  # NOTE: even when capture failed

    # --- dispatch --------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        # NOTE: Python reads need not see plait's own code (the RNG checks, the name and rule
        # lookups of a torch callable, hashed by identity), nor a call with a rule whose
        # arguments are plain values: it runs only PyTorch's and plait's code (a user object's
        # __index__ or __float__ is the program's code, and a call with no rule may run a user
        # op's Python). They see the rest from before anything reads the arguments.
        if self.continuation is not None and self.continuation.on:
            return self.continuation.call(func, args, kwargs)
        reads = self.reads
        paused = reads is not None and type(func) in _PLAIN_FUNCS and reads.pause()
        try:
            if paused and not _plain_call((args, kwargs)):
                paused = False
                reads.resume()  # type: ignore[union-attr]
            return self._dispatch_call(func, args, kwargs, paused)
        finally:
            if paused:
                reads.resume()  # type: ignore[union-attr]

    def _dispatch_call(self, func: Any, args: tuple, kwargs: dict, paused: bool) -> Any:
        """``paused``: Python reads are paused, and the arguments are plain values."""
        if self.error is not None:
            raise self.error
        if torch._C._functorch.maybe_current_level() is not None:
            self.limitation(
                f"{op_name(func)} runs inside a torch.func transform (vmap, grad, jacrev, "
                "jvp ...), whose batched and dual tensors capture cannot hold"
            )
        if self.grad_enabled and not torch.is_grad_enabled():
            # NOTE: grad mode turned off where no call of the program showed it: PyTorch's C++
            # did, inside ``torch.inference_mode()`` or a custom autograd.Function's forward
            self._refuse_unseen_backward(func, args, kwargs)
            self.grad_enabled = False  # NOTE: inference mode: a `torch.no_grad()` region
            try:
                return self._dispatch_call(func, args, kwargs, paused)
            finally:
                self.grad_enabled = True
        prev = self.current
        self.current = "the random number generator"
        try:
            self.rng.before(self)
            self.current = op_name(func)
            first = len(self.builder.graph.nodes)
            rule = lookup(func)
            reads = self.reads
            resumed = paused and rule is None
            if resumed:
                reads.resume()  # type: ignore[union-attr]
            # NOTE: a callable hashed some other way (an OpOverload): paused for the call alone
            late = (
                not paused
                and rule is not None
                and reads is not None
                and type(func) not in _PLAIN_FUNCS
                and _plain_call((args, kwargs))
                and reads.pause()
            )
            try:
                if self.unbacked and rule is None:
                    datadep.refuse_unruled(self, args, kwargs)
                result = self._dispatch_unsampled(rule, func, args, kwargs)
            finally:
                if resumed:
                    reads.pause()  # type: ignore[union-attr]
                if late:
                    reads.resume()  # type: ignore[union-attr]
            if self.continued:  # NOTE: this call (a refused read) went on eagerly
                return result
            if self.unbacked:
                datadep.check_new_nodes(self, first)
            if rule is None or rule.kind != "meta":  # NOTE: a metadata read computes nothing
                self.rng.after(self, first)
            return result
        finally:
            self.current = prev

    def _refuse_unseen_backward(self, func: Any, args: tuple, kwargs: dict) -> None:
        """Outside ``torch.inference_mode()``, a call PyTorch runs with grad mode off while the
        program's is on is a custom ``torch.autograd.Function``'s forward (PyTorch's
        ``Function.apply`` turns it off in C++, no torch function): eager differentiates the
        Function by its own backward, capture would differentiate the forward's ops. Refused
        where the call reads a tensor that requires grad (a recorded fallback: eager autograd
        runs the Function's backward); with nothing requiring grad, the forward is the value."""
        if torch.is_inference_mode_enabled() or not _requires_grad((args, kwargs)):
            return
        self.current = op_name(func)
        self.limitation(
            f"{self.current} runs with grad mode off inside a custom torch.autograd.Function's "
            "forward on a tensor that requires grad: eager differentiates the Function by its "
            "own backward, which a captured graph does not hold (it would differentiate the "
            "forward instead); call it outside the compiled function, or under torch.no_grad()"
        )

    def _dispatch_unsampled(self, rule: Rule | None, func: Any, args: tuple, kwargs: dict) -> Any:
        unbacked = len(self.unbacked)
        unsampled = self.unsampled
        writing = unsampled is not None and unsampled.writing
        if unsampled is not None:
            unsampled.writing = False  # NOTE: this call's sample raises it
        try:
            result = self._dispatch(rule, func, args, kwargs)
        finally:
            if unsampled is not None:
                unsampled.writing = writing  # NOTE: an enclosing call's, while its rule runs
        if self.unsampled and len(self.unbacked) != unbacked:
            self.resample(f"{self.current}'s result size may depend on uncomputed values")
        return result

    def _dispatch(self, rule: Rule | None, func: Any, args: tuple, kwargs: dict) -> Any:
        # NOTE: a refused read under grad mode makes every value again from the tape, computed
        # ones and skipped ones alike: computing the skipped ones first (or capturing again to)
        # would run the program's Python once more for nothing
        if self.unsampled and (rule is None or (rule.kind == "data" and not self._tape_viable())):
            found: list[Tracer] = []
            self.unwrap((args, kwargs), found)
            if self.unsampled.holds(t._plain for t in found):
                compute_or_resample(self, f"{self.current} reads values capture did not compute")
        if rule is None:
            return run_opaque(self, func, args, kwargs)
        if rule.fn is not None:  # NOTE: keywords by PyTorch's names, where the rule's differ
            leading = 2 if rule.kind == "op" else 1
            args, kwargs, bound = fit_rule(rule.fn, leading, func, args, kwargs)
            if not bound and rule.kind == "op":
                said = f"its parameters do not take these arguments (keywords {sorted(kwargs)})"
                return run_opaque(self, func, args, kwargs, rule_said=said)
        if rule.kind == "meta":
            assert rule.fn is not None
            return rule.fn(self, *args, **kwargs)
        if rule.kind == "data":
            folded = constant_read(self, func, args, kwargs)
            if folded is not NOT_CONSTANT:
                return folded
            err = self.error_of(
                "data-dependent",
                f"{rule.what} reads tensor data; a graph cannot branch on or "
                "export the values it computes",
                _HINT_FULLGRAPH,
            )
            if self.continuation is not None and self.continuation.begin(self, err):
                return self.continuation.call(func, args, kwargs)
            self.error = self.error or err
            raise err
        return self.run_op(rule, func, args, kwargs)

    def unwrap(self, x: Any, found: list[Tracer]) -> Any:
        cls = type(x)
        if cls in _KEPT:  # NOTE: what the checks below return as it is, by exact type
            return x
        if cls is tuple or cls is list:
            return cls([self.unwrap(v, found) for v in x])
        if isinstance(x, torch.Tensor):
            tr = self.tracer(x)
            found.append(tr)
            return tr._plain
        if isinstance(x, (TracedSize, torch.Size)):  # NOTE: a Size may hold traced sizes
            return torch.Size(plain_int(d) for d in x)
        if isinstance(x, TracedInt):
            return plain_int(x)
        if isinstance(x, slice):  # NOTE: plain bounds, so PyTorch never specializes them
            return slice(plain_int(x.start), plain_int(x.stop), plain_int(x.step))
        if type(x) in (list, tuple) or pytree.is_named_sequence(x):
            return pytree.same_type(x, [self.unwrap(v, found) for v in x])
        if isinstance(x, dict):
            return {k: self.unwrap(v, found) for k, v in x.items()}
        return x

    def sample(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, list[Tracer]]:
        """Run the real call on the samples (in-place effects included)."""
        found: list[Tracer] = []
        pargs = self.unwrap(args, found)
        pkwargs = self.unwrap(kwargs, found)
        unsampled = self.unsampled
        garbage = bool(unsampled) and unsampled.holds(t._plain for t in found)  # type: ignore[union-attr]
        versions = [t._plain._version for t in found] if garbage else []
        try:
            with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
                out = func(*pargs, **pkwargs)
        except Exception as exc:
            # NOTE: it may refuse the garbage (an index out of range), not eager's values
            if garbage:
                self.resample(f"{self.current} raised on values capture did not compute: {exc}")
            raise
        self._refuse_unstrided(func, out)
        self._taped(func, pargs, pkwargs, out)
        if garbage:
            assert unsampled is not None
            if unsampled.replay is not None:
                plains = [t._plain for t in found]
                computed = [not unsampled.holds([p]) for p in plains]
                unsampled.replay.ran(func, pargs, pkwargs, out, plains, computed, versions)
            unsampled.add(out)  # NOTE: in-place calls return their target: it is garbage too
            # NOTE: and every tensor the call wrote: ``buf[:] = y`` returns None; a training
            # batch norm's running stats are written without a version bump, and its rule
            # rebinds them (assign, which marks them while this flag is up)
            unsampled.add([t._plain for t, v in zip(found, versions) if t._plain._version != v])
            unsampled.writing = True
        return out, found

    def _uncomputed(
        self, rule: Rule, func: Any, args: tuple, kwargs: dict, targets: list[Any]
    ) -> Any:
        """The call's traced result with an uninitialized sample, when it may be left
        uncomputed (:mod:`plait.frontend.unsampled`); else None."""
        unsampled = self.unsampled
        assert unsampled is not None and rule.fn is not None
        in_place = overwrites_garbage(self.current, targets, unsampled)
        if not in_place and func not in SKIPPED:
            return None  # NOTE: most calls: decided before their arguments are unwrapped
        if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
            return None  # NOTE: now, not at capture's start: the program may enter autocast
        found: list[Tracer] = []
        pargs, pkwargs = self.unwrap((args, kwargs), found)
        plains = [t._plain for t in found]
        if in_place:
            # NOTE: eager returns the target, its metadata unchanged (checked below)
            out = self.tracer(targets[0])._plain
            if probe(func, pargs, pkwargs, target=out) is None:
                return None
            empty = None
        elif skippable(func, plains, args, kwargs):
            out = None
            empty = probe(func, pargs, pkwargs)
            if empty is None:
                return None
        else:
            return None
        unsampled.tried = True
        self.rule_depth += 1
        try:
            ir = rule.fn(self, out, *args, **kwargs)
        except NoIROp:
            self.resample(f"{self.current}'s capture rule needs its result")
        finally:
            self.rule_depth -= 1
        if out is not None:
            if rule.inplace and isinstance(ir, Value):
                ir = InPlace(args[0], ir)
            ty = ir.value.type if isinstance(ir, InPlace) else None
            if not isinstance(ty, TensorType) or (
                ty.with_shape(self.sample_shape(ty)) != self.type_of_plain(out)
            ):
                self.resample(f"{self.current} changes its target's type")
        elif not isinstance(ir, Value) or not isinstance(ir.type, TensorType):
            self.resample(f"{self.current}'s capture rule gave no single tensor")
        else:
            ty = ir.type
            shape = self.sample_shape(ty)
            assert isinstance(empty, torch.Tensor)
            if empty.dtype != ty.dtype or tuple(empty.shape[1:]) != shape[1:]:
                self.resample(f"{self.current}'s capture rule disagrees with eager's probe")
            out = torch.empty(shape, dtype=ty.dtype, device=ty.device)
            unsampled.add(out)
        unsampled.calls += 1
        if unsampled.replay is not None:
            computed = [p for p in plains if not unsampled.holds([p])]
            unsampled.replay.skipped(func, pargs, pkwargs, out, computed, fresh=empty is not None)
        self._taped(func, pargs, pkwargs, out)
        grad = rule.grad and self.grad_enabled and any(t._rg for t in found)
        return self.wrap(ir, out, found, grad)

    def _tape_viable(self) -> bool:
        tape = self.continuation.tape if self.continuation is not None else None
        return tape is not None and tape.broken is None

    def _taped(self, func: Any, pargs: Any, pkwargs: dict, out: Any) -> None:
        """A call of the program itself (not one a capture rule makes) recorded on the grad
        tape, where there is one (:mod:`plait.frontend.grad_replay`)."""
        tape = self.continuation.tape if self.continuation is not None else None
        if tape is not None and not self.rule_depth:
            tape.record(func, pargs, pkwargs, out, grad=torch.is_grad_enabled())

    def _refuse_unstrided(self, func: Any, out: Any) -> None:
        """A sparse, mkldnn or other non-strided result has no IR type (a tensor type is dense
        and strided): refused here, loudly, never run as if it were dense."""
        leaves = out if isinstance(out, (list, tuple)) else (out,)
        for t in leaves:
            if isinstance(t, torch.Tensor) and t.layout != torch.strided:
                name = getattr(func, "__name__", repr(func))
                self.limitation(
                    f"{name} returns a {t.layout} tensor; plait's IR holds dense strided tensors "
                    "only: call it outside the compiled function"
                )

    def _refuse_partial_overlap(self, targets: list[Any], args: tuple, kwargs: dict) -> None:
        """An operand that shares memory with a tensor the call writes, other than element for
        element (:func:`plait.frontend.writes.partial_overlap`), is refused: eager's result
        depends on its order of visits."""
        for t in targets:
            if not isinstance(t, torch.Tensor):
                continue
            written = self._plain_of(t)
            operands = tensors_in((args, kwargs))
            if self.current.endswith("__setitem__") and len(args) == 3 and not tensors_in(args[1]):
                # NOTE: a basic index writes its own view of the target (``x[:, 1:] += 1``
                # reads and writes the same elements): that view is what the value may overlap
                written, operands = written[self.unwrap(args[1], [])], tensors_in(args[2])
            for a in operands:
                if a is not t and partial_overlap(written, self._plain_of(a)):
                    self.limitation(
                        f"{self.current} writes a tensor in place that one of its operands "
                        "overlaps in memory (a shifted or broadcast view of it): eager reads "
                        "elements the same call already wrote, in its own order; write into a "
                        "copy (.clone()) instead"
                    )

    def _values_before(self, targets: list[Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The samples an in-place call is about to write, each with a copy of its values."""
        out = []
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            for t in targets:
                if isinstance(t, torch.Tensor):
                    plain = self._plain_of(t)
                    out.append((plain, plain.clone()))
        return out

    def _undo_write(self, before: list[tuple[torch.Tensor, torch.Tensor]], func: Any) -> None:
        """Put back the samples' values from before a call (and take the call off the grad
        tape), so that the call can be captured another way and run on them again."""
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            for plain, values in before:
                plain.copy_(values)
        tape = self.continuation.tape if self.continuation is not None else None
        if tape is not None and not self.rule_depth and tape.calls and tape.calls[-1][0] is func:
            tape.calls.pop()

    def _plain_of(self, t: torch.Tensor) -> torch.Tensor:
        return self.tracer(t)._plain if isinstance(t, Tracer) else t

    def run_op(self, rule: Rule, func: Any, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("out") is not None:
            self.limitation("out= arguments write into a given tensor; plait does not capture them")
        targets = write_targets(self.current, func, args, kwargs)
        self.check_writable(targets)
        self._refuse_partial_overlap(targets, args, kwargs)
        if self.unsampled is not None:
            made = self._uncomputed(rule, func, args, kwargs, targets)
            if made is not None:
                return made
        before = self._values_before(targets)
        out, inputs = self.sample(func, args, kwargs)
        if out is NotImplemented:  # e.g. `tensor == None`: Python falls back to identity
            return out
        assert rule.fn is not None
        if self.autocast:
            from plait.frontend.autocast import autocast_inputs

            args, kwargs = autocast_inputs(self, func, out, args, kwargs, rule.inplace)
        self.rule_depth += 1
        try:
            ir = rule.fn(self, out, *args, **kwargs)
        except NoIROp as exc:
            ir, rule_said = NoIROp, str(exc)
        finally:
            self.rule_depth -= 1
        if ir is NoIROp:  # NOTE: the rule has no IR form for this call
            if before:
                # NOTE: an in-place call: its write, undone on the samples, is made again by
                # its out-of-place form, whose result rebinds the target (opaque.run_opaque)
                self._undo_write(before, func)
                return run_opaque(self, func, args, kwargs, rule_said=rule_said)
            return run_opaque(self, func, args, kwargs, rule_said=rule_said, sampled=out)
        if rule.inplace:
            ir = InPlace(args[0], ir)
        grad = rule.grad and self.grad_enabled and any(t._rg for t in inputs)
        return self.wrap(ir, out, inputs, grad)

    def wrap(self, ir: Any, out: Any, inputs: list[Tracer], grad: bool) -> Any:
        if isinstance(ir, InPlace):
            self.assign(ir.target, ir.value, grad)
            target = self.tracer(ir.target)
            self.check(self.value(target), target._plain)
            return target
        if isinstance(ir, (Value, Viewed)):
            if not isinstance(out, torch.Tensor):
                self.limitation(f"capture rule gave a tensor where PyTorch returned {out!r}")
            return self.new_output(ir, out, inputs, grad)
        if isinstance(ir, (tuple, list)):
            if not isinstance(out, (tuple, list)) or len(out) != len(ir):
                self.limitation("capture rule output does not match PyTorch's")
            items = [self.wrap(i, o, inputs, grad) for i, o in zip(ir, out)]
            return pytree.same_type(out, items)
        return ir

    def new_output(
        self, ir: Value | Viewed, out: torch.Tensor, inputs: list[Tracer], grad: bool
    ) -> Tracer:
        value = ir.value if isinstance(ir, Viewed) else ir
        if self.ambient_grad and not self.grad_enabled and any(t._rg for t in inputs):
            value = self.call("detach", value)  # NOTE: computed inside `torch.no_grad()`
            if isinstance(ir, Viewed):
                ir = Viewed(value, ir.source, (*ir.steps, ViewStep("detach")), ir.by_strides)
        self.check(value, out)
        requires_grad = (grad and out.is_floating_point()) or out.requires_grad
        t = self.new_root(out, value, requires_grad)
        same_tensor(t, inputs, out)  # NOTE: eager returned an input itself: one dict
        source = _aliased(out, inputs)
        if source is None:
            if isinstance(ir, Viewed) and ir.by_strides:
                stride_choices.mark(self, self.tracer(ir.source), t)
            return t
        root = source._root if source._root is not None else source
        steps: tuple[ViewStep, ...] | None = None
        if isinstance(ir, Viewed) and ir.source is not None:
            src = self.tracer(ir.source)
            if src is source and src._steps is not None:
                steps = (*src._steps, *ir.steps)
        t._root, t._steps, t._seen = root, steps, root._mutations
        if isinstance(ir, Viewed) and ir.by_strides:
            stride_choices.mark(self, self.tracer(ir.source), t)
        return t

    def check(self, value: Value, plain: torch.Tensor) -> None:
        """NOTE: every IR value's type must equal the eager result's: a wrong rule fails here."""
        actual = self.type_of_plain(plain)
        expected = value.type
        assert isinstance(expected, TensorType)
        if not expected.is_static:
            expected = expected.with_shape(self.sample_shape(expected))
        if expected != actual:
            self.limitation(
                f"capture rule produced {value.type} where PyTorch produced {actual}"
                " (a bug in plait's capture table)"
            )

    def sample_shape(self, ty: TensorType) -> tuple[int, ...]:
        """``ty``'s shape at the samples' sizes."""
        if ty.is_static:
            return tuple(int(d) for d in ty.shape)
        sizes = {**self.bindings, **self.unbacked}
        return tuple(d if isinstance(d, int) else int(d.xreplace(sizes)) for d in ty.shape)


def _aliased(out: torch.Tensor, inputs: list[Tracer]) -> Tracer | None:
    ptr = storage_id(out)
    if not ptr:
        return None
    for t in inputs:
        if storage_id(t._plain) == ptr:
            return t
    return None


def pytree_leaves(x: Any) -> Iterator[Any]:
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from pytree_leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from pytree_leaves(v)
    else:
        yield x
