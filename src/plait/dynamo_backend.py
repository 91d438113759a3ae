"""``torch.compile(model, backend="plait")``: plait as a backend of TorchDynamo.

Dynamo captures the user's Python program into FX graphs (one per region between graph breaks)
and guards them; this backend hands each FX graph to plait's own front door,
:func:`plait.compile`, so everything downstream of capture (passes, Stax, plait's guards, the
manifest, the artifact cache, the numerical contract) is the one ``plait.compile`` uses.

Why not an FX-to-IR importer: a Dynamo FX graph is itself a Python program of torch calls
(``gm.forward``), which plait's tracer records through the same op table, the same ATen
tracing of calls with no rule (typed ``aten`` nodes, else opaque nodes) and the same loud
fallbacks as any user program. A second importer would be a second table that could disagree
with the first.

What the backend adds, per FX graph (:class:`DynamoGraph`):

- Dynamo lifts parameters and buffers into graph inputs. Those whose Dynamo source is a
  module's ``_parameters[...]``/``_buffers[...]`` slot are put back as parameters and buffers
  of a small module (:class:`GraphProgram`, named by their ``state_dict`` paths), rebound from
  Dynamo's arguments on each call. plait sees them as module state, so it may freeze them (fold
  BatchNorm, prepack weights) behind its own guards on their identity and version: a weight
  changed in place or replaced is a plait recompile, never a stale answer.
- Dynamo passes the sizes of dynamic dims as ``SymInt`` arguments. One that is the size of a
  tensor argument's dim is read from that tensor inside the program (so that plait's
  ``dynamic=True`` keeps it symbolic) and checked against Dynamo's argument on each call.
- FX spells ``w.data`` as ``torch._C._autograd._get_data_attr(w)``, which capture cannot see
  (no ``__torch_function__``): it is read as ``w.data`` again, so a write through it is a write
  of ``w`` (:func:`_data_reads`).
- Shapes: ``dynamic=False`` by default, even for a graph Dynamo made dynamic: Stax compiles
  static shapes, and plait's ``dynamic=True`` makes every user dim symbolic (not only those
  Dynamo chose), which either runs the reference interpreter or restarts capture with static
  sizes. Each new size is then a plait specialization behind plait's guards. Ask for plait's
  symbolic capture with ``options={"dynamic": True}``.
- ``on_recompile_limit="eager"`` by default, as torch.compile does on its own limit: a call
  past plait's recompile limit runs the FX graph eagerly, warned once and recorded for
  ``plait.explain`` (``options={"on_recompile_limit": "raise"}`` makes it an error).

Example:
    >>> import torch, plait.conformance, plait.dynamo_backend as pd
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
    >>> backend = pd.PlaitBackend(options={"cache": False})
    >>> compiled = torch.compile(model, backend=backend)
    >>> with torch.no_grad():  # judged under the numerical contract, on fresh inputs
    ...     report = plait.conformance.check(
    ...         model, lambda x: compiled(x), (torch.randn(2, 4),), candidate_module=model)
    >>> report.ok
    True
    >>> [g.state_paths for g in backend.graphs]
    [['0.weight', '0.bias']]
    >>> torch._dynamo.reset()  # NOTE: Dynamo's cache refers to this example's namespace
"""

from __future__ import annotations

import functools
import operator
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from plait.api import compile as plait_compile
from plait.api import explain as plait_explain
from plait.errors import InternalCompilerError
from plait.manifest import Explanation

__all__ = ["DynamoGraph", "GraphProgram", "PlaitBackend", "graphs", "plait_backend"]

# options of torch.compile(..., options={...}) that are plait.compile's keyword arguments; the
# others go to plait.compile(options=...)
_KEYWORDS = ("backend", "fullgraph", "dynamic")
# `L['self']._modules['layer1']._modules['0']._parameters['weight']`: a module's state slot,
# reached from a local (`L`) or global (`G`) name, or from a bound method's module
# (`L['fn'].__self__`: torch.compile(model.forward))
_SLOT = re.compile(
    r"^[LG]\['([^']+)'\](?:\.__self__)?((?:\._modules\['[^']+'\])*)"
    r"\._(parameters|buffers)\['([^']+)'\]$"
)
# the module being compiled (`self` in its forward, `fn` in nn.Module's call): no path prefix
_ROOTS = ("self", "fn")
_MODULE_STEP = re.compile(r"\._modules\['([^']+)'\]")


@dataclass(frozen=True)
class _Slot:
    """One argument of the FX graph and where the program reads it from."""

    kind: str  # "user" (passed to plait), "param"/"buffer" (module state), "size" (of a tensor)
    path: str = ""  # state_dict path for param/buffer
    tensor: int = -1  # for "size": the argument index of the tensor ...
    dim: int = -1  # ... and its dim


def _source_name(node: fx.Node) -> str | None:
    """Dynamo's source of a placeholder (``L['x']``, ``L['self']._modules[...]...``), if known.
    NOTE: read from Dynamo's node metadata; a graph without it treats every argument as a
    user input (correct, only nothing is frozen)."""
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is None:
        return None
    name = source.name
    return str(name() if callable(name) else name)


def _state_slot(source: str | None) -> _Slot | None:
    match = _SLOT.match(source or "")
    if match is None:
        return None
    root, steps, table, attr = match.groups()
    prefix = [] if root in _ROOTS else [root]
    kind = "param" if table == "parameters" else "buffer"
    return _Slot(kind, ".".join([*prefix, *_MODULE_STEP.findall(steps), attr]))


def _size_slot(node: fx.Node, tensors: Sequence[tuple[int, Any]]) -> _Slot | None:
    """A SymInt argument that is exactly the size of some tensor argument's dim."""
    value = node.meta.get("example_value")
    if not isinstance(value, torch.SymInt):
        return None
    expr = value.node.expr
    for index, fake in tensors:
        for dim, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt) and size.node.expr == expr:
                return _Slot("size", tensor=index, dim=dim)
    return None


_DEVICES: dict[str, torch.device] = {}


def _device(name: str) -> torch.device:
    """A device built outside capture (a plain lookup: no torch call for the tracer to see)."""
    return _DEVICES[name]


def _prebuild_devices(gm: fx.GraphModule) -> int:
    """FX prints a ``torch.device`` argument as a constructor call (``device(type='cpu')``),
    which capture would see as a torch call with no IR rule (a fallback for the whole graph,
    e.g. GPT-2's ``torch.arange(n, device=...)``). Such arguments become ``_device(name)``
    nodes, which return the same device object. Returns how many arguments were rewritten."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue

        def prebuilt(value: Any, node: fx.Node = node) -> Any:
            nonlocal count
            if not isinstance(value, torch.device):
                return value
            _DEVICES.setdefault(str(value), value)
            count += 1
            with gm.graph.inserting_before(node):
                return gm.graph.call_function(_device, (str(value),))

        node.args = fx.node.map_aggregate(node.args, prebuilt)
        node.kwargs = fx.node.map_aggregate(node.kwargs, prebuilt)
    if count:
        gm.recompile()
    return count


# NOTE: untyped in torch's stubs
_GET_DATA_ATTR = getattr(torch._C._autograd, "_get_data_attr", None)


def _data_reads(gm: fx.GraphModule) -> int:
    """FX spells ``w.data`` as ``torch._C._autograd._get_data_attr(w)``, a call that never
    reaches ``__torch_function__``: capture would not see the alias, and a write through it
    (``w.data.mul_(0.5)``) would be lost. Such calls become ``getattr(w, "data")``, the read
    capture knows (a view of ``w``). Returns how many were rewritten."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _GET_DATA_ATTR:
            node.target, node.args, node.kwargs = getattr, (*node.args, "data"), {}
            count += 1
    if count:
        gm.recompile()
    return count


def _plan(gm: fx.GraphModule) -> tuple[list[_Slot], bool]:
    """Each placeholder's slot, and whether the graph has symbolic sizes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value") for n in placeholders]
    tensors = [(i, v) for i, v in enumerate(fakes) if isinstance(v, torch.Tensor)]
    symbolic = any(isinstance(v, torch.SymInt) for v in fakes) or any(
        isinstance(s, torch.SymInt) for _, v in tensors for s in v.shape
    )
    slots, seen = [], set()
    for node in placeholders:
        slot = _state_slot(_source_name(node)) or _size_slot(node, tensors) or _Slot("user")
        if slot.kind in ("param", "buffer") and slot.path in seen:
            slot = _Slot("user")  # NOTE: Dynamo lifts each tensor once; never two slots per path
        seen.add(slot.path)
        slots.append(slot)
    return slots, symbolic


def _owner(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """The module that holds ``path``'s slot, created (empty) along the way."""
    *steps, attr = path.split(".")
    module = root
    for step in steps:
        child = module._modules.get(step)
        if child is None:
            child = nn.Module()
            module.add_module(step, child)
        module = child
    return module, attr


def _realize(gm: fx.GraphModule) -> None:
    """Generate a lazy graph module's code now. NOTE: its first call replaces its ``forward``;
    inside capture that is a Python value the program changes while it runs (refused)."""
    needs = getattr(gm, "_needs_recompile", None)
    if needs is not None and needs():
        gm.real_recompile()  # type: ignore[operator]  # NOTE: _LazyGraphModule, untyped


class GraphProgram(nn.Module):
    """An FX graph as a module: Dynamo's lifted parameters and buffers are its own (at their
    ``state_dict`` paths), its arguments are the graph's user inputs. The graph module itself is
    held outside the module tables, so its paths never collide with the user's."""

    graph_module: fx.GraphModule

    def __init__(self, gm: fx.GraphModule, slots: Sequence[_Slot], example: Sequence[Any]) -> None:
        super().__init__()
        _realize(gm)
        object.__setattr__(self, "graph_module", gm)
        self._slots = list(slots)
        self._tables: list[tuple[dict[str, Any], str]] = []
        for slot, value in zip(slots, example):
            if slot.kind in ("param", "buffer"):
                owner, attr = _owner(self, slot.path)
                table = owner._parameters if slot.kind == "param" else owner._buffers
                table[attr] = value
                self._tables.append((table, attr))
        # graph argument index -> how forward() rebuilds it
        self._user = [i for i, s in enumerate(slots) if s.kind == "user"]

    def forward(self, *args: Any) -> Any:
        full: list[Any] = [None] * len(self._slots)
        for i, value in zip(self._user, args):
            full[i] = value
        # NOTE: state is read through the module tree (as capture lifts it), never through
        # self._tables: that list holds the tables capture swaps, a Python value it guards.
        for i, slot in enumerate(self._slots):
            if slot.kind in ("param", "buffer"):
                full[i] = functools.reduce(getattr, slot.path.split("."), self)
        for i, slot in enumerate(self._slots):
            if slot.kind == "size":
                full[i] = full[slot.tensor].shape[slot.dim]
        return self.graph_module(*full)


class DynamoGraph:
    """What the backend returns to Dynamo for one FX graph: calls with Dynamo's arguments run
    :attr:`compiled` (a :func:`plait.compile` of :attr:`program`). ``plait.explain(g.compiled)``
    (or :meth:`explain`) shows its specializations and manifests."""

    def __init__(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        index: int,
        options: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> None:
        options = dict(options or {})
        keywords = {k: options.pop(k) for k in _KEYWORDS if k in options}
        self.index = index
        self.gm = gm
        self.devices_prebuilt = _prebuild_devices(gm)
        self.data_reads = _data_reads(gm)
        self.slots, symbolic = _plan(gm)
        self.symbolic = symbolic  # Dynamo made some size of this graph symbolic
        keywords.setdefault("dynamic", False)
        options.setdefault("on_recompile_limit", "eager")
        self.dynamic = keywords["dynamic"]
        self.program = GraphProgram(gm, self.slots, example_inputs)
        self.compiled = plait_compile(self.program, mode=mode, options=options, **keywords)
        self._user = [i for i, s in enumerate(self.slots) if s.kind == "user"]
        self._state = [i for i, s in enumerate(self.slots) if s.kind in ("param", "buffer")]
        self._bound: tuple[Any, ...] = tuple(table[attr] for table, attr in self.program._tables)
        self._sizes = [(i, s.tensor, s.dim) for i, s in enumerate(self.slots) if s.kind == "size"]

    @property
    def state_paths(self) -> list[str]:
        """The ``state_dict`` paths of the parameters and buffers plait sees as module state."""
        return [s.path for s in self.slots if s.kind in ("param", "buffer")]

    def __call__(self, *args: Any) -> Any:
        self._bind_state(args)
        for i, tensor, dim in self._sizes:
            if args[tensor].shape[dim] != args[i]:
                raise InternalCompilerError(
                    f"plait's Dynamo backend: graph argument {i} ({args[i]}) was taken to be "
                    f"the size of argument {tensor}'s dim {dim} "
                    f"({args[tensor].shape[dim]}); Dynamo passed another value. Please report "
                    "this; torch.compile(..., dynamic=False) avoids symbolic sizes."
                )
        return self.compiled(*[args[i] for i in self._user])

    def _bind_state(self, args: Sequence[Any]) -> None:
        """NOTE: Dynamo's arguments are the truth; the module's slots follow them (a replaced
        parameter is rebound here, and plait's own guards then see the new tensor)."""
        now = tuple(args[i] for i in self._state)
        if all(map(operator.is_, now, self._bound)):
            return
        for value, (table, attr) in zip(now, self.program._tables):
            table[attr] = value
        self._bound = now

    def explain(self) -> Explanation:
        return plait_explain(self.compiled)

    def __repr__(self) -> str:
        users = len(self._user)
        return (
            f"DynamoGraph(#{self.index}: {users} user inputs, {len(self.state_paths)} "
            f"parameters/buffers, {len(self._sizes)} sizes read from tensors, "
            f"symbolic in Dynamo={self.symbolic}, plait dynamic={self.dynamic})"
        )


class PlaitBackend:
    """A Dynamo backend that compiles each FX graph with :func:`plait.compile` and remembers the
    graphs it made (weakly: Dynamo's cache owns them). ``options`` are the defaults for
    ``plait.compile`` (``backend``, ``fullgraph``, ``dynamic`` and its ``options``);
    ``torch.compile(..., options={...})`` overrides them per call.

    Example:
        >>> import torch, plait.dynamo_backend as pd
        >>> backend = pd.PlaitBackend(options={"cache": False, "backend": "eager"})
        >>> f = torch.compile(lambda x: (x * 2).relu(), backend=backend)
        >>> x = torch.randn(3)
        >>> torch.equal(f(x), (x * 2).relu()), len(backend.graphs)
        (True, 1)
        >>> torch._dynamo.reset()
    """

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self._graphs: list[weakref.ref[DynamoGraph]] = []
        self._count = 0
        self.__name__ = "plait"

    def __call__(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Callable[..., Any]:
        merged = {**self.options, **(options or {})}
        graph = DynamoGraph(gm, example_inputs, self._count, merged, mode)
        self._count += 1
        self._graphs.append(weakref.ref(graph))
        return graph

    @property
    def graphs(self) -> list[DynamoGraph]:
        """The FX graphs this backend compiled and Dynamo still holds, oldest first."""
        alive = [g for g in (r() for r in self._graphs) if g is not None]
        self._graphs = [weakref.ref(g) for g in alive]
        return alive

    def explain(self) -> str:
        """Each graph's :func:`plait.explain`, in the order Dynamo compiled them."""
        return "\n".join(f"{g!r}\n{g.explain()}" for g in self.graphs)

    def reset(self) -> None:
        """Called by ``torch._dynamo.reset()``: forget the graphs."""
        self._graphs.clear()


# NOTE: the backend behind torch.compile(..., backend="plait") (the `torch_dynamo_backends`
# entry point in pyproject.toml)
plait_backend = PlaitBackend()


def graphs() -> list[DynamoGraph]:
    """The graphs ``torch.compile(..., backend="plait")`` compiled that Dynamo still holds.

    Example:
        >>> import plait.dynamo_backend as pd
        >>> isinstance(pd.graphs(), list)
        True
    """
    return plait_backend.graphs
