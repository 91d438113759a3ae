"""oneDNN's prepacked weights as bytes and back (:mod:`plait.codegen.packed`), and the plan's
record of them (:class:`plait.codegen.onednn.PackedWeights`): an imported weight is the exported
one (same dense values, and the same oneDNN kernel given either gives the same bits), it reads
its bytes in place, anything malformed is refused, a saved pack is adopted instead of reordered,
and only weights prepared from their own constant are exported."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
import torch

from plait.codegen import onednn, packed
from plait.codegen.extern import PreparedWeight
from plait.codegen.onednn import PackedWeights, SavedPack
from plait.codegen.packed import PackedUnavailable, export_packed, import_packed, unavailable
from tests.util import needs_packs

pytestmark = needs_packs

BF16 = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skipif(
        not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no oneDNN bfloat16 here"
    ),
    id="bf16",
)
DTYPES = [pytest.param(torch.float32, id="fp32"), BF16]

# NOTE: (out channels, in channels per group, kernel, stride, padding, dilation, groups, in hw)
CONVS = {
    "1x1": (8, 4, 1, 1, 0, 1, 1, 9),
    "3x3": (16, 8, 3, 1, 1, 1, 1, 10),
    "7x7-stride2": (16, 3, 7, 2, 3, 1, 1, 17),
    "3x3-groups4": (16, 4, 3, 1, 1, 1, 4, 8),
    "3x3-depthwise": (16, 1, 3, 1, 1, 1, 16, 8),
    "3x3-dilation2": (12, 5, 3, 1, 2, 2, 1, 11),
}
LINEARS = {"32x16-rows5": (32, 16, 5), "7x33-rows1": (7, 33, 1), "64x128-rows8": (64, 128, 8)}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Conv:
    """One conv geometry: its weight, its prepacked weight and the oneDNN call on either."""

    def __init__(self, case: str, dtype: torch.dtype, seed: int = 0) -> None:
        cout, cin, k, stride, pad, dil, groups, hw = CONVS[case]
        self.dtype = dtype
        self.stride, self.padding, self.dilation = [stride] * 2, [pad] * 2, [dil] * 2
        self.groups = groups
        self.size = [2, cin * groups, hw, hw]
        self.w = torch.randn(cout, cin, k, k, generator=_gen(seed)).to(dtype)
        self.b = torch.randn(cout, generator=_gen(seed + 1)).to(dtype)
        self.packed = self.pack(self.w)

    def pack(self, w: torch.Tensor) -> torch.Tensor:
        reorder = torch.ops.mkldnn._reorder_convolution_weight
        return reorder(w, self.padding, self.stride, self.dilation, self.groups, self.size)

    def x(self, seed: int) -> torch.Tensor:
        x = torch.randn(self.size, generator=_gen(seed)).to(self.dtype)
        return x.contiguous(memory_format=torch.channels_last)

    def run(self, x: torch.Tensor, w: torch.Tensor, unary: str = "none") -> torch.Tensor:
        op = torch.ops.mkldnn._convolution_pointwise
        return op(x, w, self.b, self.padding, self.stride, self.dilation, self.groups, unary,
                  [], "")  # fmt: skip

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        conv = torch.conv2d(
            x, self.w, self.b, self.stride, self.padding, self.dilation, self.groups
        )
        return conv


def _import(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` exported, its bytes copied to memory of their own, and imported from the copy:
    (the imported tensor, the copy it reads)."""
    data, md = export_packed(t)
    copy = data.clone()
    return import_packed(copy, md, t.shape, t.dtype), copy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CONVS))
def test_conv_weight_round_trip(case: str, dtype: torch.dtype) -> None:
    conv = Conv(case, dtype)
    assert conv.packed.is_mkldnn, "oneDNN did not prepack this weight"
    data, md = export_packed(conv.packed)
    assert data.dtype == md.dtype == torch.uint8 and data.dim() == md.dim() == 1
    assert data.numel() == torch.ops.mkldnn._nbytes(conv.packed)
    imported, _copy = _import(conv.packed)
    assert imported.is_mkldnn
    assert imported.shape == conv.packed.shape and imported.dtype == dtype
    assert torch.equal(imported.to_dense(), conv.packed.to_dense())
    assert torch.equal(imported.to_dense(), conv.w)  # NOTE: a reorder moves values, exactly
    for seed in (10, 11, 12):
        x = conv.x(seed)
        # NOTE: the same oneDNN kernel on the same weight bytes: the same bits
        expected = conv.run(x, conv.packed)
        assert torch.equal(conv.run(x, imported), expected)
        assert torch.equal(conv.run(x, imported, "relu"), conv.run(x, conv.packed, "relu"))
        torch.testing.assert_close(expected, conv.eager(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(LINEARS))
def test_linear_weight_round_trip(case: str, dtype: torch.dtype) -> None:
    cout, cin, rows = LINEARS[case]
    w = torch.randn(cout, cin, generator=_gen(0)).to(dtype)
    b = torch.randn(cout, generator=_gen(1)).to(dtype)
    p = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    assert p.is_mkldnn, "oneDNN did not prepack this weight"
    imported, _copy = _import(p)
    assert imported.is_mkldnn and imported.shape == p.shape and imported.dtype == dtype
    assert torch.equal(imported.to_dense(), p.to_dense())
    assert torch.equal(imported.to_dense(), w)
    op = torch.ops.mkldnn._linear_pointwise
    for seed in (10, 11, 12):
        x = torch.randn(rows, cin, generator=_gen(seed)).to(dtype)
        expected = op(x, p, b, "none", [], "")
        assert torch.equal(op(x, imported, b, "none", [], ""), expected)
        assert torch.equal(op(x, imported, b, "relu", [], ""), op(x, p, b, "relu", [], ""))
        torch.testing.assert_close(expected, torch.nn.functional.linear(x, w, b))


def test_export_is_a_view_of_the_prepacked_tensor() -> None:
    conv = Conv("3x3", torch.float32)
    data, _ = export_packed(conv.packed)
    assert data.data_ptr() == torch.ops.mkldnn.data_ptr(conv.packed)
    data_again, _ = export_packed(conv.packed)
    assert torch.equal(data, data_again)


def test_the_imported_tensor_borrows_its_bytes_and_copies_the_descriptor() -> None:
    first, second = Conv("3x3", torch.float32, seed=0), Conv("3x3", torch.float32, seed=5)
    assert not torch.equal(first.w, second.w)
    data1, md1 = export_packed(first.packed)
    data2, md2 = export_packed(second.packed)
    assert torch.equal(md1, md2)  # NOTE: one geometry, one layout
    buf, md = data1.clone(), md1.clone()
    imported = import_packed(buf, md, first.packed.shape, first.packed.dtype)
    assert torch.ops.mkldnn.data_ptr(imported) == buf.data_ptr()
    assert torch.equal(imported.to_dense(), first.w)
    # NOTE: the descriptor was read at the import: overwriting it changes nothing
    md.copy_(torch.randint(0, 256, md.shape, dtype=torch.uint8, generator=_gen(3)))
    assert torch.equal(imported.to_dense(), first.w)
    # NOTE: the bytes are read in place: writing them writes the weight
    buf.copy_(data2)
    assert torch.equal(imported.to_dense(), second.w)
    x = first.x(20)
    assert torch.equal(first.run(x, imported), first.run(x, second.packed))


def test_export_refuses_a_dense_tensor() -> None:
    with pytest.raises(ValueError, match="not a oneDNN"):
        export_packed(torch.randn(4, 3, 3, 3, generator=_gen(0)))


def _exported() -> tuple[Conv, torch.Tensor, torch.Tensor]:
    conv = Conv("3x3", torch.float32)
    data, md = export_packed(conv.packed)
    return conv, data.clone(), md


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d[:-1].clone(),
        lambda d: d[: d.numel() // 2].clone(),
        lambda d: torch.cat([d, d[:64]]),
        lambda d: d[:0].clone(),
    ],
    ids=["one-short", "half", "extra", "empty"],
)
def test_import_refuses_bytes_of_another_size(change: Any) -> None:
    conv, data, md = _exported()
    with pytest.raises(ValueError, match="bytes for a descriptor of"):
        import_packed(change(data), md, conv.packed.shape, conv.packed.dtype)


def test_import_refuses_other_buffers() -> None:
    conv, data, md = _exported()
    shape, dtype = conv.packed.shape, conv.packed.dtype
    assert data.numel() % 4 == 0
    with pytest.raises(ValueError, match="uint8"):
        import_packed(data.view(torch.float32), md, shape, dtype)
    with pytest.raises(ValueError, match="uint8"):
        import_packed(data, md.view(torch.int8), shape, dtype)
    strided = torch.stack([data, data], dim=1)[:, 0]
    assert not strided.is_contiguous() and torch.equal(strided, data)
    with pytest.raises(ValueError, match="contiguous"):
        import_packed(strided, md, shape, dtype)
    with pytest.raises(PackedUnavailable, match="dtype"):
        import_packed(data, md, shape, torch.float64)


@pytest.mark.parametrize("wrong", ["dtype", "shape"])
def test_import_refuses_a_shape_or_dtype_the_descriptor_does_not_describe(wrong: str) -> None:
    conv = Conv("3x3", torch.float32)
    data, md = export_packed(conv.packed)
    shape = tuple(conv.packed.shape)
    dtype = torch.bfloat16 if wrong == "dtype" else torch.float32
    if wrong == "shape":
        shape = (shape[1], shape[0], *shape[2:])
    with pytest.raises(ValueError):
        import_packed(data, md, shape, dtype)


def test_unavailable_shim_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise PackedUnavailable("this PyTorch lacks oneDNN weight serialization: test")

    monkeypatch.setattr(packed, "_shim", missing)
    assert unavailable() == "this PyTorch lacks oneDNN weight serialization: test"
    conv = Conv("1x1", torch.float32)
    with pytest.raises(PackedUnavailable):
        export_packed(conv.packed)


# --- PackedWeights: what a plan loads and exports ----------------------------------------------


def _weight(conv: Conv, calls: list[torch.Tensor]) -> PreparedWeight:
    def convert(w: torch.Tensor) -> torch.Tensor:
        calls.append(w)
        return conv.pack(w)

    return PreparedWeight(convert)


def _saved(conv: Conv) -> SavedPack:
    data, md = export_packed(conv.packed)
    return SavedPack(data.clone(), md, tuple(conv.packed.shape), conv.packed.dtype)


def test_a_saved_pack_is_adopted_not_reordered() -> None:
    conv = Conv("7x7-stride2", torch.float32)
    pack = _saved(conv)
    packs = PackedWeights({"k": pack})
    calls: list[torch.Tensor] = []
    weight = _weight(conv, calls)
    fixed = conv.w.clone()
    assert packs.load("k", weight, fixed)
    assert weight(fixed) is weight.value and calls == []
    assert weight.keep is pack.data
    assert torch.ops.mkldnn.data_ptr(weight.value) == pack.data.data_ptr()
    for seed in (1, 2):
        x = conv.x(seed)
        assert torch.equal(conv.run(x, weight(fixed)), conv.run(x, conv.packed))
    assert calls == [] and packs.unusable == {}
    # NOTE: another tensor, or the constant written in place: converted afresh
    other = conv.w.clone()
    weight(other)
    assert len(calls) == 1 and calls[0] is other and weight.keep is None
    fixed2 = conv.w.clone()
    assert packs.load("k", weight, fixed2)
    fixed2.mul_(2)
    x = conv.x(3)
    assert torch.equal(conv.run(x, weight(fixed2)), conv.run(x, conv.pack(conv.w * 2)))
    assert len(calls) == 2 and calls[1] is fixed2


def test_a_key_without_a_saved_pack_loads_nothing() -> None:
    conv = Conv("1x1", torch.float32)
    packs = PackedWeights({"k": _saved(conv)})
    weight = _weight(conv, [])
    assert not packs.load("other", weight, conv.w)
    assert weight.value is None and packs.unusable == {}


def test_an_unusable_saved_pack_is_recorded_and_not_adopted() -> None:
    conv = Conv("3x3", torch.float32)
    good = _saved(conv)
    short = SavedPack(good.data[:-64].clone(), good.md, good.shape, good.dtype)
    packs = PackedWeights({"k": short})
    weight = _weight(conv, [])
    assert not packs.load("k", weight, conv.w)
    assert weight.value is None
    assert "bytes for a descriptor of" in packs.unusable["k"]


def test_a_deferred_load_imports_nothing_until_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    conv = Conv("3x3", torch.float32)
    good = _saved(conv)
    short = SavedPack(good.data[:-64].clone(), good.md, good.shape, good.dtype)
    packs = PackedWeights({"good": good, "short": short}, deferred=True)
    imported: list[torch.Tensor] = []
    real = packed.import_packed

    def spy(data: torch.Tensor, *args: Any) -> torch.Tensor:
        imported.append(data)
        return real(data, *args)

    monkeypatch.setattr(packed, "import_packed", spy)
    calls: list[torch.Tensor] = []
    w_good, w_short = _weight(conv, calls), _weight(conv, calls)
    fixed = conv.w.clone()
    # NOTE: queued, nothing read (the entry's hash may still be being checked)
    assert packs.load("good", w_good, fixed, 7) and packs.load("short", w_short, fixed, 9)
    assert not packs.load("absent", _weight(conv, calls), fixed, 11)
    assert imported == [] and calls == [] and w_good.value is None and w_short.value is None
    redone = packs.import_deferred()
    assert [t.data_ptr() for t in imported] == [good.data.data_ptr(), short.data.data_ptr()]
    # NOTE: the good one adopted (no reorder); the short one reordered, and said so by node
    assert w_good.keep is good.data and calls == [fixed] and w_short.keep is None
    assert list(redone) == [9] and "bytes for a descriptor of" in redone[9]
    assert redone[9].startswith("at load; the entry's bytes were unusable: ")
    x = conv.x(4)
    for w in (w_good, w_short):
        assert torch.equal(conv.run(x, w(fixed)), conv.run(x, conv.packed))
    assert len(calls) == 1 and packs.queued == [] and not packs.deferred
    assert packs.import_deferred() == {}  # NOTE: the queue runs once


def test_a_gated_prepacker_runs_no_job_before_its_gate() -> None:
    order: list[str] = []
    opened = threading.Event()

    def gate() -> None:
        opened.wait(10)
        order.append("gate")

    prepack = onednn.Prepacker(threads=2, gate=gate)
    futures = [prepack(lambda i=i: order.append(f"job{i}")) for i in range(3)]
    assert order == []
    opened.set()
    for f in futures:
        f.result(10)
    prepack.close(finish=True)
    assert order.count("gate") == 3 and order.index("gate") == 0
    assert sorted(o for o in order if o != "gate") == ["job0", "job1", "job2"]

    def refuse() -> None:
        raise RuntimeError("the entry failed its check")

    ran: list[int] = []
    for threads in (1, 2):  # NOTE: inline (one thread) and pooled: the gate's failure is the job's
        prepack = onednn.Prepacker(threads=threads, gate=refuse)
        future = prepack(lambda: ran.append(1))
        with pytest.raises(RuntimeError, match="failed its check"):
            future.result(10)
        prepack.close(finish=True)
    assert ran == []


def test_export_takes_only_weights_prepared_from_their_constant() -> None:
    convs = {name: Conv(name, torch.float32, seed=i) for i, name in enumerate(CONVS)}
    packs = PackedWeights()
    made = {}
    for name, conv in convs.items():
        weight = _weight(conv, [])
        weight(conv.w)
        packs.made[name] = (weight, conv.w)
        made[name] = weight
    # NOTE: one prepared from another tensor than its constant, one never prepared, one dense
    stranger = Conv("3x3", torch.float32, seed=9)
    made["3x3"](stranger.w)
    packs.made["unprepared"] = (_weight(stranger, []), stranger.w)
    dense = PreparedWeight(lambda w: w * 1)
    dense(stranger.w)
    packs.made["dense"] = (dense, stranger.w)
    out = packs.export()
    assert set(out) == set(convs) - {"3x3"}
    expected = {k: export_packed(made[k].value)[0].clone() for k in out}
    del made, packs, dense
    gc.collect()
    for key, pack in out.items():
        # NOTE: each pack keeps its prepacked tensor (the owner of its bytes) alive
        assert torch.equal(pack.data, expected[key]), key
        assert pack.shape == tuple(convs[key].w.shape) and pack.dtype == torch.float32
        copy = pack.data.clone()  # NOTE: kept alive while the import reads it
        imported = import_packed(copy, pack.md, pack.shape, pack.dtype)
        assert torch.equal(imported.to_dense(), convs[key].w), key


def test_pack_keys_name_the_weight_and_its_geometry() -> None:
    from plait.ir import GraphBuilder, TensorType

    def key(stride: int, hw: int, groups: int = 1) -> str:
        gb = GraphBuilder()
        x = gb.input("x", TensorType((2, 4, hw, hw), torch.float32))
        w = gb.input("w", TensorType((8, 4 // groups, 3, 3), torch.float32))
        attrs = {"stride": [stride] * 2, "padding": [1, 1], "dilation": [1, 1], "groups": groups}
        gb.output(gb.call("conv2d", x, w, None, **attrs))
        node = gb.build().nodes[0]
        a = node.attrs
        return onednn._pack_key(
            node, list(a["padding"]), list(a["stride"]), list(a["dilation"]), a["groups"],
            [2, 4, hw, hw],
        )  # fmt: skip

    keys = [key(1, 8), key(2, 8), key(1, 9), key(1, 8, groups=2)]
    assert len(set(keys)) == len(keys), keys
    assert key(1, 8) == keys[0] and all(k.startswith("w:conv2d:") for k in keys)
