"""The tracer: tensors that carry a real sample value and an IR value, and the capture context
that records every torch-level call into a graph.

NOTE: invariants.
- A :class:`Tracer` shares memory with its *sample*, a plain tensor on which every call runs for
  real (in-place ops included), so shapes, dtypes, aliasing and data-dependent behaviour are
  exactly eager PyTorch's. Samples of user inputs and buffers are clones: capture never writes
  the caller's tensors.
- The IR is functional. An in-place op rebinds the mutated tensor's IR value; a write through a
  view is scattered into its root, and views of a mutated root replay their steps (views.py).
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

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import sympy
import torch
from torch.overrides import TorchFunctionMode, resolve_name

from plait.errors import GraphCaptureError
from plait.frontend import datadep, pytree
from plait.frontend.dynamic_dims import DimPolicy
from plait.frontend.frames import user_frame
from plait.frontend.rng import RngTracker
from plait.frontend.symints import TracedInt, TracedSize, plain_int, pop_sink, push_sink
from plait.frontend.table import InPlace, NoIROp, Rule, Viewed, lookup
from plait.frontend.views import ViewStep, replay, scatter
from plait.frontend.writes import write_targets
from plait.ir import GraphBuilder, TensorType, Value
from plait.ir.ops import AttrError, TypeRuleError, get_op
from plait.ir.ops.registry import ComplexDtypeError

_HINT_FULLGRAPH = (
    "plait captures whole graphs; with fullgraph=False, plait.compile runs such a program "
    "eagerly instead (with a warning, recorded)."
)


class Restart(BaseException):
    """Dynamic capture specialized a symbolic size; capture restarts with those sizes static.

    NOTE: a BaseException, so that a user's ``except Exception`` cannot swallow it."""

    def __init__(self, sizes: set[int], why: str) -> None:
        super().__init__(f"specialize sizes {sorted(sizes)}: {why}")
        self.sizes = sizes
        self.why = why


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


class Tracer(torch.Tensor):
    """A tensor seen by the program during capture (see the module docstring)."""

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

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cx = CaptureContext.active
        if cx is None:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        return cx.dispatch(func, args, kwargs or {})


class _Mode(TorchFunctionMode):
    """Sees every torch call during capture, factories (no tensor argument) included."""

    def __init__(self, cx: CaptureContext) -> None:
        super().__init__()
        self.cx = cx

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.cx.dispatch(func, args, kwargs or {})


def op_name(func: Any) -> str:
    name = resolve_name(func)
    if name is None:
        name = getattr(func, "__qualname__", None) or repr(func)
    # NOTE: torch.functional.* is re-exported as torch.*; name the public spelling.
    return name.removeprefix("torch.").removeprefix("functional.").replace(".__get__", "")


class CaptureContext:
    """Records one run of the program into a graph."""

    active: CaptureContext | None = None

    def __init__(
        self,
        *,
        fullgraph: bool,
        dynamic: bool,
        static_sizes: set[int],
        dims: DimPolicy | None = None,
    ) -> None:
        self.builder = GraphBuilder()
        self.fullgraph = fullgraph
        # NOTE: which input dims are symbolic (frontend.dynamic_dims); ``dynamic`` says some are
        self.dims = dims if dims is not None else DimPolicy(every=dynamic)
        self.dynamic = dynamic or self.dims.active
        # NOTE: > 0 while a capture rule runs: an IR op rejecting the rule's call then sends
        # the call to the ATen path (eager accepted it), not the whole program to eager
        self.rule_depth = 0
        self.static_sizes = static_sizes
        self.lifts: list[Lift] = []
        self.consts: dict[int, Tracer] = {}
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
        self.rng = RngTracker()

    # --- activation ---------------------------------------------------------------------------
    @contextmanager
    def activate(self) -> Iterator[None]:
        prev = CaptureContext.active
        CaptureContext.active = self
        push_sink(self)
        try:
            with _Mode(self):
                yield
            if self.grad_enabled != self.ambient_grad:
                self.limitation(
                    f"the program leaves grad mode {self.grad_enabled} (it was "
                    f"{self.ambient_grad}); a compiled call would not change it"
                )
        finally:
            pop_sink(self)
            CaptureContext.active = prev
            torch._C._set_grad_enabled(self.ambient_grad)  # NOTE: even when capture failed

    # --- errors --------------------------------------------------------------------------------
    def fail(self, kind: str, reason: str, hint: str | None = None) -> NoReturn:
        frame = user_frame()
        err = GraphCaptureError(
            self.current,
            reason,
            kind=kind,
            hint=hint,
            filename=frame.filename if frame else None,
            lineno=frame.lineno if frame else None,
            code=frame.code if frame else None,
        )
        if self.error is None:
            self.error = err
        raise err

    def limitation(self, reason: str) -> NoReturn:
        self.fail("limitation", reason)

    # --- guards (the GuardSink protocol of symints) -----------------------------------------
    def record_predicate(self, rel: Any, outcome: bool) -> None:
        if not isinstance(rel, sympy.Basic) or rel in (sympy.true, sympy.false):
            return
        if not rel.free_symbols:
            return
        self.predicates.setdefault((str(rel), outcome), (rel, outcome))

    def specialize(self, expr: Any, value: int) -> None:
        if not self.dynamic or not isinstance(expr, sympy.Basic):
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
                    raise ValueError(
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
        t._cx, t._plain, t._value, t._root, t._steps = self, plain, value, None, ()
        t._seen, t._mutations, t._lift, t._dim_exprs = 0, 0, lift, None
        t._made_by, t._rg = self.current, requires_grad
        return t

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
        return self.new_root(plain, lift.value, requires_grad, lift)

    def lift_const(self, t: torch.Tensor) -> Tracer:
        """A tensor the program reads that is not an input (a closure, a module attribute)."""
        found = self.consts.get(id(t))
        if found is not None and found._lift is not None and found._lift.ref is t:
            return found
        with torch._C.DisableTorchFunction():
            sample = t.detach().clone()
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
            return self.lift_const(t)
        raise TypeError(f"expected a tensor, got {type(t).__name__}")

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
            tr._value = replay(self, self.value(root), tr._steps)
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
        try:
            return TensorType.of(plain)
        except TypeError as exc:
            self.limitation(str(exc))

    def operand(self, x: Any) -> Any:
        """An IR operand: a Value for a tensor, a literal for a Python scalar."""
        if isinstance(x, torch.Tensor):
            return self.value(x)
        if isinstance(x, TracedInt):
            return self.int(x)
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
            value = int.__int__(x)
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
                datadep.refuse_operands(self, op, operands)
            if self.dynamic:
                self._restart_static(operands, f"plait's IR op {op!r}: {exc}", attrs)
            if self.rule_depth:
                raise NoIROp(f"plait's IR op {op!r} rejects this call: {exc}") from exc
            self.limitation(f"plait's IR op {op!r} rejects this call: {exc}")

    def _restart_static(self, operands: Any, why: str, attrs: Any = None) -> None:
        """A type rule could not relate symbolic sizes (``s1`` against a weight's ``8``): make
        the sizes involved static and capture again. Sizes equal to a static dim of another
        operand or to an int of the attributes (``normalized_shape``, split sizes) go first;
        failing that, every symbolic size of the operands."""
        types = [
            o.type
            for o in _flat(operands)
            if isinstance(o, Value) and isinstance(o.type, TensorType)
        ]
        syms = {
            s
            for t in types
            for d in t.shape
            if not isinstance(d, int)
            for s in d.free_symbols
            if s in self.bindings
        }
        statics = {d for t in types for d in t.shape if isinstance(d, int)}
        sizes = [v for k, v in (attrs or {}).items() if k in _SIZE_ATTRS]
        statics |= {v for v in _flat(sizes) if type(v) is int}
        matching = {s for s in syms if self.bindings[s] in statics}
        if syms:
            self.restart(matching or syms, why)

    # --- shapes for metadata reads --------------------------------------------------------
    def sizes(self, t: Tracer) -> tuple[Any, ...]:
        ty = self.type_of(t)
        if self.unbacked and datadep.unbacked_type(ty):
            datadep.refuse(self, f"reading the shape of {ty}")
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
    def assign(self, target: Any, new: Value) -> None:
        if self.ambient_grad and not self.grad_enabled:
            new = self.call("detach", new)  # NOTE: a write inside `torch.no_grad()`
        tr = self.tracer(target)
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
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation."
            )
        if tr._root is None:
            self.value(tr)  # materialize a lifted input before rebinding it
            tr._value = new
            tr._mutations += 1
        else:
            if tr._steps is None:
                self.limitation(
                    f"in-place update of an alias made by {tr._made_by} that plait "
                    "cannot put back into the tensor it views"
                )
            base = self.value(tr._root)
            updated = scatter(self, base, tr._steps, new)
            tr._root._value = updated
            tr._root._mutations += 1
            tr._value, tr._seen = new, tr._root._mutations
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

    # --- dispatch --------------------------------------------------------------------------
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.error is not None:
            raise self.error
        prev = self.current
        self.current = "the random number generator"
        try:
            self.rng.before(self)
            self.current = op_name(func)
            first = len(self.builder.graph.nodes)
            rule = lookup(func)
            if self.unbacked and rule is None:
                datadep.refuse_unruled(self, args, kwargs)
            result = self._dispatch(rule, func, args, kwargs)
            if self.unbacked:
                datadep.check_new_nodes(self, first)
            if rule is None or rule.kind != "meta":  # NOTE: a metadata read computes nothing
                self.rng.after(self, first)
            return result
        finally:
            self.current = prev

    def _dispatch(self, rule: Rule | None, func: Any, args: tuple, kwargs: dict) -> Any:
        if rule is None:
            from plait.frontend.opaque import run_opaque

            return run_opaque(self, func, args, kwargs)
        if rule.kind == "meta":
            assert rule.fn is not None
            return rule.fn(self, *args, **kwargs)
        if rule.kind == "data":
            folded = self._constant_read(func, args, kwargs)
            if folded is not _NOT_CONSTANT:
                return folded
            self.fail(
                "data-dependent",
                f"{rule.what} reads tensor data; a graph cannot branch on or "
                "export the values it computes",
                _HINT_FULLGRAPH,
            )
        return self.run_op(rule, func, args, kwargs)

    def _constant_read(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A read of tensor data whose tensors the graph computes from no input (only from
        constant factories such as ``arange`` of static sizes, through deterministic ops): the
        value is the same on every call of this specialization, so the read is that value (a
        Python value; a tensor result is not folded). Else ``_NOT_CONSTANT``."""
        found: list[Tracer] = []
        self.unwrap((args, kwargs), found)
        if not found or not all(_input_free(self.value(t)) for t in found):
            return _NOT_CONSTANT
        out, _ = self.sample(func, args, kwargs)
        if any(isinstance(x, torch.Tensor) for x in pytree_leaves(out)):
            return _NOT_CONSTANT
        return out

    def unwrap(self, x: Any, found: list[Tracer]) -> Any:
        if isinstance(x, torch.Tensor):
            tr = self.tracer(x)
            found.append(tr)
            return tr._plain
        if isinstance(x, TracedSize):
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
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            out = func(*pargs, **pkwargs)
        self._refuse_unstrided(func, out)
        return out, found

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

    def run_op(self, rule: Rule, func: Any, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("out") is not None:
            self.limitation("out= arguments write into a given tensor; plait does not capture them")
        self.check_writable(write_targets(self.current, func, args, kwargs))
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
            from plait.frontend.opaque import run_opaque

            return run_opaque(self, func, args, kwargs, rule_said=rule_said, sampled=out)
        if rule.inplace:
            ir = InPlace(args[0], ir)
        grad = rule.grad and self.grad_enabled and any(t._rg for t in inputs)
        return self.wrap(ir, out, inputs, grad)

    def wrap(self, ir: Any, out: Any, inputs: list[Tracer], grad: bool) -> Any:
        if isinstance(ir, InPlace):
            self.assign(ir.target, ir.value)
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
                ir = Viewed(value, ir.source, (*ir.steps, ViewStep("detach")))
        self.check(value, out)
        requires_grad = (grad and out.is_floating_point()) or out.requires_grad
        t = self.new_root(out, value, requires_grad)
        source = _aliased(out, inputs)
        if source is None:
            return t
        root = source._root if source._root is not None else source
        steps: tuple[ViewStep, ...] | None = None
        if isinstance(ir, Viewed) and ir.source is not None:
            src = self.tracer(ir.source)
            if src is source and src._steps is not None:
                steps = (*src._steps, *ir.steps)
        t._root, t._steps, t._seen = root, steps, root._mutations
        return t

    def check(self, value: Value, plain: torch.Tensor) -> None:
        """NOTE: every IR value's type must equal the eager result's: a wrong rule fails here."""
        actual = self.type_of_plain(plain)
        expected = value.type
        assert isinstance(expected, TensorType)
        if not expected.is_static:
            shape = tuple(
                d if isinstance(d, int) else int(d.xreplace({**self.bindings, **self.unbacked}))
                for d in expected.shape
            )
            expected = expected.with_shape(shape)
        if expected != actual:
            self.limitation(
                f"capture rule produced {value.type} where PyTorch produced {actual}"
                " (a bug in plait's capture table)"
            )


def storage_id(t: torch.Tensor) -> int:
    """Identity of the memory a tensor views (works for meta tensors too)."""
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return 0


def _aliased(out: torch.Tensor, inputs: list[Tracer]) -> Tracer | None:
    ptr = storage_id(out)
    if not ptr:
        return None
    for t in inputs:
        if storage_id(t._plain) == ptr:
            return t
    return None


_NOT_CONSTANT = object()


def _input_free(value: Value) -> bool:
    """Whether ``value`` is computed from no graph input and no random op, with static types
    throughout (so from constants of this specialization alone)."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v.kind is not None or not isinstance(v.type, TensorType) or not v.type.is_static:
            return False
        node = v.producer
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        if get_op(node.op).is_random(node.attrs):
            return False
        for operand in node.inputs:
            if isinstance(operand, Value):
                stack.append(operand)
            elif isinstance(operand, sympy.Basic) and operand.free_symbols:
                return False
    return True


def pytree_leaves(x: Any) -> Iterator[Any]:
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from pytree_leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from pytree_leaves(v)
    else:
        yield x


# NOTE: attributes that are sizes a type rule compares with an operand's dims
_SIZE_ATTRS = frozenset({"normalized_shape", "sizes", "shape", "size", "output_size"})


def _flat(xs: Any) -> Iterator[Any]:
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x
