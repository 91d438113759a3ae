"""The value bookkeeping of a capture: the :class:`Tracer` tensor, the graph inputs it is lifted
from, each tracer's current IR value, the symbolic sizes of the inputs and in-place rebinding.
:class:`CaptureValues` holds the state of one capture; :class:`plait.frontend.tracer.CaptureContext`
adds activation and call dispatch on top of it.

NOTE: invariants.
- A :class:`Tracer` shares memory with its *sample*, a plain tensor on which every call runs for
  real (in-place ops included). Samples of user inputs and buffers are clones: capture never
  writes the caller's tensors.
- The IR is functional. An in-place op rebinds the mutated tensor's IR value; a write through a
  view is scattered into its root, and views of a mutated root replay their steps (views.py).
- A symbolic size is bound to the sample's size in ``bindings``; a rule that needs it as a plain
  int restarts capture with it static (:class:`Restart`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, cast

import sympy
import torch

from plait.errors import GraphCaptureError, InvalidOptionError, ProgramError, ProgramTypeError
from plait.frontend import datadep, stride_choices
from plait.frontend.default_dtype import capture_builder
from plait.frontend.dynamic_dims import DimPolicy
from plait.frontend.frames import user_frame
from plait.frontend.layout_clone import layout_clone
from plait.frontend.numpy_scalars import numpy_number
from plait.frontend.restart_sizes import sizes_to_make_static
from plait.frontend.rng import RngTracker
from plait.frontend.symints import TracedInt, TracedSize, plain_int
from plait.frontend.table import NoIROp
from plait.frontend.unsampled import Resample, Unsampled
from plait.frontend.views import ViewStep, keep_history, replay, scatter
from plait.ir import GraphBuilder, TensorType, Value
from plait.ir.ops import AttrError, TypeRuleError
from plait.ir.ops.registry import ComplexDtypeError

if TYPE_CHECKING:
    from plait.frontend.pyreads import PyReads
    from plait.frontend.tracer import CaptureContext


class Restart(BaseException):
    """Dynamic capture specialized a symbolic size; capture restarts with those sizes static.

    NOTE: a BaseException, so that a user's ``except Exception`` cannot swallow it."""

    def __init__(self, sizes: set[int], why: str) -> None:
        super().__init__(f"specialize sizes {sorted(sizes)}: {why}")
        self.sizes = sizes
        self.why = why


# NOTE: a tensor's own instance dict, read past a subclass's ``__dict__`` property
INSTANCE_DICT: Any = torch.Tensor.__dict__["__dict__"]


@dataclass
class Lift:
    """How a root tracer enters the graph: a graph input of ``kind`` named ``name``."""

    kind: str  # user | param | buffer | const
    name: str
    order: int
    ref: Any  # user: leaf index; param/buffer: state index; const: the tensor itself
    type: TensorType
    writeback: bool
    value: Value | None = None
    origin: Any = None  # NOTE: the caller's tensor (its Python attributes: tensor_attrs)
    attrs: dict[str, Any] | None = None  # NOTE: its tracer's: what the program sets on it


class Tracer(torch.Tensor):
    """A tensor seen by the program during capture (see the module docstring).

    NOTE: plait's fields are slots: the instance dict holds what the program sets, and
    ``vars(t)``/``t.__dict__`` answer what eager's tensor holds (:mod:`~.tensor_attrs`)."""

    __slots__ = (
        *("_cx", "_plain", "_value", "_root", "_steps", "_seen", "_mutations", "_lift"),
        *("_dim_exprs", "_made_by", "_rg", "_stride_choice", "_stride_output"),
    )
    _cx: CaptureContext
    _plain: torch.Tensor
    _value: Value | None
    _root: Tracer | None
    _steps: tuple[ViewStep, ...] | None
    _seen: int
    _mutations: int
    _lift: Lift | None
    _dim_exprs: tuple[Any, ...] | None
    _made_by: str
    _rg: bool  # requires_grad, kept here so reading it never dispatches
    # NOTE: on roots: a view-or-copy choice by strides involves it (plait.frontend.stride_choices)
    _stride_choice: str | None
    _stride_output: str | None

    @property
    def __dict__(self) -> dict[str, Any]:
        from plait.frontend.tensor_attrs import attribute_dict

        return attribute_dict(self)

    @__dict__.setter
    def __dict__(self, value: dict[str, Any]) -> None:
        from plait.frontend.tensor_attr_writes import replace_attributes

        replace_attributes(self, value)

    def __delattr__(self, name: str) -> None:
        from plait.frontend.tensor_attr_writes import delete_attribute

        delete_attribute(self, name)

    def __getattr__(self, name: str) -> Any:
        from plait.frontend.tensor_attrs import missing_attribute  # NOTE: reads pyreads

        found, owner = missing_attribute(self, name)
        if owner is not None:
            raise AttributeError(f"'{owner}' object has no attribute '{name}'")
        return found

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cx = CaptureValues.active
        if cx is None:
            from plait.frontend.continuation import kept_call

            return kept_call(func, args, kwargs or {})
        return cx.dispatch(func, args, kwargs or {})


class CaptureValues:
    """The state of one capture and the IR value of every tensor it has seen."""

    active: CaptureContext | None = None  # NOTE: the capture running on this process, if any

    def __init__(
        self,
        *,
        fullgraph: bool,
        dynamic: bool,
        static_sizes: set[int],
        dims: DimPolicy | None = None,
        arithmetic: str = "run",
        continuation: bool = False,
    ) -> None:
        from plait.frontend.continuation import Continuation
        from plait.frontend.late_values import Replay

        self.builder: GraphBuilder = capture_builder()
        # NOTE: None: every call runs; else the storages left uncomputed (frontend.unsampled)
        self.unsampled: Unsampled | None = Unsampled() if arithmetic == "skip" else None
        self.fullgraph = fullgraph
        # NOTE: a refused read of tensor data may continue the call eagerly (its Python once:
        # plait.frontend.continuation), and a read of skipped values compute them then
        go_on = continuation and not fullgraph
        self.continuation: Continuation | None = Continuation() if go_on else None
        if go_on and self.unsampled is not None:
            self.unsampled.replay = Replay()
        # NOTE: which input dims are symbolic (frontend.dynamic_dims); ``dynamic`` says some are
        self.dims = dims if dims is not None else DimPolicy(every=dynamic)
        self.dynamic = dynamic or self.dims.active
        # NOTE: > 0 while a capture rule runs: an IR op rejecting the rule's call then sends
        # the call to the ATen path (eager accepted it), not the whole program to eager
        self.rule_depth = 0
        self.static_sizes = static_sizes
        self.lifts: list[Lift] = []
        self.consts: dict[int, Tracer] = {}
        # NOTE: id -> path of each input tensor of the call: one the program reads also as a
        # constant (a global, a closure) is refused, guarded by plait.frontend.identity_guard
        self.input_paths: dict[int, str] = {}
        # NOTE: TensorType.of of a (shape, dtype, device): a type is a frozen value
        self._plain_types: dict[tuple[Any, ...], TensorType] = {}
        self.mutated: dict[int, Tracer] = {}
        self.predicates: dict[tuple[str, bool], tuple[Any, bool]] = {}
        self.symbols: dict[sympy.Symbol, tuple[int, int, str]] = {}
        self.duck: list[tuple[int, int, str, sympy.Symbol]] = []
        self.bindings: dict[sympy.Symbol, int] = {}
        # NOTE: unbacked sizes (dd0, ...: nonzero's row count) as the samples have them: only
        # to check capture rules against eager; never guarded (plait.frontend.datadep)
        self.unbacked: dict[sympy.Symbol, int] = {}
        self._size_symbols: dict[int, sympy.Symbol] = {}
        self._named_symbols: dict[str, sympy.Symbol] = {}
        self.opaque_counts: Counter[str] = Counter()
        self.opaque_reasons: dict[str, str] = {}
        self.error: BaseException | None = None
        self.current = "<capture>"
        # NOTE: set when the capture ends: its tensors kept in Python state are refused after
        self.finished = False
        # NOTE: the recorder of the Python values the program reads (set while it runs)
        self.reads: PyReads | None = None
        # NOTE: the user inputs (leaf indices) that require grad and are not autograd leaves
        self.nonleaf_inputs: set[int] = set()
        # NOTE: grad mode as the program runs it: `torch.no_grad()` inside the program turns
        # it off (lower_meta); values computed then from tensors that require grad are
        # detached in the graph, as eager's carry no gradient.
        self.ambient_grad = torch.is_grad_enabled()
        self.grad_enabled = self.ambient_grad
        # NOTE: under torch.autocast every sample runs autocast's casts; capture writes them
        # into the graph (autocast_inputs) and the compiled program runs with autocast off
        self.autocast = any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))
        # NOTE: a read of a tensor's layout (is_contiguous) specializes on the strides of the
        # inputs: the guards then pin them (the first such read, for the reason).
        self.layout_read: str | None = None
        # NOTE: an output whose memory format eager took from its operands' layouts
        # (output_views.FORMAT_READ): pins them as a layout read does, unless one came first
        self.format_read: str | None = None
        self.rng = RngTracker()

    def release(self) -> None:
        """After the capture: drop this context's references to its tracers and recorder.
        NOTE: a tracer references its context (``_cx``, to refuse one kept in Python state),
        so these would otherwise make cycles that only the cyclic collector frees, in the
        compiled call's first run (thousands of objects: about 3 ms for ResNet-18)."""
        self.consts.clear()
        self.mutated.clear()
        if self.reads is not None:
            self.reads._trace = None  # NOTE: its trace function's closure holds it
            self.reads = None

    @property
    def context(self) -> CaptureContext:
        """This capture as the :class:`~plait.frontend.tracer.CaptureContext` it is (the one
        class made from this one), for the helpers typed against the whole context."""
        return cast("CaptureContext", self)

    # --- errors --------------------------------------------------------------------------------
    def fail(self, kind: str, reason: str, hint: str | None = None) -> NoReturn:
        err = self.error_of(kind, reason, hint)
        if self.error is None:
            self.error = err
        raise err

    def error_of(self, kind: str, reason: str, hint: str | None = None) -> GraphCaptureError:
        """The refusal of the call running now, at the program's line."""
        frame = user_frame()
        return GraphCaptureError(
            self.current,
            reason,
            kind=kind,
            hint=hint,
            filename=frame.filename if frame else None,
            lineno=frame.lineno if frame else None,
            code=frame.code if frame else None,
        )

    @property
    def continued(self) -> bool:
        """Whether this capture continues its call eagerly (calls run on the samples)."""
        return self.continuation is not None and self.continuation.on

    def limitation(self, reason: str) -> NoReturn:
        self.fail("limitation", reason)

    # --- guards (the GuardSink protocol of symints) -----------------------------------------
    def record_predicate(self, rel: Any, outcome: bool) -> None:
        if self.continued or not isinstance(rel, sympy.Basic) or rel in (sympy.true, sympy.false):
            return
        if not rel.free_symbols:
            return
        self.predicates.setdefault((str(rel), outcome), (rel, outcome))

    def specialize(self, expr: Any, value: int) -> None:
        if self.continued or not self.dynamic or not isinstance(expr, sympy.Basic):
            return
        ir_syms = {s for s in expr.free_symbols if s in self.bindings}
        if ir_syms:
            self.restart(ir_syms, f"{self.current} needs a plain int")

    def restart(self, syms: set[sympy.Symbol], why: str) -> NoReturn:
        """Capture again with the sizes of ``syms`` static; ``why`` names the cause."""
        sources = ", ".join(sorted(self.symbols[s][2] for s in syms))
        err = Restart({self.bindings[s] for s in syms}, f"{sources}: {why}")
        self.error = err
        raise err

    def resample(self, why: str) -> NoReturn:
        """Capture again computing every call (a read of values this capture skipped)."""
        err = Resample(why)
        self.error = err
        raise err

    # --- inputs ---------------------------------------------------------------------------------
    def input_dims(self, leaf: int, label: str, shape: torch.Size) -> tuple[tuple, tuple]:
        """IR dims and guard expressions for the dims of user tensor input ``leaf``."""
        ir: list[Any] = []
        exprs: list[Any] = []
        for d, n in enumerate(shape):
            source = f"{label}.shape[{d}]"
            # NOTE: sizes 0 and 1 are never symbolic (frontend.dynamic_dims says why)
            symbolic = self.dims.wants(label, d) and n >= 2 and n not in self.static_sizes
            name = self.dims.name(label, d) if symbolic else None
            shared = self._named_symbols.get(name) if name else self._size_symbols.get(n)
            if symbolic and shared is not None and self.bindings.get(shared) == n:
                sym = shared
                self.duck.append((leaf, d, source, sym))
            else:
                if symbolic and shared is not None:
                    raise InvalidOptionError(
                        f"dynamic: dims named {name!r} differ in size ({source} is {n}, "
                        f"{self.symbols[shared][2]} is {self.bindings[shared]})"
                    )
                sym = sympy.Symbol(name or f"s{len(self.symbols)}", integer=True, positive=True)
                self.symbols[sym] = (leaf, d, source)
                if symbolic:
                    if name:
                        self._named_symbols[name] = sym
                    else:
                        self._size_symbols[n] = sym
                    self.bindings[sym] = n
            ir.append(sym if symbolic else int(n))
            exprs.append(sym)
        return tuple(ir), tuple(exprs)

    def new_root(
        self,
        plain: torch.Tensor,
        value: Value | None,
        requires_grad: bool,
        lift: Lift | None = None,
    ) -> Tracer:
        t = torch.Tensor._make_subclass(Tracer, plain, requires_grad)
        t._cx, t._plain, t._value, t._root, t._steps = self.context, plain, value, None, ()
        t._seen, t._mutations, t._lift, t._dim_exprs = 0, 0, lift, None
        t._made_by, t._rg = self.current, requires_grad
        t._stride_choice = t._stride_output = None
        if self.continuation is not None:
            self.continuation.made(t)
        return t

    def _is_leaf(self, lift: Lift) -> bool:
        """Whether the caller's tensor behind ``lift`` (a user input or a constant) is an
        autograd leaf."""
        if lift.kind == "const":
            return bool(lift.ref.is_leaf)
        return lift.ref not in self.nonleaf_inputs

    def lift_input(
        self,
        plain: torch.Tensor,
        *,
        kind: str,
        name: str,
        ref: Any,
        writeback: bool,
        requires_grad: bool,
        ir_type: TensorType | None = None,
    ) -> Tracer:
        if ir_type is None:
            ir_type = self.type_of_plain(plain)
        lift = Lift(kind, name, len(self.lifts), ref, ir_type, writeback)
        self.lifts.append(lift)
        if kind == "user":
            lift.value = self.builder.input(name, ir_type, "user")
        tracer = self.new_root(plain, lift.value, requires_grad, lift)
        lift.attrs = INSTANCE_DICT.__get__(tracer)
        return tracer

    def lift_const(self, t: torch.Tensor) -> Tracer:
        """A tensor the program reads that is not an input (a closure, a module attribute)."""
        found = self.consts.get(id(t))
        if found is not None and found._lift is not None and found._lift.ref is t:
            return found
        if id(t) in self.input_paths:
            self.limitation(
                f"the program reads its input {self.input_paths[id(t)]} also as a constant (a "
                "global, a closure or a plain attribute holds the same tensor), which capture "
                "would trace as two tensors: read it through the argument only, or pass a copy"
            )
        with torch._C.DisableTorchFunction():
            sample = layout_clone(t.detach())
        tracer = self.lift_input(
            sample,
            kind="const",
            name=self.const_name(),
            ref=t,
            writeback=True,
            requires_grad=t.requires_grad,
        )
        self.consts[id(t)] = tracer
        return tracer

    def const_name(self) -> str:
        return f"const{sum(lift.kind == 'const' for lift in self.lifts)}"

    # --- values -------------------------------------------------------------------------------
    def tracer(self, t: Any) -> Tracer:
        if isinstance(t, Tracer):
            if t._cx is not self:
                self.limitation("a tensor from another capture leaked into this one")
            return t
        if isinstance(t, torch.Tensor):
            tracer = self.lift_const(t)
            tracer._lift.origin = t  # type: ignore[union-attr]  # NOTE: the program's, not plait's
            return tracer
        raise ProgramTypeError(f"expected a tensor, got {type(t).__name__}")

    def value(self, t: Any) -> Value:
        """The current IR value of a tensor (replaying a view whose root was updated)."""
        tr = self.tracer(t)
        root = tr._root
        if root is None:
            if tr._value is None:
                lift = tr._lift
                assert lift is not None
                lift.value = self.builder.input(lift.name, lift.type, lift.kind)
                tr._value = lift.value
            return tr._value
        if tr._seen != root._mutations or tr._value is None:
            if tr._steps is None:
                self.limitation(
                    f"this tensor is an alias (made by {tr._made_by}) of a tensor "
                    "that was updated in place since; plait cannot replay that view"
                )
            tr._value = replay(self.context, self.value(root), tr._steps)
            tr._seen = root._mutations
        return tr._value

    def type_of(self, t: Tracer) -> TensorType:
        if t._value is not None:
            ty = t._value.type
        else:
            assert t._lift is not None
            ty = t._lift.type
        assert isinstance(ty, TensorType)
        return ty

    def type_of_plain(self, plain: torch.Tensor) -> TensorType:
        at = (plain.shape, plain.dtype, plain.device) if type(plain) is torch.Tensor else None
        found = self._plain_types.get(at) if at is not None else None
        if found is None:
            try:
                found = TensorType.of(plain)
            except TypeError as exc:
                self.limitation(str(exc))
            if at is not None:
                self._plain_types[at] = found
        return found

    def operand(self, x: Any) -> Any:
        """An IR operand: a Value for a tensor, a literal for a Python scalar."""
        if isinstance(x, torch.Tensor):
            return self.value(x)
        if isinstance(x, TracedInt):
            # NOTE: a symbolic size is a size-expression literal (the IR binds its symbols at
            # each call); a size tied to no input dim is specialized
            if x.expr is not None and isinstance(x.ir, sympy.Expr) and not x.ir.is_Integer:
                return x.ir
            return self.int(x)
        x = numpy_number(x)  # NOTE: a NumPy integer or float scalar: its Python number
        if isinstance(x, (bool, int, float)) or x is None:
            return x
        if isinstance(x, complex):  # NOTE: no IR literal; the ATen graph carries it
            raise NoIROp("a complex scalar operand is no IR literal")
        self.limitation(f"cannot pass {type(x).__name__} as an operand")

    def dim(self, x: Any) -> Any:
        """A size for a ``dims`` attribute: symbolic with dynamic shapes."""
        if isinstance(x, TracedInt):
            return x.ir
        if isinstance(x, torch.Tensor):
            self.fail("data-dependent", "a size given as a tensor reads its data")
        return int(x)

    def int(self, x: Any) -> int:
        """A concrete int (a symbolic size is specialized)."""
        if isinstance(x, torch.Tensor):
            self.fail("data-dependent", "an int given as a tensor reads its data")
        if isinstance(x, TracedInt) and x.expr is not None and not isinstance(x.ir, int):
            # NOTE: here even where no sink is active (the output is read after the program
            # ran): a size returned as a plain int must be guarded, not kept as a constant
            value = plain_int(x)
            self.specialize(x.expr, value)
            return value
        return int(x)

    def call(self, op: str, *operands: Any, **attrs: Any) -> Any:
        try:
            return self.builder.call(op, *operands, **attrs)
        except ComplexDtypeError as exc:
            # NOTE: complex math is PyTorch's: the call goes the opaque path (its ATen graph)
            raise NoIROp(str(exc)) from None
        except (TypeRuleError, AttrError, TypeError, ValueError) as exc:
            if self.unbacked:
                datadep.refuse_operands(self.context, op, operands)
            if self.dynamic:
                self._restart_static(operands, f"plait's IR op {op!r}: {exc}", attrs)
            if self.rule_depth:
                raise NoIROp(f"plait's IR op {op!r} rejects this call: {exc}") from exc
            self.limitation(f"plait's IR op {op!r} rejects this call: {exc}")

    def _restart_static(self, operands: Any, why: str, attrs: Any = None) -> None:
        """A type rule could not relate symbolic sizes: capture again with the sizes
        :func:`~plait.frontend.restart_sizes.sizes_to_make_static` picks static."""
        syms = sizes_to_make_static(self.bindings, operands, why, attrs)
        if syms:
            self.restart(syms, why)

    # --- shapes for metadata reads --------------------------------------------------------
    def sizes(self, t: Tracer) -> tuple[Any, ...]:
        ty = self.type_of(t)
        if self.unbacked and datadep.unbacked_type(ty):
            datadep.refuse(self.context, f"reading the shape of {ty}")
        plain = t._plain.shape
        if t._dim_exprs is not None:
            return TracedSize(
                TracedInt(int(n), d, e) for n, d, e in zip(plain, ty.shape, t._dim_exprs)
            )
        if self.dynamic and not ty.is_static:
            return TracedSize(
                d if isinstance(d, int) else TracedInt(int(n), d, d)
                for n, d in zip(plain, ty.shape)
            )
        return plain

    # --- in-place updates ----------------------------------------------------------------
    def assign(self, target: Any, new: Value, requires_grad: bool = False) -> None:
        """Write ``new`` into ``target`` in place; ``requires_grad``: the written value needs
        grad (eager's target then carries the write's history)."""
        if self.ambient_grad and not self.grad_enabled:
            new = self.call("detach", new)  # NOTE: a write inside `torch.no_grad()`
        tr = self.tracer(target)
        if self.unsampled is not None and self.unsampled.replay is not None:
            self.unsampled.replay.wrote(tr._plain)  # NOTE: `.data` has a version of its own
        if self.unsampled is not None and self.unsampled.writing:
            if self.unsampled.replay is not None and not self.unsampled.holds([tr._plain]):
                self.unsampled.replay.stop(f"{self.current} wrote a computed tensor with garbage")
            self.unsampled.add(tr._plain)  # NOTE: written by a call that read garbage
        old = self.type_of(tr)
        assert isinstance(new.type, TensorType)
        if new.type.dtype != old.dtype:
            new = self.call("to_dtype", new, dtype=old.dtype)
        if str(new.type) != str(old):
            self.limitation(f"in-place update changes {old} into {new.type}")
        root = tr._root if tr._root is not None else tr
        lift = root._lift
        if lift is not None and lift.kind == "param":
            self.limitation(f"in-place update of parameter {lift.name!r} inside the program")
        if self.ambient_grad and not self.grad_enabled and root._rg:
            # NOTE: eager's gradient still flows to the tensor as if the write never happened;
            # the IR has no value that is "new data, old gradient"
            self.limitation("in-place update inside torch.no_grad() of a tensor that requires grad")
        if self.grad_enabled and root._rg and any(s.op == "detach" for s in tr._steps or ()):
            # NOTE: eager autograd never sees such a write; the IR would cut the gradient.
            self.limitation("in-place update through detach()/.data of a tensor that requires grad")
        if lift is not None and lift.kind in ("user", "const") and self.grad_enabled and root._rg:
            if self._is_leaf(lift):
                raise ProgramError(
                    "a leaf Variable that requires grad is being used in an in-place operation."
                )
            # NOTE: eager writes a non-leaf and its history (and the caller's tensor's) moves
            # on; a compiled call returns no gradient through its input
            self.limitation(
                f"in-place update of input {lift.name!r}, which requires grad and is not a leaf"
            )
        keep = self.grad_enabled and root._rg  # NOTE: eager's target keeps its history
        if requires_grad and self.grad_enabled and not root._rg:
            if lift is not None:
                # NOTE: eager's input leaves the call requiring grad, with the write's history;
                # the write-back of a compiled call carries none
                self.limitation(
                    f"in-place update of input {lift.name!r}, which does not require grad, "
                    "with a value that does"
                )
            root._rg = tr._rg = True  # NOTE: what is computed from it from now on needs grad
        if tr._root is None:
            old_value = self.value(tr)  # materialize a lifted input before rebinding it
            tr._value = keep_history(self.context, new, old_value) if keep else new
            tr._mutations += 1
        else:
            if tr._steps is None:
                self.limitation(
                    f"in-place update of an alias made by {tr._made_by} that plait "
                    "cannot put back into the tensor it views"
                )
            base = self.value(tr._root)
            if keep:
                new = keep_history(self.context, new, self.value(tr))
            updated = scatter(self.context, base, tr._steps, new)
            tr._root._value = keep_history(self.context, updated, base) if keep else updated
            tr._root._mutations += 1
            tr._value, tr._seen = new, tr._root._mutations
        stride_choices.on_write(self.context, root)
        self.mutated[id(root)] = root

    def check_writable(self, targets: list[Any]) -> None:
        """Refuse, before PyTorch runs the call, a write to a parameter (or a view of one)."""
        for t in targets:
            if not isinstance(t, torch.Tensor):
                continue
            tr = self.tracer(t)
            root = tr._root if tr._root is not None else tr
            if root._lift is not None and root._lift.kind == "param":
                self.limitation(
                    f"in-place update of parameter {root._lift.name!r} inside the program"
                )
