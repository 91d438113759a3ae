"""Module state on the fast path: fetching the live tensors and guarding frozen ones.

A frozen tensor (a parameter or buffer the compile made a graph constant) is guarded by its
identity, its version counter and its storage address: replacing it (``module.weight = ...``,
``load_state_dict(assign=True)``), writing it in place (an optimizer step, ``load_state_dict``)
or swapping its data (``weight.data = ...``, ``module.to(...)``) each fail a guard. A write
through ``weight.data`` (``weight.data.clamp_(...)``) bumps no version counter PyTorch keeps for
``weight``: for a CPU tensor, the guard also compares its first elements and its strides with
the ones frozen (:mod:`plait.guards.sampled`; NOTE: a write that changes none of
the sampled elements is not seen).

Example:
    >>> import torch
    >>> from plait.frontend import ModuleState
    >>> from plait.guards import GuardEnv, GuardSet
    >>> lin = torch.nn.Linear(2, 2)
    >>> fetch = StateFetcher(ModuleState(lin))
    >>> guards = GuardSet(frozen_guards({"weight": 0}, fetch()))
    >>> env = GuardEnv((), [], lin, fetch())
    >>> guards.holds(env)
    True
    >>> with torch.no_grad():
    ...     _ = lin.weight.mul_(2)
    >>> guards.holds(env), guards.explain(env)[0].split(":")[0]
    (False, 'weight is the frozen tensor, unchanged (identity, version, storage, sampled values)')
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from plait.frontend.guard_build import STATE_SIGNATURES
from plait.frontend.state import ModuleState
from plait.guards import native
from plait.guards.guard import Guard, GuardEnv, ReadTensors, TensorCheck
from plait.guards.sampled import Sample, reading, take_sample

_VERSION = operator.attrgetter("_version")
_DATA_PTR = torch.Tensor.data_ptr


class StateFetcher:
    """``fetch()``: the module's live parameters and buffers in entry order, read from the
    modules' own tables in one native pass (:mod:`plait.guards.native`; without it, one C-level
    ``map``). ``ModuleState.fetch`` is the reference.

    NOTE: holds the modules' ``_parameters``/``_buffers`` dicts; nn.Module never replaces them
    (only their items), and a restructured module fails the structure guard first."""

    def __init__(self, ms: ModuleState) -> None:
        self.tables: list[dict[str, Any]] = []
        self.keys: list[str] = []
        for e in ms.entries:
            owner, attr = e.slots[0]
            self.tables.append(owner._parameters if e.kind == "param" else owner._buffers)
            self.keys.append(attr)
        fast = native.fetcher(self.tables, self.keys)
        self.native = fast is not None
        self._fetch: Callable[[], list[torch.Tensor]] = fast or self._python

    def _python(self) -> list[torch.Tensor]:
        return list(map(operator.getitem, self.tables, self.keys))

    def __call__(self) -> list[Any]:
        try:
            return self._fetch()
        except KeyError:
            # NOTE: a slot removed (``del module.buffer``): None there fails every guard on
            # it, and the recompile reads the module state again (ModuleState.structure_intact)
            return [table.get(key) for table, key in zip(self.tables, self.keys)]


def _signature(t: torch.Tensor) -> tuple[int, int, int]:
    return (id(t), t._version, t.data_ptr())


def _sampled(t: Any, s: Sample | None) -> bytes | None:
    return None if s is None else reading(t, s)


_SIG = operator.attrgetter("dtype", "shape", "device", "requires_grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _picker(index: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    if not index:
        return lambda seq: ()
    if len(index) == 1:
        k = index[0]
        return lambda seq: (seq[k],)
    return operator.itemgetter(*index)


def frozen_guards(
    slots: Mapping[str, int],
    state: Sequence[torch.Tensor],
    used: Sequence[int] = (),
    grad: bool | None = None,
) -> list[Guard]:
    """Guards for the frozen tensors ``slots`` (name -> index into the module state): one
    batch guard for the fast path, then one guard per tensor for explanations and the cache
    key (which names the frozen tensors; their values enter it through the weights hash).

    The batch guard reads, in C-level passes, the frozen tensors' identities, versions and
    storage addresses (and ``requires_grad`` when grad mode was on: only then could it matter),
    and the signatures of the other ``used`` state tensors; it takes over the fast-path duty of
    capture's guard on the state's signatures, which is then checked only to explain a miss.
    NOTE: a frozen tensor's dtype, shape and device change only with its storage or version,
    except through ``tensor.data = <a view of the same storage>`` or a write through ``.data``
    (``.data.add_()``), which bypass PyTorch's own tracking: a CPU tensor's sampled elements,
    strides, dtype and shape are read for those (:mod:`plait.guards.sampled`)."""
    if not slots:
        return []
    grad = torch.is_grad_enabled() if grad is None else grad
    names = list(slots)
    index = [slots[n] for n in names]
    others = sorted(set(used) - set(index))
    pick, pick_others = _picker(index), _picker(others)
    samples = [take_sample(state[k]) for k in index]

    def read_all(env: GuardEnv) -> tuple[tuple[Any, ...], ...]:
        now = pick(env.state)
        return (
            tuple(map(id, now)),
            tuple(map(_VERSION, now)),
            tuple(map(_DATA_PTR, now)),
            tuple(map(_REQUIRES_GRAD, now)) if grad else (),
            tuple(map(_SIG, pick_others(env.state))),
            tuple(map(_sampled, now, samples)),
        )

    expected = read_all(GuardEnv((), [], None, state))
    ids, versions, ptrs, grads, sigs, _ = expected
    checks = [
        TensorCheck(
            "state",
            k,
            identity=i,
            version=v,
            data_ptr=p,
            requires_grad=grads[j] if grad else None,
            # NOTE: the type a sample's offsets hold for, checked before it is read
            dtype=None if s is None else s.dtype,
            device=None if s is None else state[k].device,
            shape=None if s is None else s.shape,
            sample=s,
        )
        for j, (k, i, v, p, s) in enumerate(zip(index, ids, versions, ptrs, samples))
    ]
    for k, (dtype, shape, device, rg) in zip(others, sigs):
        checks.append(
            TensorCheck(
                "state", k, dtype=dtype, device=device, shape=tuple(shape), requires_grad=rg
            )
        )
    out = [
        Guard(
            "state",
            "frozen tensors",
            f"{len(names)} frozen tensors unchanged",
            expected,
            read_all,
            batch=True,
            replaces=STATE_SIGNATURES,
            native=ReadTensors(tuple(checks)),
        )
    ]
    for name, k, s in zip(names, index, samples):
        out.append(_frozen_guard(name, k, state[k], s))
    return out


def _frozen_guard(name: str, k: int, tensor: torch.Tensor, s: Sample | None) -> Guard:
    def read(env: GuardEnv) -> tuple[Any, ...]:
        t = env.state[k]
        return (*_signature(t), _sampled(t, s))

    what = "identity, version, storage" + (", sampled values" if s is not None else "")
    return Guard(
        "state",
        name,
        f"{name} is the frozen tensor, unchanged ({what})",
        (*_signature(tensor), _sampled(tensor, s)),
        read,
        redundant=True,
        fmt=_fmt_frozen,
        key=f"frozen|{name}",
    )


def _fmt_frozen(read: Any) -> str:
    if not isinstance(read, tuple) or len(read) != 4:
        return repr(read)
    ident, version, ptr, raw = read
    values = "" if raw is None else f", sampled values {bytes(raw).hex()}"
    return f"version {version} (tensor {ident:#x}, storage {ptr:#x}{values})"
