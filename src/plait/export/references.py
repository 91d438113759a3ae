"""Reference cases: fresh inputs drawn at export, what eager PyTorch, its float64 copy and the
compiled program returned on them, and the conformance gate's judgement of a candidate against
them (what ``plait.verify`` runs, and what export runs on the artifact it just made).

Inputs are drawn by the gate's own rule (:func:`plait.conformance.draw_like`: shaped like the
example, never its values, never zeros) from fixed seeds, so an export is reproducible. The
gate then judges the candidate as it judges any program: its references are lookups of the
stored outputs for the stored inputs (``reference`` the eager outputs, ``reference64`` the
float64 ones), under the contract stored with them.

Example:
    >>> import torch
    >>> cases = draw_cases((torch.zeros(2, 3),), {}, 2)
    >>> len(cases), bool(cases[0][0][0].ne(0).all())
    (2, True)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import plait.conformance
from plait.conformance.compare import identical
from plait.conformance.draws import apply_layout
from plait.contract import Contract
from plait.errors import ArtifactFormatError, UnknownNameError
from plait.export.calling import Binder, count_leaves, leaves_from_json
from plait.export.tensors import dtype_text, read_tensors, write_tensors
from plait.frontend import pytree

KINDS = ("eager", "float64", "compiled")
_SEED = 7717
# NOTE: how a stored input is laid out when a case is made of it (safetensors stores values, in
# row-major order): the example's own memory format, where it had one
FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}


def memory_format(t: torch.Tensor) -> str:
    """The name of ``t``'s memory format (``contiguous`` for any other strides)."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "channels_last_3d"
    return "contiguous"


def laid_out(leaves: Sequence[Any], layouts: Sequence[str | None]) -> list[Any]:
    """Each tensor leaf in its memory format (``layouts``: one name, or None, per leaf)."""
    return [
        x.contiguous(memory_format=FORMATS[f]) if isinstance(x, torch.Tensor) and f else x
        for x, f in zip(leaves, layouts)
    ]


def draw_cases(args: tuple, kwargs: dict, count: int) -> list[tuple[tuple, dict]]:
    """``count`` fresh draws shaped like the call ``(args, kwargs)`` (fixed seeds)."""
    out = []
    for k in range(count):
        drawn = plait.conformance.draw_like((*args, kwargs), _SEED + k)
        out.append((tuple(drawn[:-1]), dict(drawn[-1])))
    return out


def float64_copy(fn: Any) -> tuple[Callable[..., Any] | None, str]:
    """The float64 program the anchor runs (a module's float64 deep copy; a function as it is,
    on float64 inputs), or None and why there is none."""
    if isinstance(fn, nn.Module):
        try:
            return copy.deepcopy(fn).double(), "a float64 copy of the module"
        except Exception as exc:
            return None, f"the module cannot be copied to float64 ({type(exc).__name__}: {exc})"
    return fn, "the function on float64 inputs"


def widen(x: Any) -> Any:
    """Float tensors as float64 (complex as complex128), other leaves as they are."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_complex:
            return x.detach().to(torch.complex128)
        return x.detach().double() if x.dtype.is_floating_point else x.detach()
    return x


def float64_outputs(result: Sequence[Any], eager: Sequence[Any]) -> str | None:
    """Why ``result`` (flat leaves) cannot anchor ``eager``'s, or None."""
    if len(result) != len(eager):
        return "the float64 run returned another structure"
    for r, e in zip(result, eager):
        floating = isinstance(e, torch.Tensor) and e.dtype.is_floating_point
        if floating and (not isinstance(r, torch.Tensor) or r.dtype != torch.float64):
            return "an output is not float64 when the inputs are"
    return None


@dataclass
class ReferenceCases:
    """The stored cases: input leaves per case (in the call's leaf order), output leaves per
    case and kind (``eager``, ``float64``, ``compiled``; tensors only, value leaves from
    ``outputs``), and the structure that rebuilds a call and a result."""

    inputs: list[list[Any]]
    outputs: dict[str, list[list[Any]]]
    binder: Binder
    call_spec: Any
    out_spec: Any
    anchored: bool

    @property
    def count(self) -> int:
        return len(self.inputs)

    def call(self, k: int) -> tuple[tuple, dict]:
        """Case ``k`` as ``(args, kwargs)`` (fresh copies)."""
        leaves = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.inputs[k]]
        named = {}
        i = 0
        for name, sub in self.call_spec:
            n = count_leaves(sub)
            named[name] = pytree.unflatten(sub, leaves[i : i + n])
            i += n
        return self.binder.arguments(named)

    def result(self, k: int, kind: str) -> Any:
        leaves = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.outputs[kind][k]]
        return pytree.unflatten(self.out_spec, leaves)

    def place(self, device: torch.device) -> None:
        """Inputs, eager and compiled outputs on the program's device (safetensors holds them on
        the CPU); the float64 outputs stay on the CPU, where the gate's anchor runs."""

        def on(rows: list[list[Any]]) -> list[list[Any]]:
            return [[x.to(device) if isinstance(x, torch.Tensor) else x for x in r] for r in rows]

        self.inputs = on(self.inputs)
        for kind in ("eager", "compiled"):
            if kind in self.outputs:
                self.outputs[kind] = on(self.outputs[kind])

    def find(self, leaves: Sequence[Any]) -> int | None:
        """The case whose inputs these leaves are (float values compared in float64)."""
        for k, stored in enumerate(self.inputs):
            if len(stored) == len(leaves) and all(_same(a, b) for a, b in zip(leaves, stored)):
                return k
        return None


def same_bits(got: Sequence[Any], want: Sequence[Any]) -> bool:
    """Whether output leaves ``got`` are ``want``'s very values: tensors the gate's
    :func:`~plait.conformance.compare.identical` finds equal bit for bit (every NaN equal to every
    NaN: ``torch.equal`` finds a NaN unequal to itself), other leaves equal."""
    return len(got) == len(want) and all(_same_leaf(g, w) for g, w in zip(got, want))


def _same_leaf(a: Any, b: Any) -> bool:
    if not isinstance(b, torch.Tensor):
        return not isinstance(a, torch.Tensor) and bool(a == b)
    return isinstance(a, torch.Tensor) and identical(a, b)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if not isinstance(a, torch.Tensor):
        return bool(a == b)
    if a.shape != b.shape:
        return False
    return bool(torch.equal(widen(a).cpu(), widen(b).cpu()))


def pack(
    cases: ReferenceCases, out_leaves: list[dict[str, Any]], layouts: list[str | None]
) -> tuple[bytes, dict[str, Any]]:
    """The cases as ``reference.safetensors`` and the document ``reference.json`` holds."""
    tensors = {}
    for k, leaves in enumerate(cases.inputs):
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                tensors[f"case{k}/input/{i}"] = x
    for kind, per_case in cases.outputs.items():
        for k, leaves in enumerate(per_case):
            for j, x in enumerate(leaves):
                if isinstance(x, torch.Tensor):
                    tensors[f"case{k}/{kind}/{j}"] = x
    doc = {
        "cases": cases.count,
        "kinds": sorted(cases.outputs),
        "outputs": out_leaves,
        "layouts": layouts,
    }
    return write_tensors(tensors), doc


def unpack(
    data: bytes,
    doc: Any,
    in_leaves: list[dict[str, Any]],
    binder: Binder,
    call_spec: Any,
    out_spec: Any,
    in_types: Mapping[int, tuple[torch.dtype, tuple[int, ...] | None]],
) -> ReferenceCases:
    """The cases of an artifact, checked: each stored input against the program's declared
    input type (``in_types``: leaf -> dtype and static shape), and every name accounted for."""
    if not isinstance(doc, dict) or type(doc.get("cases")) is not int or doc["cases"] < 1:
        raise ArtifactFormatError("reference.json: 'cases' is not a positive count")
    kinds = doc.get("kinds")
    if not isinstance(kinds, list) or "eager" not in kinds or not set(kinds) <= set(KINDS):
        raise ArtifactFormatError(f"reference.json: kinds {kinds!r}; known: {list(KINDS)}")
    out_leaves = leaves_from_json(doc.get("outputs"))
    layouts = doc.get("layouts")
    if not isinstance(layouts, list) or len(layouts) != len(in_leaves):
        raise ArtifactFormatError("reference.json: 'layouts' does not name one per input leaf")
    if not all(f is None or f in FORMATS for f in layouts):
        raise ArtifactFormatError(f"reference.json: layouts {layouts!r}; known: {list(FORMATS)}")
    if len(out_leaves) != count_leaves(out_spec):
        raise ArtifactFormatError("reference.json: the outputs do not fit the result's structure")
    tensors = read_tensors("reference.safetensors", data)
    taken: set[str] = set()

    def get(name: str, where: str) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ArtifactFormatError(f"reference.safetensors: {where} ({name}) is missing")
        taken.add(name)
        return t

    inputs = []
    for k in range(doc["cases"]):
        row = []
        for i, leaf in enumerate(in_leaves):
            if leaf["kind"] == "value":
                row.append(leaf["value"])
                continue
            t = get(f"case{k}/input/{i}", f"input {leaf['path']} of case {k}")
            dtype, shape = in_types.get(i, (t.dtype, None))
            if t.dtype != dtype or (shape is not None and tuple(t.shape) != shape):
                declared = "*" if shape is None else list(shape)
                raise ArtifactFormatError(
                    f"reference.safetensors: input {leaf['path']} of case {k} is "
                    f"{dtype_text(t.dtype)}{list(t.shape)}, the program declares "
                    f"{dtype_text(dtype)}{declared}"
                )
            row.append(t)
        inputs.append(laid_out(row, layouts))
    outputs: dict[str, list[list[Any]]] = {}
    for kind in kinds:
        outputs[kind] = []
        for k in range(doc["cases"]):
            row = []
            for j, leaf in enumerate(out_leaves):
                if leaf["kind"] == "value":
                    row.append(leaf["value"])
                else:
                    row.append(get(f"case{k}/{kind}/{j}", f"{kind} output {leaf['path']}"))
            outputs[kind].append(row)
    extra = sorted(set(tensors) - taken)
    if extra:
        raise ArtifactFormatError(f"reference.safetensors: tensors nothing declares: {extra[:8]}")
    return ReferenceCases(inputs, outputs, binder, call_spec, out_spec, "float64" in kinds)


InputOutputs = Callable[[Sequence[Any]], Mapping[int, torch.Tensor]]


class _Lookup:
    """A reference program that answers the stored outputs of ``kind`` for the stored inputs,
    and refuses any other input (it is no program: it only remembers). The output leaves eager
    gave as the call's inputs or views of them (``input_outputs``, from the calling convention)
    are rebuilt on this call's inputs, so that they alias them as eager's did."""

    # NOTE: stored outputs are separate tensors where eager's may view one another: the gate
    # does not judge the candidate's output aliasing against them (tests/export/test_aliasing.py
    # checks a loaded program's views against eager's)
    output_aliases_known = False

    def __init__(self, cases: ReferenceCases, kind: str, input_outputs: InputOutputs) -> None:
        self.cases, self.kind, self.input_outputs = cases, kind, input_outputs

    def __call__(self, *args: Any) -> Any:
        positional, kwargs = _unpack_args(args)
        _, leaves, _ = self.cases.binder.flatten(positional, kwargs)
        k = self.cases.find(leaves)
        if k is None:
            raise UnknownNameError(f"the artifact stores no {self.kind} result for these inputs")
        views = self.input_outputs(leaves) if self.kind == "eager" else {}
        if not views:
            return self.cases.result(k, self.kind)
        out = [
            x.clone() if isinstance(x, torch.Tensor) else x
            for x in self.cases.outputs[self.kind][k]
        ]
        for j, view in views.items():
            out[j] = view
        return pytree.unflatten(self.cases.out_spec, out)


# NOTE: the gate passes positional arguments only: a call's keyword arguments ride last, in a
# dict marked by this key
_KEYWORDS = "__plait_keywords__"


def _unpack_args(args: tuple) -> tuple[tuple, dict]:
    if args and isinstance(args[-1], dict) and _KEYWORDS in args[-1]:
        kwargs = dict(args[-1])
        kwargs.pop(_KEYWORDS)
        return tuple(args[:-1]), kwargs
    return tuple(args), {}


def judge(
    candidate: Callable[..., Any],
    cases: ReferenceCases,
    contract: Contract,
    input_outputs: InputOutputs,
) -> plait.conformance.Report:
    """The gate's report on ``candidate`` against the stored cases under ``contract``;
    ``input_outputs`` gives the output leaves eager returns as the call's inputs or views of
    them (``LoadedProgram.input_outputs``)."""

    def as_positional(k: int) -> tuple:
        args, kwargs = cases.call(k)
        return (*args, {_KEYWORDS: True, **kwargs}) if kwargs else args

    def factory(seed: int) -> tuple:
        return as_positional((seed - 1) % cases.count)

    def call(*args: Any) -> Any:
        positional, kwargs = _unpack_args(args)
        return candidate(*positional, **kwargs)

    reference = _Lookup(cases, "eager", input_outputs)
    anchor = _Lookup(cases, "float64", input_outputs) if cases.anchored else None
    return plait.conformance.check(
        reference,
        call,
        factory,
        contract=contract,
        draws=cases.count,
        stress=None,
        special_values=False,  # NOTE: the artifact stores eager's results on its cases alone
        reference64=anchor,
        op_class="model",
        layouts=(_gate_layout(cases),),
    )


def _gate_layout(cases: ReferenceCases) -> str:
    """The gate's layout that lays the stored cases out as they are: ``channels_last`` where
    the cases' 4-D (5-D) float inputs are all channels-last (the example's memory format, which
    the program may read and its guards pin), else ``contiguous``."""
    stored = tuple(x for x in cases.inputs[0] if isinstance(x, torch.Tensor))
    (laid,), changed = apply_layout((stored,), "channels_last")
    if changed and all(a.stride() == b.stride() for a, b in zip(laid, stored)):
        return "channels_last"
    return "contiguous"
