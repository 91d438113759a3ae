"""Carried Triton kernels: the private cache a trusted load lays out is the one Triton's own
cache lookups find (kernel groups and launcher modules, by key), keys built during the build
are reported, Triton's cache setting is restored, and a Triton index in an artifact is checked
member by member (a file it does not declare, a changed byte, a group list are refused).
The GPU round trip, with no compiler run, is in ``tests/export/test_cuda.py``."""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import pytest
import torch
from triton import knobs
from triton.runtime.cache import _base32, get_cache_manager

import plait
from plait.codegen import triton_carry
from plait.errors import ArtifactFormatError
from tests.export import crafting
from tests.export.models import MLP, seeded

LAUNCHER = "__triton_launcher" + sysconfig.get_config_var("EXT_SUFFIX")


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _carried(seed: int) -> dict[str, bytes]:
    """Files as a CUDA export gathers them: one kernel group (metadata, binary), one launcher."""
    g = torch.Generator().manual_seed(seed)
    blob = bytes(torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8).tolist())
    kernel, launcher = _base32(_key(f"kernel{seed}")), _base32(_key(f"launcher{seed}"))
    meta = json.dumps({"name": f"k{seed}", "seed": seed}).encode()
    return {f"{kernel}/k{seed}.json": meta, f"{kernel}/k{seed}.cubin": blob,
            f"{launcher}/{LAUNCHER}": blob[::-1]}  # fmt: skip


def _laid_out(files: dict[str, bytes], folder: Path) -> None:
    carried = []
    for e in triton_carry.entries(files):
        carried.append((e, {n: files[f"{e['dir']}/{n}"] for n in e["files"]}))
    triton_carry.lay_out(carried, folder)


def test_a_laid_out_cache_is_what_triton_finds_by_key(tmp_path: Path) -> None:
    files = _carried(3)
    _laid_out(files, tmp_path)
    before = (knobs.cache.dir, os.environ.get("TRITON_CACHE_DIR"))
    with triton_carry.serving(tmp_path) as built:
        group = get_cache_manager(_key("kernel3")).get_group("k3.json")
        launcher = get_cache_manager(_key("launcher3")).get_file(LAUNCHER)
        missing = get_cache_manager(_key("kernel4")).get_group("k4.json")
    assert built == [] and missing is None
    assert group is not None and sorted(group) == ["k3.cubin", "k3.json"]
    for name, path in group.items():
        assert Path(path).parent.parent == tmp_path
        assert Path(path).read_bytes() == files[f"{Path(path).parent.name}/{name}"]
    assert launcher is not None and Path(launcher).parent.parent == tmp_path
    assert (knobs.cache.dir, os.environ.get("TRITON_CACHE_DIR")) == before


def test_keys_built_while_serving_are_reported(tmp_path: Path) -> None:
    _laid_out(_carried(5), tmp_path)
    with triton_carry.serving(tmp_path) as built:
        get_cache_manager(_key("compiled here")).put(b"\x01", "k.cubin")
    assert built == [_base32(_key("compiled here"))]


def test_only_metadata_binaries_and_launchers_are_gathered(tmp_path: Path) -> None:
    files = _carried(7)
    _laid_out(files, tmp_path)
    kernel_dir = next(p for p in tmp_path.iterdir() if (p / "k7.json").exists())
    (kernel_dir / "k7.ptx").write_text("// an IR text the load does not need")
    listing = json.loads(next(kernel_dir.glob("__grp__*")).read_text())
    listing["child_paths"]["k7.ptx"] = str(kernel_dir / "k7.ptx")
    next(kernel_dir.glob("__grp__*")).write_text(json.dumps(listing))
    assert triton_carry.cache_files(tmp_path) == files


def test_a_key_that_is_neither_kernel_nor_launcher_is_not_carried() -> None:
    with pytest.raises(ValueError, match="neither a kernel nor a launcher"):
        triton_carry.entries({"ABC/k.json": b"{}"})


# --- an artifact's Triton index -----------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    model = MLP(16, 32, 8).eval()
    root = tmp_path_factory.mktemp("triton-index")
    path = plait.export(model, (torch.randn(4, 16, generator=seeded(1)),), native=False).save(
        root / "mlp.plait"
    )
    return {"model": model, "root": root, "members": crafting.members_of(path)}


def _with_index(base: dict[str, bytes], files: dict[str, bytes], **change: Any) -> dict[str, bytes]:
    entries = []
    for e in triton_carry.entries(files):
        blobs = {n: files[f"{e['dir']}/{n}"] for n in e["files"]}
        e["files"] = [
            {"name": n, "sha256": hashlib.sha256(b).hexdigest()} for n, b in blobs.items()
        ]
        entries.append(e)
    target = {"triton": "3.6.0", "backend": "cuda", "arch": "90", "warp_size": 32}
    index = {"kind": "triton", "target": target, "entries": entries, **change}
    members = {**base, **{f"native/triton/{k}": v for k, v in files.items()}}
    members["native/index.json"] = json.dumps(index).encode()
    return crafting.reindexed(members)


def _load(exported: dict[str, Any], members: dict[str, bytes], name: str, **kw: Any) -> Any:
    return plait.load(crafting.write(exported["root"] / name, members), **kw)


def test_carried_kernels_are_not_used_without_trust(exported: dict[str, Any]) -> None:
    members = _with_index(exported["members"], _carried(11))
    loaded = _load(exported, members, "untrusted.plait")
    assert loaded.native["status"] == "rebuilt"
    assert crafting.digest(members) in str(plait.explain(loaded))
    x = torch.randn(4, 16, generator=seeded(12))
    with torch.no_grad():
        assert torch.equal(loaded(x), plait.compile(exported["model"])(x))


def test_trusted_kernels_for_a_target_not_here_are_rebuilt(exported: dict[str, Any]) -> None:
    members = _with_index(exported["members"], _carried(13))
    loaded = _load(exported, members, "trusted.plait", trust=crafting.digest(members))
    assert loaded.native["status"] == "rebuilt"
    assert "Triton kernels compiled here" in str(plait.explain(loaded))


@pytest.mark.parametrize(
    "spoil, error",
    [
        (lambda m, k: {**m, f"native/triton/{k}/extra.cubin": b"\x00"}, "not declared"),
        (lambda m, k: {**m, f"native/triton/{k}/k17.cubin": b"changed"}, "SHA-256"),
        (lambda m, k: {**m, f"native/{'ab' * 32}.so": b"\x7fELF"}, "not declared"),
    ],
)
def test_a_spoiled_triton_index_is_refused(
    exported: dict[str, Any], spoil: Any, error: str
) -> None:
    files = _carried(17)
    members = _with_index(exported["members"], files)
    kernel_dir = next(k.split("/")[0] for k in files if k.endswith(".cubin"))
    members = crafting.reindexed(spoil(members, kernel_dir))
    with pytest.raises(ArtifactFormatError, match=error):
        _load(exported, members, "spoiled.plait")


@pytest.mark.parametrize(
    "change, error",
    [
        ({"target": {"triton": "3.6.0"}}, "target"),
        ({"entries": []}, "entries"),
        ({"kind": "elf"}, "unknown kind"),
    ],
)
def test_a_malformed_triton_index_is_refused(
    exported: dict[str, Any], change: dict[str, Any], error: str
) -> None:
    members = _with_index(exported["members"], _carried(19), **change)
    with pytest.raises(ArtifactFormatError, match=error):
        _load(exported, members, "malformed.plait")


def test_a_group_list_is_not_carried(exported: dict[str, Any]) -> None:
    files = _carried(23)
    kernel_dir = next(k.split("/")[0] for k in files if k.endswith(".cubin"))
    files[f"{kernel_dir}/__grp__k23.json"] = b'{"child_paths": {"k23.cubin": "/etc/passwd"}}'
    with pytest.raises(ValueError):
        _with_index(exported["members"], files)
    members = _with_index(exported["members"], _carried(23))
    index = json.loads(members["native/index.json"])
    entry = next(e for e in index["entries"] if e["dir"] == kernel_dir)
    entry["files"].append({"name": "__grp__k23.json", "sha256": hashlib.sha256(b"{}").hexdigest()})
    members["native/index.json"] = json.dumps(index).encode()
    members[f"native/triton/{kernel_dir}/__grp__k23.json"] = b"{}"
    with pytest.raises(ArtifactFormatError, match="malformed"):
        _load(exported, crafting.reindexed(members), "group-list.plait")


def _entries(members: dict[str, bytes]) -> list[dict[str, Any]]:
    return list(json.loads(members["native/index.json"])["entries"])


def _reindexed_with(members: dict[str, bytes], entries: list[dict[str, Any]]) -> dict[str, bytes]:
    index = json.loads(members["native/index.json"])
    index["entries"] = entries
    return crafting.reindexed({**members, "native/index.json": json.dumps(index).encode()})


def test_an_entry_without_its_group_field_is_refused(exported: dict[str, Any]) -> None:
    members = _with_index(exported["members"], _carried(29))
    entries = _entries(members)
    del next(e for e in entries if e["group"] is None)["group"]
    with pytest.raises(ArtifactFormatError, match="malformed"):
        _load(exported, _reindexed_with(members, entries), "no-group-field.plait")


def test_two_entries_of_one_key_are_refused(exported: dict[str, Any]) -> None:
    files = _carried(31)
    launcher = next(k for k in files if k.endswith(".so"))
    key = launcher.split("/")[0]
    files[f"{key}/other{LAUNCHER}"] = b"\x00"
    members = _with_index(exported["members"], files)
    entries = _entries(members)
    entry = next(e for e in entries if e["dir"] == key)
    first, second = dict(entry), dict(entry)
    first["files"], second["files"] = entry["files"][:1], entry["files"][1:]
    entries = [e for e in entries if e["dir"] != key] + [first, second]
    with pytest.raises(ArtifactFormatError, match="two entries"):
        _load(exported, _reindexed_with(members, entries), "two-entries.plait")


def test_a_group_list_in_other_case_is_refused(exported: dict[str, Any]) -> None:
    members = _with_index(exported["members"], _carried(37))
    entries = _entries(members)
    kernel = next(e for e in entries if e["group"] is not None)
    blob = b'{"child_paths": {}}'
    kernel["files"].append({"name": "__GRP__k37.json", "sha256": hashlib.sha256(blob).hexdigest()})
    members[f"native/triton/{kernel['dir']}/__GRP__k37.json"] = blob
    with pytest.raises(ArtifactFormatError, match="malformed"):
        _load(exported, _reindexed_with(members, entries), "group-case.plait")
