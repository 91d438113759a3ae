"""A corpus of malformed and malicious artifacts: each is refused with a clear error naming what
is wrong, nothing in it runs (a pickle's payload would leave a file behind), and the load writes
nothing anywhere (the kernel cache and the temporary directory stay empty)."""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

import plait
from plait.errors import ArtifactFormatError, ArtifactTrustError, ArtifactVersionError
from plait.export import Limits
from tests.export import crafting
from tests.export.models import MLP, seeded

SENTINEL = Path(tempfile.gettempdir()) / f"plait-export-sentinel-{os.getpid()}"


class _Payload:
    """Unpickling it creates the sentinel file: the proof that a pickle ran."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(SENTINEL), "w"))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    torch.manual_seed(0)
    model = MLP(16, 32, 8).eval()
    artifact = plait.export(model, (torch.randn(4, 16, generator=seeded(11)),))
    assert artifact.native
    path = artifact.save(tmp_path_factory.mktemp("base") / "base.plait")
    return crafting.members_of(path)


@pytest.fixture
def quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory for the artifact, with the kernel cache and the temporary directory pointed
    at empty directories: after the load, nothing may be in them."""
    cache, tmp, home = tmp_path / "cache", tmp_path / "tmp", tmp_path / "artifact"
    for d in (cache, tmp, home):
        d.mkdir()
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(cache))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    SENTINEL.unlink(missing_ok=True)
    yield home
    assert not SENTINEL.exists(), "a payload in the artifact ran"
    written = [p for d in (cache, tmp) for p in d.rglob("*") if p.is_file()]
    assert written == [], f"the load wrote {written}"


def _program_with(members: dict[str, bytes], statement: str) -> dict[str, bytes]:
    text = members["program.ir"].decode()
    head, _, tail = text.rpartition("  return ")
    return crafting.reindexed(
        {**members, "program.ir": (head + statement + "\n  return " + tail).encode()}
    )


def _weights_header(
    members: dict[str, bytes], change: Callable[[dict[str, Any]], None]
) -> dict[str, bytes]:
    data = members["weights.safetensors"]
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    change(header)
    return crafting.reindexed(
        {**members, "weights.safetensors": crafting.safetensors_bytes(header, data[8 + n :])}
    )


def _first_weight(header: dict[str, Any]) -> dict[str, Any]:
    """The first weight that is a matrix of two different sizes (its transpose is another
    shape of the same bytes)."""
    return next(
        header[k]
        for k in sorted(header)
        if k != "__metadata__" and len(set(header[k]["shape"])) == 2
    )


def _tensors(
    members: dict[str, bytes], member: str, change: Callable[[dict[str, torch.Tensor]], None]
) -> dict[str, bytes]:
    tensors = dict(load_tensors(members[member]))
    change(tensors)
    return crafting.reindexed({**members, member: save_tensors(tensors)})


def _json_member(
    members: dict[str, bytes], member: str, change: Callable[[Any], Any]
) -> dict[str, bytes]:
    doc = json.loads(members[member])
    return crafting.reindexed({**members, member: json.dumps(change(doc)).encode()})


def _guards(doc: dict[str, Any]) -> dict[str, Any]:
    doc["carried"][1] = doc["carried"][1].replace("16", "17")
    return doc


def _first_unit_sha(doc: dict[str, Any]) -> dict[str, Any]:
    doc["units"][0]["sha256"] = "0" * 64
    return doc


def _reference_input(t: dict[str, torch.Tensor]) -> None:
    t["case0/input/0"] = torch.randn(5, 16)


def _missing_weight(t: dict[str, torch.Tensor]) -> None:
    del t[sorted(t)[0]]


def _extra_weight(t: dict[str, torch.Tensor]) -> None:
    t["extra"] = torch.ones(2)


HUGE = (
    "graph(\n  user %x: f32[1048576, 1048576]\n) {\n"
    "  %0 = relu(%x) : f32[1048576, 1048576]\n  return %0\n}\n"
)
PLANTED_KEY = "ab" * 32
HUGE_HEADER = (2**62).to_bytes(8, "little") + b"{}"


def _set(entry: dict[str, Any], key: str, value: Any) -> None:
    entry[key] = value


def _changed(text: bytes) -> bytes:
    return text.replace(b"relu", b"tanh")


# id -> (what to do with the base members: bytes of a whole file, or members to write), error, text
CORPUS: dict[str, tuple[Callable[[dict[str, bytes]], Any], type[Exception], str]] = {
    "pickled-weights": (
        lambda m: crafting.reindexed({**m, "weights.safetensors": pickle.dumps(_Payload())}),
        ArtifactFormatError, "weights.safetensors",
    ),
    "pickle-member": (
        lambda m: crafting.reindexed({**m, "data.pkl": pickle.dumps(_Payload())}),
        ArtifactFormatError, "data.pkl is not a member of format plait.export 1",
    ),
    "torch-save-file": (
        lambda m: _torch_saved(), ArtifactFormatError, "is not a member of format plait.export",
    ),
    "pickle-as-json": (
        lambda m: crafting.reindexed({**m, "calling.json": pickle.dumps(_Payload())}),
        ArtifactFormatError, "calling.json: not",
    ),
    "traversal-dotdot": (
        lambda m: [*m.items(), ("../evil.so", b"x")], ArtifactFormatError, "climbs out",
    ),
    "traversal-nested": (
        lambda m: [*m.items(), ("native/../../evil.so", b"x")], ArtifactFormatError, "climbs out",
    ),
    "traversal-absolute": (
        lambda m: [*m.items(), ("/etc/evil", b"x")], ArtifactFormatError, "is an absolute path",
    ),
    "traversal-drive": (
        lambda m: [*m.items(), ("C:/evil", b"x")], ArtifactFormatError, "is an absolute path",
    ),
    "backslash": (
        lambda m: [*m.items(), ("native\\..\\evil.so", b"x")], ArtifactFormatError, "backslash",
    ),
    "directory-member": (
        lambda m: [*m.items(), ("native/", b"")], ArtifactFormatError, "is a directory",
    ),
    "duplicate-member": (
        lambda m: [*m.items(), ("program.ir", b"graph() { return }")],
        ArtifactFormatError, "appears twice",
    ),
    "byte-length": (
        lambda m: _weights_header(m, lambda h: _set(_first_weight(h), "data_offsets", [0, 100])),
        ArtifactFormatError, "data_offsets",
    ),
    "shape-mismatch": (
        lambda m: _weights_header(m, lambda h: _first_weight(h)["shape"].reverse()),
        ArtifactFormatError, "the program declares",
    ),
    "dtype-mismatch": (
        lambda m: _weights_header(m, lambda h: _set(_first_weight(h), "dtype", "I32")),
        ArtifactFormatError, "the program declares",
    ),
    "huge-tensor-shape": (
        lambda m: _weights_header(m, lambda h: _set(_first_weight(h), "shape", [2**40, 2**40])),
        ArtifactFormatError, "bytes, its data_offsets",
    ),
    "huge-safetensors-header": (
        lambda m: crafting.reindexed({**m, "weights.safetensors": HUGE_HEADER}),
        ArtifactFormatError, "declares a header of",
    ),
    "huge-program-value": (
        lambda m: crafting.reindexed({**m, "program.ir": HUGE.encode()}),
        ArtifactFormatError, "past the load's limit",
    ),
    "missing-weight": (
        lambda m: _tensors(m, "weights.safetensors", _missing_weight),
        ArtifactFormatError, "missing tensors",
    ),
    "extra-weight": (
        lambda m: _tensors(m, "weights.safetensors", _extra_weight),
        ArtifactFormatError, "tensors nothing declares: ['extra']",
    ),
    "reference-shape": (
        lambda m: _tensors(m, "reference.safetensors", _reference_input),
        ArtifactFormatError, "is float32[5, 16], the program declares float32[4, 16]",
    ),
    "truncated-half": (
        lambda m: crafting_bytes(m)[: len(crafting_bytes(m)) // 2],
        ArtifactFormatError, "not a zip archive, or a truncated one",
    ),
    "truncated-tail": (
        lambda m: crafting_bytes(m)[:-10], ArtifactFormatError, "truncated",
    ),
    "damaged-deflated-member": (
        lambda m: _damaged_deflate(crafting_bytes(m), "program.ir"),
        ArtifactFormatError, "member program.ir does not read (Error -3",
    ),
    "tampered-member": (
        lambda m: {**m, "program.ir": m["program.ir"].replace(b"relu", b"tanh")},
        ArtifactFormatError, "program.ir does not match its SHA-256",
    ),
    "unlisted-member": (
        lambda m: {**m, "reference.json": m["reference.json"],
                   "artifact.json": _drop_listing(m, "reference.json")},
        ArtifactFormatError, "reference.json is not listed",
    ),
    "listed-missing": (
        lambda m: {k: v for k, v in crafting.reindexed(m).items() if k != "guards.json"},
        ArtifactFormatError, "lists members the archive lacks: ['guards.json']",
    ),
    "no-index": (
        lambda m: {k: v for k, v in m.items() if k != "artifact.json"},
        ArtifactFormatError, "no artifact.json",
    ),
    "newer-version": (
        lambda m: crafting.reindexed(m, version=2), ArtifactVersionError, "upgrade plait",
    ),
    "other-format": (
        lambda m: crafting.reindexed(m, format="torch.export"), ArtifactFormatError, "format",
    ),
    "opaque-call": (
        lambda m: _program_with(m, '  %evil = opaque(%x) {target="torch.save", '
                                   'out_types="f32[4, 16]"} : f32[4, 16]'),
        ArtifactFormatError, "the program names code",
    ),
    "file-reading-aten": (
        lambda m: _program_with(m, '  %evil = aten_factory() {name="from_file", '
                                   'overload="default", literals="[]"} : u8[16]'),
        ArtifactFormatError, "the program names code",
    ),
    "changed-program": (
        lambda m: crafting.reindexed({**m, "captured.ir": _changed(m["captured.ir"])}),
        ArtifactFormatError, "does not hash to the artifact's semantic hash",
    ),
    "stax-options": (
        lambda m: crafting.reindexed(m, stax_options={"kernels_per_unit": 0}),
        ArtifactFormatError, "stax_options kernels_per_unit=0",
    ),
    "stax-printer": (
        lambda m: crafting.reindexed(m, stax_options={"kernels": "fortran"}),
        ArtifactFormatError, "stax_options: kernels='fortran'",
    ),
    "stax-trials": (
        lambda m: crafting.reindexed(m, stax_options={"tvm_tune": -1}),
        ArtifactFormatError, "stax_options tvm_tune=-1",
    ),
    "json-nan": (
        lambda m: crafting.reindexed({**m, "calling.json": b'{"signature": NaN}'}),
        ArtifactFormatError, "calling.json: not JSON",
    ),
    "json-deep": (
        lambda m: crafting.reindexed({**m, "guards.json": b"[" * 200000}),
        ArtifactFormatError, "guards.json: JSON nested too deep",
    ),
    "not-utf8": (
        lambda m: crafting.reindexed({**m, "program.ir": b"\xff\xfe graph"}),
        ArtifactFormatError, "program.ir: not UTF-8",
    ),
    "guards-changed": (
        lambda m: _json_member(m, "guards.json", _guards),
        ArtifactFormatError, "the guards rebuilt",
    ),
    "undeclared-library": (
        lambda m: crafting.reindexed({**m, f"native/{PLANTED_KEY}.so": b"\x7fELF planted"}),
        ArtifactFormatError, "are not declared in native/index.json",
    ),
    "library-hash": (
        lambda m: _json_member(m, "native/index.json", _first_unit_sha),
        ArtifactFormatError, "does not match its SHA-256 in native/index.json",
    ),
}  # fmt: skip


def crafting_bytes(members: dict[str, bytes]) -> bytes:
    from plait.export.archive import pack_archive

    return pack_archive(members)


def _damaged_deflate(archive: bytes, name: str) -> bytes:
    """``archive`` with the deflated data of member ``name`` overwritten by bytes no inflater
    reads (a deflate block of the reserved type 3), its headers intact."""
    import struct
    import zipfile

    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        info = zf.getinfo(name)
    assert info.compress_type == zipfile.ZIP_DEFLATED
    start = info.header_offset
    name_len, extra_len = struct.unpack("<HH", archive[start + 26 : start + 30])
    data = start + 30 + name_len + extra_len
    return archive[:data] + b"\xff" * info.compress_size + archive[data + info.compress_size :]


def _drop_listing(members: dict[str, bytes], name: str) -> bytes:
    index = json.loads(crafting.reindexed(members)["artifact.json"])
    del index["members"][name]
    return json.dumps(index).encode()


def _torch_saved() -> bytes:
    import io

    buf = io.BytesIO()
    torch.save({"weights": torch.ones(2), "payload": _Payload()}, buf)
    return buf.getvalue()


def _write(home: Path, made: Any) -> Path:
    path = home / "bad.plait"
    if isinstance(made, bytes):
        path.write_bytes(made)
        return path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: zipfile warns of the duplicate it is asked for
        return crafting.write(path, made)


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_malformed_artifact_is_refused_and_nothing_runs(
    base: dict[str, bytes], quiet: Path, case: str
) -> None:
    make, error, text = CORPUS[case]
    path = _write(quiet, make(dict(base)))
    with pytest.raises(error) as info:
        plait.load(path)
    assert text in str(info.value)
    assert sorted(p.name for p in quiet.iterdir()) == ["bad.plait"]


def test_a_symlink_member_is_refused(base: dict[str, bytes], quiet: Path) -> None:
    members = {**base, "program.ir": b"/etc/passwd"}
    path = crafting.write(
        quiet / "bad.plait", crafting.reindexed(members), symlinks=("program.ir",)
    )
    with pytest.raises(ArtifactFormatError, match=r"program\.ir is a symbolic link"):
        plait.load(path)


def test_an_artifact_reached_through_a_symlink_is_refused(
    base: dict[str, bytes], quiet: Path
) -> None:
    real = crafting.write(quiet / "real.plait", base)
    link = quiet / "link.plait"
    link.symlink_to(real)
    with pytest.raises(ArtifactFormatError, match="cannot be read as a regular file"):
        plait.load(link)


def test_sizes_past_the_limits_are_refused_before_reading(
    base: dict[str, bytes], quiet: Path
) -> None:
    path = crafting.write(quiet / "big.plait", base)
    with pytest.raises(ArtifactFormatError, match="larger than the load's limit of 1000 bytes"):
        plait.load(path, limits=Limits(archive_bytes=1000))
    crafting.declare_size(path, "program.ir", 2**32 - 1)
    with pytest.raises(
        ArtifactFormatError, match="declares 4294967295 bytes, past the load's limit"
    ):
        plait.load(path)


def test_a_load_that_trusts_another_digest_is_refused(base: dict[str, bytes], quiet: Path) -> None:
    path = crafting.write(quiet / "a.plait", base)
    with pytest.raises(ArtifactTrustError, match="it was changed, or is another artifact"):
        plait.load(path, trust="sha256:" + "0" * 64)
    with pytest.raises(ValueError, match="trust= takes artifact digests"):
        plait.load(path, trust="abc")
