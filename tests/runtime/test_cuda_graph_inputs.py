"""Which inputs a graphed program reads in place (``plait.runtime.cuda_graph_inputs``), on CPU
tensors standing in for the caller's: an input is pinned only after two calls at one address
and layout (the static buffer's), aligned; a call replays an in-place graph only while every
input it pins is where it was captured (the one pinning the most); inputs that settle later are
pinned by another capture; after a move the inputs still in place are pinned at once; every
graph is kept, at most ``MAX_CAPTURES`` captures in all; a refused capture is recorded and keeps
the graphs there were. And the copy-out of an output that views a padded buffer (dense), and
of one the runner returned raw while captured (into the plan's strides).
The graphs themselves: ``tests/gpu/test_cuda_graph_in_place.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plait.runtime.cuda_graph_inputs import (
    MAX_CAPTURES,
    Conformed,
    InPlaceGraph,
    InPlaceInputs,
    copy_source,
    dense_source,
    fresh_copies,
)


class _Captures:
    """A stand-in for the capture: records what it was given."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[dict[int, Any]] = []
        self.fail = fail

    def __call__(self, inputs: list[Any], pinned: dict[int, Any]) -> InPlaceGraph:
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        self.seen.append(dict(pinned))
        return InPlaceGraph(object(), pinned, [], [])


def _inputs(statics: list[torch.Tensor]) -> tuple[InPlaceInputs, dict[str, Any]]:
    record: dict[str, Any] = {}
    return InPlaceInputs(record, list(range(len(statics))), statics), record


def _call(inputs: InPlaceInputs, args: list[torch.Tensor], capture: _Captures) -> bool:
    chosen = inputs.pick(args)
    inputs.after_call(args, chosen, capture)
    return chosen is not None


def test_settled_inputs_are_pinned_and_moved_ones_copied() -> None:
    statics = [torch.zeros(4, 3), torch.zeros(5)]
    inputs, record = _inputs(statics)
    w, x = torch.randn(4, 3), torch.randn(5)
    kw, kx = (w.data_ptr(), (3, 1)), (x.data_ptr(), (1,))
    capture = _Captures()
    assert not _call(inputs, [w, torch.randn(5)], capture)
    assert not _call(inputs, [w, x], capture)  # NOTE: w settled: pinned; x moved: copied
    assert capture.seen == [{0: kw}]
    assert _call(inputs, [w, torch.randn(5)], capture)
    assert record["in_place"]["pinned"] == 1 and record["in_place"]["of"] == 2
    assert record["in_place"]["calls"] == {"in_place": 1, "copied": 2}
    assert _call(inputs, [w, x], capture)
    assert _call(inputs, [w, x], capture)  # NOTE: x settled since: pinned too
    assert capture.seen[-1] == {0: kw, 1: kx} and record["in_place"]["pinned"] == 2
    for _ in range(2):
        assert _call(inputs, [w, x], capture)
    assert len(capture.seen) == 2
    moved = w.clone()
    assert not _call(inputs, [moved, x], capture)  # NOTE: a pinned input moved: all copied,
    assert capture.seen[-1] == {1: kx}  # NOTE: and the one still in place pinned at once
    assert _call(inputs, [moved, x], capture)
    assert _call(inputs, [w, x], capture)  # NOTE: the graph pinning both is kept
    assert record["in_place"]["captures"] == 3 == MAX_CAPTURES
    assert record["in_place"]["graphs"] == 3
    other, y = w.clone(), torch.randn(5)
    for _ in range(3):
        assert not _call(inputs, [other, y], capture)
    assert len(capture.seen) == MAX_CAPTURES
    assert "moved after 3 in-place captures" in record["in_place_reason"]
    assert _call(inputs, [other, x], capture)  # NOTE: the graphs there are still serve


def test_an_input_that_moves_back_and_forth_leaves_the_others_in_place() -> None:
    """A training step's cotangent at one of two addresses, other work allocating between
    the steps: the parameters stay read in place, and so does the cotangent once it settled
    at each address."""
    statics = [torch.zeros(4, 3), torch.zeros(5)]
    inputs, record = _inputs(statics)
    w, first, second = torch.randn(4, 3), torch.randn(5), torch.randn(5)
    capture = _Captures()
    assert not _call(inputs, [w, first], capture)
    assert not _call(inputs, [w, first], capture)  # NOTE: both settled: both pinned
    assert not _call(inputs, [w, second], capture)  # NOTE: moved: w alone pinned at once
    assert capture.seen[-1] == {0: (w.data_ptr(), (3, 1))}
    cotangents = [first, second] * 4
    assert all(_call(inputs, [w, c], capture) for c in cotangents)
    assert record["in_place"]["calls"]["copied"] == 3
    assert len(capture.seen) == 2  # NOTE: the second address never came twice in a row
    assert _call(inputs, [w, second], capture)
    assert _call(inputs, [w, second], capture)  # NOTE: settled there too: pinned
    assert capture.seen[-1] == {0: (w.data_ptr(), (3, 1)), 1: (second.data_ptr(), (1,))}
    for c in cotangents:
        assert inputs.pick([w, c]) is not None and len(inputs.pick([w, c]).pinned) == 2


def test_other_layouts_and_unaligned_addresses_are_never_pinned() -> None:
    statics = [torch.zeros(4, 3), torch.zeros(6)]
    inputs, _ = _inputs(statics)
    transposed = torch.randn(3, 4).t()
    unaligned = torch.randn(7)[1:]  # NOTE: 4 bytes past an aligned address
    capture = _Captures()
    for _ in range(3):
        assert not _call(inputs, [transposed, unaligned], capture)
    assert capture.seen == []


def test_a_refused_capture_keeps_the_graph_there_was() -> None:
    statics = [torch.zeros(3), torch.zeros(2)]
    inputs, record = _inputs(statics)
    x, y = torch.randn(3), torch.randn(2)
    capture = _Captures()
    _call(inputs, [x, torch.randn(2)], capture)
    _call(inputs, [x, y], capture)
    capture.fail = True
    for _ in range(4):  # NOTE: y settles; the widening capture is refused
        assert _call(inputs, [x, y], capture)
    assert record["in_place"]["captures"] == 2 and record["in_place"]["pinned"] == 1
    assert record["in_place_reason"].startswith("the in-place capture failed")


def test_a_refused_capture_is_recorded_and_not_tried_again() -> None:
    statics = [torch.zeros(3)]
    inputs, record = _inputs(statics)
    x = torch.randn(3)
    capture = _Captures(fail=True)
    for _ in range(4):
        assert not _call(inputs, [x], capture)
    assert record["in_place_reason"] == (
        "the in-place capture failed: operation not permitted when stream is capturing"
    )
    assert record["in_place"]["captures"] == 1


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    for t, s in zip(targets, sources, strict=True):
        t.copy_(s)


@pytest.mark.parametrize("rows", [1, 5])
def test_a_view_of_a_padded_product_is_copied_as_its_buffer(rows: int) -> None:
    padded = torch.randn(rows, 3, 1008)
    view = padded[..., :1001]
    small = torch.randn(64, 64)[:, :8]  # NOTE: an eighth of its buffer: copied alone
    dense = torch.randn(6)
    sources = [dense_source(t) for t in (view, small, dense)]
    assert sources[0][0] is padded and sources[1][0] is small and sources[2][0] is dense
    got = list(fresh_copies(sources, _copy_all))
    for g, want in zip(got, (view, small, dense), strict=True):
        assert torch.equal(g, want)
        assert g.untyped_storage().data_ptr() != want.untyped_storage().data_ptr()
    assert got[0].stride() == view.stride() and got[1].is_contiguous()


def test_an_output_returned_raw_is_copied_out_in_the_plans_strides() -> None:
    """An extern result the runner returned as PyTorch laid it out while captured (the real
    columns of a padded product) is copied into the plan's strides; one already in them, and
    outputs with no declared strides, are copied as before."""
    padded = torch.randn(2, 3, 1008)
    raw = padded[..., :1001]
    planned = torch.empty(2, 3, 1001).stride()
    dense = torch.randn(2, 3, 1001)
    sources = [
        copy_source(raw, planned),
        copy_source(dense, planned),
        copy_source(raw, None),
    ]
    assert isinstance(sources[0][1], Conformed)
    assert sources[1][0] is dense and sources[1][1] is None
    assert sources[2][0] is padded  # NOTE: no declared strides: the dense copy of its buffer
    got = list(fresh_copies(sources, _copy_all))
    for g, want in zip(got, (raw, dense, raw), strict=True):
        assert torch.equal(g, want)
        assert g.untyped_storage().data_ptr() != want.untyped_storage().data_ptr()
    assert got[0].is_contiguous() and got[1].is_contiguous()
    assert got[2].stride() == raw.stride()
    (alone,) = fresh_copies([copy_source(raw, planned)], _copy_all)
    assert alone.is_contiguous() and torch.equal(alone, raw)
