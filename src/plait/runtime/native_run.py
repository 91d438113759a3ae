"""A straight run of a program's native kernel calls as one C call.

Each native call (:mod:`plait.codegen.native_launch`) fills its pointer array and calls its C
entry from Python; inside a model's call that Python cost about 12 us a step. The runner emits
a run of two or more such steps, each reading only arena buffers, weights and biases and
writing its arena buffer, as::

    try:
        _r0 = (id(a3), a3._version, a3.data_ptr(), ...)  # every weight and bias of the run
    except RuntimeError:
        _r0 = False                                       # an inference tensor: no version
    _s0 = _L(P0, None) if _r0 == R0.key else 1           # one C call: the whole run
    if _s0 == 2: _zero_division()                         # (a kernel of the run divided by 0)
    if _s0:                                               # else the calls one by one, then
        X3(V4, a3, a4, out=V6)                            # their arrays copied (bind)
        ...
        R0.bind(_r0, (a3, a4, ...))

:meth:`NativeRun.bind` copies the arrays the calls just filled, after checking that each pointer
in them is one that stays while the key holds: the arena's buffers (the runner's own views), a
weight's prepared copy (made from this very tensor at this version and address), the bias
where it is, and the tensors the call owns. It holds every one of them, so no copied pointer
outlives its memory. The key (identity, version counter and address of each weight and bias)
changes where PyTorch replaces or writes one; a write through ``.data`` bumps no counter, and
the launcher compares a caller's weight's first elements with those its prepared copy was made
from (as :class:`~plait.codegen.extern.PreparedWeight` does) before it runs anything, and
returns 1 where they differ: the calls then run one by one and prepare the weight again.

Example:
    >>> import torch, plait
    >>> m = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1), torch.nn.ReLU(),
    ...                         torch.nn.Conv2d(16, 16, 3, padding=1, groups=16),
    ...                         torch.nn.Conv2d(16, 8, 1), torch.nn.Conv2d(8, 4, 1)).eval()
    >>> cm = plait.compile(m, backend="stax", options={"cache": False})
    >>> x = torch.randn(1, 8, 6, 6)
    >>> with torch.no_grad():
    ...     got, want = cm(x), m(x)
    >>> bool((got - want).abs().max() < 1e-4)
    True
    >>> cm.specializations[0].compiled.program.source.count(".key else 1")  # one run
    1
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from plait.codegen.errors import BuildError
from plait.codegen.extern import written
from plait.codegen.native_launch import NativeLaunch, launcher
from plait.codegen.plan import ExternStep, FallbackStep, KernelStep

if TYPE_CHECKING:
    from plait.runtime.runner_emit import RunnerEmitter

Step = KernelStep | ExternStep | FallbackStep
_INPUT = re.compile(r"a\d+")
# NOTE: a run of one step saves nothing its key does not cost
LEAST = 2
# NOTE: the launcher's step kinds (csrc/launch.h)
ENTRY, KERNEL = 0, 1
# NOTE: what the launcher returns where a kernel divided an integer by zero
ZERO_DIVISION = 2


@dataclass
class _Call:
    """A native call of a run: its launch, each operand's arena tensor (None for the weight
    and the bias) and its result's."""

    launch: NativeLaunch
    data: list[Any]
    out: torch.Tensor


@dataclass
class _Kernel:
    """A generated kernel of a run, every buffer of which the arena's: its C function and the
    global holding the address of its pointers in the runner's table (set once the runner is
    built: :func:`plait.runtime.runner.build_runner`)."""

    fn: Any
    table: str


class NativeRun:
    """The copied arrays of one run of native calls (see the module docstring)."""

    def __init__(self, members: list[_Call | _Kernel], names: dict[str, Any]) -> None:
        self.members, self.names = members, names
        # NOTE: the launcher's array: steps, step count, checks, check count
        self.args = (ctypes.c_int64 * 4)()
        self.key: tuple[int, ...] | None = None
        self.refused: tuple[int, ...] | bool | None = None
        self.held: tuple[Any, ...] = ()

    def bind(self, key: tuple[int, ...] | bool, stable: tuple[Any, ...]) -> None:
        """After the calls ran one by one under ``key``: copy their arrays where every pointer
        in them stays while the key holds, else remember the key as refused. ``stable``: each
        member's weight and bias (None, None for a member without a weight)."""
        if key == self.refused:
            return
        self.key = None
        made = None if isinstance(key, bool) else self._arrays(stable)
        if made is None or isinstance(key, bool):
            self.refused, self.held = key, ()
            return
        steps, count, checks, checked, held = made
        self.held = (steps, checks, held)
        self.args[0], self.args[1] = ctypes.addressof(steps), count
        self.args[2], self.args[3] = ctypes.addressof(checks), checked
        self.key, self.refused = key, None

    def _arrays(self, stable: tuple[Any, ...]) -> tuple[Any, int, Any, int, list[Any]] | None:
        words: list[int] = []
        checks: list[int] = []
        held: list[Any] = []
        for i, member in enumerate(self.members):
            if isinstance(member, _Kernel):
                words += [_address(member.fn), self.names[member.table], 0, KERNEL]
                continue
            launch = member.launch
            if launch.fn is None:
                continue  # NOTE: it returns its own tensor; nothing runs in C
            params = launch.params
            wanted = _wanted(member, stable[2 * i], stable[2 * i + 1], checks, held)
            if wanted is None or any(params[slot] != p for slot, p in wanted):
                return None  # NOTE: e.g. the call read a copy (not laid out as planned)
            ints = (ctypes.c_int64 * len(params))(*params)
            floats = launch.floats
            if floats is not None:
                floats = (ctypes.c_float * len(floats))(*floats)
            held += [ints, floats]
            words += [_address(launch.fn), ctypes.addressof(ints)]
            words += [0 if floats is None else ctypes.addressof(floats), ENTRY]
        steps = (ctypes.c_int64 * max(len(words), 1))(*words)
        table = (ctypes.c_int64 * max(len(checks), 1))(*checks)
        return steps, len(words) // 4, table, len(checks) // 3, held


def _wanted(
    call: _Call, w: Any, b: Any, checks: list[int], held: list[Any]
) -> list[tuple[int, int]] | None:
    """The pointer each of ``call``'s slots must hold for its arrays to run again while the
    key holds (each tensor behind one added to ``held``), or None where its weight's prepared
    copy may not be reused."""
    launch = call.launch
    found: list[tuple[int, int]] = []
    for j, slot in enumerate(launch.operand_slots(len(call.data))):
        if launch.weighted and j == 1:
            value = _prepared(launch.weight, w, checks, held)
            if value is None:
                return None
            found.append((slot, value.data_ptr()))
        elif launch.weighted and j == 2:
            if b is not None and (not b.is_contiguous() or b.is_inference()):
                return None
            found.append((slot, 0 if b is None else b.data_ptr()))
            held.append(b)
        else:
            found.append((slot, call.data[j].data_ptr()))
    for slot, t in [(launch.out, call.out), *launch.owned]:
        found.append((slot, t.data_ptr()))
        held.append(t)
    return found


def _address(fn: Any) -> int:
    value = ctypes.cast(fn, ctypes.c_void_p).value
    assert value is not None
    return value


def _prepared(weight: Any, w: Any, checks: list[int], held: list[Any]) -> torch.Tensor | None:
    """``weight``'s prepared copy where it was made from ``w`` as it is now and stays valid
    while ``w``'s identity, version and address hold (its sampled first elements added to
    ``checks``), else None."""
    if weight.pending is not None or weight.varies or not weight.reuse or weight.finite is not True:
        return None
    if w.is_inference():
        return None  # NOTE: no version counter: it is prepared again at every call
    value = weight.value
    if value is None or weight.source is not w or written(w)[:2] != weight.version[:2]:
        return None
    sample = weight.version[2]
    if weight.watch and sample is not None:
        if not w.is_contiguous() or ctypes.string_at(w.data_ptr(), len(sample)) != sample:
            return None
        buf = ctypes.create_string_buffer(sample, len(sample))
        checks += [w.data_ptr(), len(sample), ctypes.addressof(buf)]
        held.append(buf)
    held += [w, value]
    return value


def _member(em: RunnerEmitter, step: Step) -> tuple[NativeLaunch, list[str], str] | None:
    """A native call a run may hold: its launch, its operands' code and its result's global
    (an arena view, or the call's own tensor)."""
    if not isinstance(step, ExternStep) or step.call.launch is None or len(step.outputs) != 1:
        return None
    out = step.outputs[0]
    launch: NativeLaunch = step.call.launch
    if launch.fn is None:
        result = _fixed_result(em, step, launch)
    elif not step.out_strides or not step.call.native_result(step.out_strides[0]):
        return None
    else:
        result = em.arena_view(out) if em.root(out).home == "arena" else None
    if result is None:
        return None
    args = em.extern_args(step)
    if len(args) > len(launch.slots) or any(isinstance(a, list) for a in args):
        return None
    for j, a in enumerate(args):
        if launch.weighted and j in (1, 2):
            if not (_INPUT.fullmatch(a) or (j == 2 and a == "None")):
                return None
        elif not isinstance(em.g.get(a), torch.Tensor):
            return None  # NOTE: only the runner's own tensors stay where they are
    return launch, args, result


def _arena_kernel(em: RunnerEmitter, step: Step) -> bool:
    """Whether ``step`` is a generated kernel all of whose buffers are the arena's (their
    pointers are written into the runner's table once)."""
    if not isinstance(step, KernelStep) or step.lowered.kernel.size_atoms():
        return False
    values = step.lowered.bindings
    return all(id(v) not in em.inputs and em.root(v).home == "arena" for v in values)


def _fixed_result(em: RunnerEmitter, step: ExternStep, launch: NativeLaunch) -> str | None:
    """The global of a step's own result tensor (``launch.result``) where the plan lays its
    result out as that tensor is; every later reader then reads it there."""
    out, result = step.outputs[0], launch.result
    if result is None or not step.out_strides or tuple(step.out_strides[0]) != result.stride():
        return None
    if id(out) not in em.fixed_results:
        em.fixed_results[id(out)] = em.const(result, "V")
    return em.fixed_results[id(out)]


Member = tuple[NativeLaunch, list[str], str] | None


def plan_runs(em: RunnerEmitter, steps: list[Step]) -> dict[int, tuple[int, list[Member]]]:
    """The runs to emit as one call, first step -> one past the last and each step's native
    call (None: an arena kernel): straight runs of native calls and arena kernels holding at
    least :data:`LEAST` native calls."""
    if em.symbolic or em.profile or em.trace is not None or em.launch:
        return {}
    found: dict[int, tuple[int, list[Member]]] = {}
    start: int | None = None
    members: list[Member] = []
    for k, step in enumerate([*steps, None]):
        call = _member(em, step) if step is not None else None
        kernel = step is not None and _arena_kernel(em, step)
        if (call is not None or kernel) and start is None:
            start, members = k, []
        if call is not None or kernel:
            members.append(call)
        elif start is not None:
            if sum(m is not None for m in members) >= LEAST:
                found[start] = (k, members)
            start = None
    if found:
        try:
            launcher()
        except BuildError:
            return {}  # NOTE: the calls run one by one, as without the launcher
    return found


def emit_run(em: RunnerEmitter, first: int, steps: list[Step], calls: list[Member]) -> None:
    """The lines of one run (see the module docstring); ``first``: its first step's index;
    ``calls``: each step's native call as :func:`plan_runs` found it."""
    members: list[_Call | _Kernel] = []
    stable: list[str] = []
    slow_start = len(em.lines)
    for k, step, member in zip(range(first, first + len(steps)), steps, calls):
        if member is None:
            assert isinstance(step, KernelStep)
            em.kernel_step(k, step)  # NOTE: ``if K(A): _zero_division()``, moved below
            fn, table = re.findall(r"\b[KA]\d+\b", em.lines[-1])[:2]
            members.append(_Kernel(em.g[fn], table))
            stable += ["None", "None"]
            continue
        assert isinstance(step, ExternStep)
        launch, args, out = member
        data = [None if launch.weighted and j in (1, 2) else em.g[a] for j, a in enumerate(args)]
        members.append(_Call(launch, data, em.g[out]))
        into = f", out={out}" if launch.fn is not None else ""
        em.line(f"{em.const(step.call.fn, 'X')}({', '.join(args)}{into})")
        stable += args[1:3] if launch.weighted else ["None", "None"]
    slow = ["    " + text for text in em.lines[slow_start:]]
    del em.lines[slow_start:]
    run = NativeRun(members, em.g)
    name = em.const(run, "R")
    table = em.const(run.args, "P")
    fn = em.const(launcher(), "L")
    keyed = list(dict.fromkeys(a for a in stable if a != "None"))
    key, ran = f"_r{name[1:]}", f"_s{name[1:]}"
    em.line("try:")
    em.line(f"{key} = ({''.join(f'id({a}), {a}._version, {a}.data_ptr(), ' for a in keyed)})", 3)
    em.line("except RuntimeError:")
    em.line(f"{key} = False", 3)  # NOTE: an inference tensor (no version): never a bound key
    em.line(f"{ran} = {fn}({table}, None) if {key} == {name}.key else 1")
    if any(isinstance(m, _Kernel) for m in members):
        em.line(f"if {ran} == {ZERO_DIVISION}: _zero_division()")
    em.line(f"if {ran}:")
    em.lines += slow
    em.line(f"{name}.bind({key}, ({''.join(f'{a}, ' for a in stable)}))", 3)
