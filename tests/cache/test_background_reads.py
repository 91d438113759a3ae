"""The key's weights digest, prefetched in the background and remembered per tensor
(plait.cache.weight_digests), and the entry hash checked while the entry is parsed
(Store.get_pending): the same answers as computing everything at once; a weight written after
the prefetch is hashed again; no native code reads an entry before its hash is checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from plait.cache import weight_digests
from plait.cache.store import CorruptEntryError
from plait.ir import weights_hash
from tests.cache.helpers import convnet, run, sample, stax_entry


def _weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "conv": torch.randn(16, 8, 3, 3, generator=gen),
        "bias": torch.randn(16, generator=gen),
        "half": torch.randn(6, 5, generator=gen).to(torch.bfloat16),
        "strided": torch.randn(5, 7, generator=gen).t(),  # NOTE: not contiguous: a copy is hashed
        "empty": torch.empty(0, 3),
        "param": torch.nn.Parameter(torch.randn(4, 4, generator=gen)),
    }


def test_prefetched_digests_equal_the_reference() -> None:
    w = _weights(0)
    weight_digests.prefetch(list(w.values()))
    assert weight_digests.weights_digest(w) == weights_hash(w)
    assert weight_digests.weights_digest(w) == weights_hash(w)  # NOTE: remembered now


def test_a_weight_written_after_the_prefetch_is_hashed_again() -> None:
    w = _weights(1)
    weight_digests.prefetch(list(w.values()))
    before = weights_hash(w)
    with torch.no_grad():
        w["conv"][0, 0, 0, 0] += 1.0
        w["param"].mul_(2.0)
    after = weight_digests.weights_digest(w)
    assert after == weights_hash(w)
    assert after != before


def test_the_same_values_in_a_new_tensor_give_the_same_digest() -> None:
    w = _weights(2)
    first = weight_digests.weights_digest(w)
    copies = {k: v.detach().clone() for k, v in w.items()}
    assert weight_digests.weights_digest(copies) == first


def test_names_count() -> None:
    w = _weights(3)
    renamed = {("x" + k): v for k, v in w.items()}
    assert weight_digests.weights_digest(renamed) != weight_digests.weights_digest(w)


def test_no_weights() -> None:
    assert weight_digests.weights_digest({}) == "none"


def test_a_pending_read_of_a_flipped_entry_fails_its_check(tmp_path: Path) -> None:
    model, x = convnet(), sample()
    run(model, x, tmp_path)
    store, key = stax_entry(tmp_path)
    path = store.path(key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    pending = store.get_pending(key)
    assert pending is not None
    for _ in range(2):  # NOTE: a failed check fails every time it is asked
        with pytest.raises(CorruptEntryError, match="does not match"):
            pending.verified()
    assert not path.exists()  # NOTE: removed: the next compile rebuilds it


def test_native_code_never_reads_an_unverified_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plait.cache import compiled as compiled_mod
    from plait.cache import store as store_mod
    from plait.codegen import packed

    # NOTE: the conv runs oneDNN with a prepacked weight the entry carries (not the native stem)
    options = {"stax": {"strict": True, "stem": False}}
    run(convnet(), sample(), tmp_path, options=options)
    pendings: list[Any] = []
    rebuilds: list[bool] = []
    imports: list[bool] = []
    get_pending, rebuild = store_mod.LocalStore.get_pending, compiled_mod._rebuild_stax
    import_packed = packed.import_packed

    def verified_so_far() -> bool:
        # NOTE: every entry read so far (the snapshot, the artifact) has passed its hash check
        return bool(pendings) and all(p.check is None for p in pendings)

    def get_pending_spy(self: Any, key: str) -> Any:
        pending = get_pending(self, key)
        pendings.append(pending)
        return pending

    def rebuild_spy(*args: Any) -> Any:
        rebuilds.append(verified_so_far())
        return rebuild(*args)

    def import_spy(*args: Any) -> Any:
        # NOTE: oneDNN deserializes the entry's descriptor here: never before the check
        imports.append(verified_so_far())
        return import_packed(*args)

    monkeypatch.setattr(store_mod.LocalStore, "get_pending", get_pending_spy)
    monkeypatch.setattr(compiled_mod, "_rebuild_stax", rebuild_spy)
    monkeypatch.setattr(packed, "import_packed", import_spy)
    model, x = convnet(), sample(seed=7)  # NOTE: a fresh input, not the one compiled with
    got, spec = run(model, x, tmp_path, options=options)
    assert spec.manifest.cache["status"] == "hit"
    # NOTE: the rebuild (Python: the plan, the runner) overlaps the artifact's hash check; what
    # reads the entry natively (the imports here, the reorders, the first call) waits for it
    assert len(rebuilds) == 1
    assert imports and all(imports), imports
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))


def test_the_snapshot_reads_its_artifact_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plait.cache import store as store_mod

    run(convnet(), sample(), tmp_path)
    _, key = stax_entry(tmp_path)
    ahead: list[str] = []
    taken: list[bool] = []
    read_ahead, get_pending = store_mod.LocalStore.read_ahead, store_mod.LocalStore.get_pending

    def read_ahead_spy(self: Any, k: str) -> None:
        ahead.append(k)
        read_ahead(self, k)

    def get_pending_spy(self: Any, k: str) -> Any:
        taken.append(k in self._ahead)
        return get_pending(self, k)

    monkeypatch.setattr(store_mod.LocalStore, "read_ahead", read_ahead_spy)
    monkeypatch.setattr(store_mod.LocalStore, "get_pending", get_pending_spy)
    model, x = convnet(), sample(seed=3)
    got, spec = run(model, x, tmp_path)
    assert spec.manifest.cache["status"] == "hit"
    assert spec.manifest.cache["capture"].startswith("snapshot")
    assert ahead == [key]
    assert taken[-1] is True  # NOTE: the artifact read took the read-ahead over
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_artifact_read_ahead_is_reported_and_rebuilt(tmp_path: Path, damage: str) -> None:
    from plait.cache.lookup import CacheWarning

    run(convnet(), sample(), tmp_path)
    store, key = stax_entry(tmp_path)
    path = store.path(key)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x01
    else:
        del data[len(data) // 2 :]
    path.write_bytes(bytes(data))
    model, x = convnet(), sample(seed=4)
    with pytest.warns(CacheWarning, match="does not match|truncated"):
        got, spec = run(model, x, tmp_path)
    assert spec.manifest.cache["status"] == "miss"
    assert spec.manifest.cache["capture"].startswith("snapshot")  # NOTE: the read-ahead path
    assert any("does not match" in e or "truncated" in e for e in spec.manifest.cache["events"])
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
    assert store.verify().ok
