"""The artifact payload read without safetensors' copy: tensors built on the buffer (no copy when
it is writable, one copy when it is not), every byte range checked, anything malformed refused."""

from __future__ import annotations

import gc
import json
import struct

import pytest
import torch

from plait.cache.artifact import FORMAT, pack, unpack


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 4, generator=g),
        "h": torch.randn(5, generator=g).to(torch.bfloat16),
        "d": torch.randn(2, 2, generator=g).double(),
        "i": torch.arange(7),
        "b": torch.tensor([True, False, True]),
        "u": torch.arange(3, dtype=torch.uint8),
        "e": torch.empty(0, 3),
        "s": torch.tensor(2.5),
    }


def test_round_trip_every_dtype() -> None:
    tensors = _tensors()
    doc, out = unpack(pack({"graph": "g", "n": [1, 2]}, tensors))
    assert doc == {"graph": "g", "n": [1, 2]}
    assert set(out) == set(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t), name


def test_tensors_are_built_on_a_writable_buffer_without_a_copy() -> None:
    buf = bytearray(pack({}, _tensors()))
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    _, out = unpack(memoryview(buf))
    for name, t in out.items():
        if t.numel():
            assert base <= t.data_ptr() < base + len(buf), name
            assert t.data_ptr() % t.element_size() == 0, name
    out["w"][0, 0] = 123.0  # NOTE: the tensor is the buffer
    _, again = unpack(bytes(buf))
    assert again["w"][0, 0] == 123.0


def test_read_only_bytes_are_copied_once_and_stay_untouched() -> None:
    data = pack({}, {"w": torch.ones(4)})
    _, out = unpack(data)  # NOTE: no "non-writable buffer" warning (warnings are errors)
    out["w"].add_(1)
    assert torch.equal(unpack(data)[1]["w"], torch.ones(4))


def test_tensors_keep_their_buffer_alive() -> None:
    _, out = unpack(memoryview(bytearray(pack({}, {"w": torch.arange(1000.0)}))))
    gc.collect()
    assert torch.equal(out["w"], torch.arange(1000.0))


def _raw(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


META = {"format": FORMAT, "plait": "{}"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a safetensors artifact"),
        (struct.pack("<Q", 1 << 40) + b"{}", "header of"),
        (struct.pack("<Q", 3) + b"{x}", "not JSON"),
        (_raw({"__metadata__": {"format": "other"}}, b""), "artifact format"),
        (_raw({"__metadata__": META, "w": {"dtype": "F99", "shape": [1],
                                          "data_offsets": [0, 4]}}, bytes(4)), "F99"),
        (_raw({"__metadata__": META, "w": {"dtype": "F32", "shape": [2],
                                          "data_offsets": [0, 4]}}, bytes(4)), "bytes 0..4"),
        (_raw({"__metadata__": META, "w": {"dtype": "F32", "shape": [-1],
                                          "data_offsets": [0, 4]}}, bytes(4)), "shape"),
        (_raw({"__metadata__": META, "w": {"dtype": "F32", "shape": [1],
                                          "data_offsets": [0, "4"]}}, bytes(4)), "data_offsets"),
        (_raw({"__metadata__": META, "w": {"dtype": "F32", "shape": [1],
                                          "data_offsets": [4, 8]}}, bytes(8)), "gap"),
        (_raw({"__metadata__": META,
               "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)), "overlap"),
        (_raw({"__metadata__": META, "w": {"dtype": "F32", "shape": [1],
                                          "data_offsets": [0, 4]}}, bytes(8)), "end at"),
        (_raw({"__metadata__": META, "w": {"dtype": "F32", "shape": [2],
                                          "data_offsets": [0, 8]}}, bytes(4)), "end at"),
        (_raw({"__metadata__": {"format": FORMAT, "plait": "[1]"}}, b""), "not a JSON object"),
    ],
    ids=["empty", "huge-header", "bad-json", "format", "dtype", "size", "negative-dim",
         "offset-type", "gap", "overlap", "trailing-bytes", "past-the-end", "doc"],
)  # fmt: skip
def test_malformed_artifacts_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack(data)
