"""The global random number generator during capture: every change of its state is replayed
by the graph, or capture refuses the program.

Capture runs the program for real, so it sees the CPU generator's state move. The tracker
compares the state at each torch call (and at the end) with the state the graph accounts for:

- a torch call that draws (the state moved during it) must have become a random node (dropout,
  attention with dropout, random ``aten``/``aten_factory`` nodes for the random ATen ops of a
  call with no capture rule, else ``random_call``/``random_factory``), which the executors run
  in program order: the same draws as eager;
- between torch calls, Python code may move it: ``torch.manual_seed(s)`` (the state equals a
  fresh generator seeded with ``torch.initial_seed()``) becomes ``rng_seed {seed=s}``; a state
  restored to one the program had earlier (``torch.random.fork_rng``, ``get_rng_state`` then
  ``set_rng_state``) becomes ``rng_get_state`` at that earlier point and ``rng_set_state`` here;
- a CUDA generator that moved during a torch call must be accounted for by a random node on
  CUDA tensors (executors run PyTorch's random kernels in program order on the same default
  CUDA generators; a CUDA graph advances the generator's offset at each replay as eager's calls
  do); ``manual_seed`` seeds the CUDA generators too, and so does its ``rng_seed`` replay;
- anything else (a state from outside the program, draws by a call plait captured as a
  deterministic op, a CUDA generator moved otherwise) is a :class:`GraphCaptureError`, under
  ``fullgraph=False`` the recorded eager fallback.

NOTE: ``torch.seed()`` (a nondeterministic seed) looks like ``manual_seed`` of the seed it drew
and is replayed with that seed: documented, not detectable from the state.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> def f(x):
    ...     torch.manual_seed(0)
    ...     return torch.nn.functional.dropout(x, 0.5)
    >>> [n.op for n in capture_program(f, (torch.ones(4),)).graph.nodes]
    ['rng_seed', 'dropout']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from plait.ir import Node, Value, get_op

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext


def cpu_state() -> torch.Tensor:
    return torch.default_generator.get_state()


def _cuda_states() -> list[torch.Tensor] | None:
    return torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None


def _on_cuda(node: Node) -> bool:
    return any(getattr(v.type, "device", "cpu") != "cpu" for v in node.outputs)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    # NOTE: generator states are CPU byte tensors: equal exactly when their bytes are (a byte
    # comparison costs a quarter of torch.equal's dispatch)
    if a.dtype is torch.uint8 and b.dtype is torch.uint8 and a.is_cpu and b.is_cpu:
        return a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()
    return a.shape == b.shape and bool(torch.equal(a, b))


class RngTracker:
    """What the graph accounts for of the CPU generator (see the module docstring)."""

    def __init__(self) -> None:
        self.start(draw=False)

    def start(self, draw: bool = True) -> None:
        """Called where capture starts running the program, its generator state saved.

        NOTE: one draw first (capture restores the generator afterwards), so the state the
        program starts from is never that of a fresh manual_seed: a state equal to one is
        then the program's own seeding, never a restore of the caller's state."""
        self.caller = cpu_state()  # NOTE: the caller's, for a call that continues eagerly
        if draw:
            torch.rand(1)
        self.expected = cpu_state()
        # NOTE: each state the program has been in, with the node position it held from
        self.history: list[tuple[torch.Tensor, int]] = [(self.expected, 0)]
        self.saved: dict[int, Value] = {}  # history index -> its rng_get_state value
        self.last_random: Node | None = None
        self.cuda = _cuda_states()

    # --- around each torch call --------------------------------------------------------------
    def before(self, cx: CaptureContext) -> None:
        """Account for what Python code did to the generator since the last torch call."""
        now = cpu_state()
        if _same(now, self.expected):
            self._check_cuda(cx)
            return
        seed = torch.initial_seed()
        if _same(now, torch.Generator().manual_seed(seed).get_state()):
            # NOTE: manual_seed seeds the CUDA generators too, and so does its replay
            if self._cuda_seeded(seed):
                self.cuda = _cuda_states()
            self._check_cuda(cx)
            node_value = cx.call("rng_seed", seed=int(seed))
        else:
            self._check_cuda(cx)
            k = self._find(now)
            if k is None:
                cx.fail(
                    "limitation",
                    "the program set the random number generator to a state it did not have "
                    "before (set_rng_state from outside the program?); plait replays "
                    "manual_seed, fork_rng and a state saved by get_rng_state in the program",
                )
            node_value = cx.call("rng_set_state", self._saved_state(cx, k))
        self._moved(cx, now, node_value)

    def after(self, cx: CaptureContext, first_node: int) -> None:
        """The torch call just run moved the generator: a random node must account for it."""
        self._after_cuda(cx, first_node)
        now = cpu_state()
        if _same(now, self.expected):
            return
        nodes = cx.builder.graph.nodes[first_node:]
        drawn = [n for n in nodes if get_op(n.op).is_random(n.attrs)]
        if not drawn:
            cx.fail(
                "limitation",
                f"{cx.current} draws random numbers, and plait's capture of it would not "
                "(its IR is deterministic)",
            )
        self.last_random = drawn[-1]
        self.expected = now
        self.history.append((now, len(cx.builder.graph.nodes)))

    def draws(self) -> bool:
        """Whether the generator moved since the last accounted state (for opaque calls)."""
        return not _same(cpu_state(), self.expected)

    def untouched(self) -> bool:
        """Whether nothing moved the generators since the capture started (no draw, no seed,
        no state set), the CUDA ones included."""
        cuda = _cuda_states()
        return (
            len(self.history) == 1
            and not self.draws()
            and (cuda is None) == (self.cuda is None)
            and all(_same(a, b) for a, b in zip(cuda or (), self.cuda or ()))
        )

    def redrawable(self, nodes: list[Node]) -> str | None:
        """Why the program's CPU draws so far could not be drawn again by running its calls
        from the caller's state (:mod:`plait.frontend.grad_replay`), or None: a CUDA generator
        moved, or the program seeded or set the generator (not a call a replay makes);
        ``nodes``: the capture's so far."""
        cuda = _cuda_states()
        if (cuda is None) != (self.cuda is None) or not all(
            _same(a, b) for a, b in zip(cuda or (), self.cuda or ())
        ):
            return "a CUDA generator moved during the capture"
        if any(n.op in ("rng_seed", "rng_set_state") for n in nodes):
            return "the program seeded or set the random number generator"
        return None

    # --- internals ---------------------------------------------------------------------------
    def _moved(self, cx: CaptureContext, now: torch.Tensor, value: Any) -> None:
        assert isinstance(value, Value) and value.producer is not None
        self.last_random = value.producer
        self.expected = now
        self.history.append((now, len(cx.builder.graph.nodes)))

    def _find(self, state: torch.Tensor) -> int | None:
        for k in range(len(self.history) - 1, -1, -1):
            if _same(self.history[k][0], state):
                return k
        return None

    def _saved_state(self, cx: CaptureContext, k: int) -> Value:
        """An ``rng_get_state`` at the point where the program was in state ``k``."""
        found = self.saved.get(k)
        if found is not None:
            return found
        value = cx.call("rng_get_state", size=int(self.history[k][0].numel()))
        assert isinstance(value, Value) and value.producer is not None
        nodes = cx.builder.graph.nodes
        node = nodes.pop()
        position = self.history[k][1]
        nodes.insert(position, node)
        # NOTE: later history positions shift by the node put before them
        self.history = [
            (s, p + 1 if p >= position and i > k else p) for i, (s, p) in enumerate(self.history)
        ]
        self.saved[k] = value
        return value

    def _after_cuda(self, cx: CaptureContext, first_node: int) -> None:
        """A CUDA generator that moved during a torch call is accounted for by a random node
        on CUDA tensors among the call's nodes: executors run PyTorch's own random kernels in
        program order, on the same default CUDA generators (the same draws as eager)."""
        now = _cuda_states()
        if now is None or self.cuda is None or len(now) != len(self.cuda):
            return  # NOTE: CUDA started during the call: _check_cuda judges it next
        if all(_same(a, b) for a, b in zip(now, self.cuda)):
            return
        nodes = cx.builder.graph.nodes[first_node:]
        if any(get_op(n.op).is_random(n.attrs) and _on_cuda(n) for n in nodes):
            self.cuda = now
            last = [n for n in nodes if get_op(n.op).is_random(n.attrs)][-1]
            self.last_random = last

    def _cuda_seeded(self, seed: int) -> bool:
        """Whether every CUDA generator is in the state ``manual_seed(seed)`` gives it."""
        now = _cuda_states()
        if now is None:
            return False
        for i, state in enumerate(now):
            g = torch.cuda.default_generators[i]
            g.manual_seed(seed)
            fresh = g.get_state()
            g.set_state(state)
            if not _same(fresh, state):
                return False
        return True

    def _check_cuda(self, cx: CaptureContext) -> None:
        now = _cuda_states()
        if self.cuda is None and now is None:
            return
        if (
            self.cuda is None
            or now is None
            or len(now) != len(self.cuda)
            or not all(_same(a, b) for a, b in zip(now, self.cuda))
        ):
            cx.fail(
                "limitation",
                "the program moved a CUDA random number generator outside a random op plait "
                "captures (a state set from outside the program, or a draw by a call captured "
                "as deterministic); plait replays CUDA draws by its random ops and manual_seed",
            )


def keep_last_draw(cx: CaptureContext, outputs: list[Any]) -> None:
    """NOTE: the graph's last random node must run even when nothing reads it (a trailing
    ``manual_seed``, an unused dropout): it becomes an extra graph output, so dead-code
    elimination keeps it and the generator ends where eager leaves it. So does every runtime
    check (``aten_check``: it raises eager's error on bad values, and computes nothing)."""
    tracker: RngTracker = cx.rng
    kept = [n for n in cx.builder.graph.nodes if n.op == "aten_check"]
    node = tracker.last_random
    if node is not None and node.outputs:
        kept.append(node)
    if not kept:
        return
    live = {id(o) for o in outputs if isinstance(o, Value)}
    for n in reversed(cx.builder.graph.nodes):
        if any(id(v) in live for v in n.outputs):
            live.update(id(v) for v in n.input_values())
    for n in kept:
        if not any(id(v) in live for v in n.outputs):
            outputs.append(n.outputs[0])
