"""The cache's trust boundary (docs/cache.md, "Trust model"), tried as a hostile local user and a
failing file system would: every entry is checked against the key it is read under; cache
directories are private (0700, this user's, refused otherwise); staging files are never
predictable; a file-system failure costs the cache, never the call. Each test compares against
eager PyTorch on fresh inputs, under the numerical contract."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import plait
from plait.cache import LocalStore
from plait.cache.lookup import CacheWarning
from plait.codegen import build
from plait.codegen.build import KernelCacheWarning
from plait.ir import private_files
from plait.ir.private_files import UnsafeDirectoryError, private_dir

from .helpers import artifact_entries, convnet, sample, status

OTHER_UID = 54321


def _pointwise_a(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 3.0 + 1.0


def _pointwise_b(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) - 2.0


def _matmul_b(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, x.t()).sigmoid()  # NOTE: another schedule: another runner


def _draws(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(500 + seed)),)


def _image(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(700 + seed)),)


def _check(reference: Any, compiled: Any, make: Any, module: Any = None) -> None:
    """``compiled`` against eager ``reference`` on fresh draws, under the numerical contract."""
    with torch.no_grad():
        report = plait.conformance.check(
            reference, compiled, make, candidate_module=module, op_class="model", draws=2
        )
    assert report.ok, str(report)


@pytest.fixture(autouse=True)
def fresh_kernel_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the kernel cache as a new process would: no library loaded in memory, no
    directory replaced or problem warned yet, no directory checked."""
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "_DIRS", {})
    monkeypatch.setattr(build, "_WARNED", set())
    monkeypatch.setattr(private_files, "_CHECKED", set())
    yield


def _plant(source: Path, target: Path) -> None:
    """``source`` (and its sidecar) put in ``target``'s place, as new files: a library this
    process has mapped is never written in place (that would change the mapped code itself)."""
    for src, dst in (
        (source, target),
        (source.with_suffix(".sha256"), target.with_suffix(".sha256")),
    ):
        staged = dst.with_name(dst.name + ".planted")
        shutil.copyfile(src, staged)
        os.replace(staged, dst)


def _kernel_libs(root: Path) -> list[Path]:
    return sorted(root.glob("??/*.so"))


def _compile_in(monkeypatch: pytest.MonkeyPatch, root: Path, fn: Any) -> Any:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(root))
    compiled = plait.compile(fn, options={"cache": False})
    with torch.no_grad():
        compiled(*_draws(0))
    return compiled


# --- every entry is checked against the key it is read under -------------------------------------


def test_an_artifact_entry_of_another_program_under_this_key_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "artifacts"
    model_a, model_b = convnet(seed=0), convnet(seed=1)
    for model in (model_a, model_b):
        with torch.no_grad():
            plait.compile(model, options={"warm_start": "fingerprint", "cache": str(cache)})(
                sample()
            )
    store = LocalStore(cache)
    entries = artifact_entries(store)
    key_of = {e.meta.get("source"): e.key for e in entries}
    assert len(entries) == 2, "the two models (other weights) have two entries"
    key_a, key_b = (e.key for e in sorted(entries, key=lambda e: e.last_access))
    assert key_a != key_b and key_of
    # NOTE: the other program's entry, valid by its own hash, put where this one's key points
    shutil.copyfile(store.path(key_b), store.path(key_a))
    compiled = plait.compile(
        convnet(seed=0), options={"warm_start": "fingerprint", "cache": str(cache)}
    )
    with pytest.warns(CacheWarning, match="stored under another key"), torch.no_grad():
        compiled(sample())
    spec = compiled.specializations[-1]
    assert status(spec) == "miss"
    assert any("stored under another key" in e for e in spec.manifest.cache["events"])
    _check(convnet(seed=0), compiled, _image, convnet(seed=0))
    # NOTE: rebuilt under its own key: the next process hits without a warning
    again = plait.compile(
        convnet(seed=0), options={"warm_start": "fingerprint", "cache": str(cache)}
    )
    with torch.no_grad():
        again(sample())
    assert status(again.specializations[-1]) == "hit"


def test_a_snapshot_of_another_program_under_this_front_key_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "artifacts"
    with torch.no_grad():
        plait.compile(convnet(seed=0), options={"warm_start": "fingerprint", "cache": str(cache)})(
            sample()
        )
        plait.compile(_pointwise_b, options={"warm_start": "fingerprint", "cache": str(cache)})(
            *_draws(0)
        )
    store = LocalStore(cache)
    snapshots = sorted(
        (e for e in store.list() if e.meta.get("kind") == "snapshot"), key=lambda e: e.last_access
    )
    assert len(snapshots) == 2
    mine, other = snapshots[0].key, snapshots[1].key
    shutil.copyfile(store.path(other), store.path(mine))
    compiled = plait.compile(
        convnet(seed=0), options={"warm_start": "fingerprint", "cache": str(cache)}
    )
    with pytest.warns(CacheWarning, match="stored under another key"), torch.no_grad():
        compiled(sample())
    capture = compiled.specializations[-1].manifest.cache["capture"]
    assert capture.startswith("captured: ") and "stored under another key" in capture
    _check(convnet(seed=0), compiled, _image, convnet(seed=0))


def test_a_kernel_library_of_another_program_under_this_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _compile_in(monkeypatch, a, _pointwise_a)
    _compile_in(monkeypatch, b, _pointwise_b)
    (lib_a,), (lib_b,) = _kernel_libs(a), _kernel_libs(b)
    assert lib_a.name != lib_b.name
    _plant(lib_b, lib_a)
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(a))
    compiled = plait.compile(_pointwise_a, options={"cache": False})
    with pytest.warns(KernelCacheWarning, match="made for another key"), torch.no_grad():
        compiled(*_draws(1))
    _check(_pointwise_a, compiled, _draws)
    assert build.usable_entry(lib_a, lib_a.stem), "rebuilt and published under its own key"


def test_a_runner_blob_of_another_program_under_this_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _compile_in(monkeypatch, a, _pointwise_a)
    _compile_in(monkeypatch, b, _matmul_b)
    blobs = [sorted(p for p in (r / "runners").iterdir() if not p.suffix) for r in (a, b)]
    (blob_a,), (blob_b,) = blobs
    assert blob_a.name != blob_b.name
    _plant(blob_b, blob_a)
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(a))
    compiled = plait.compile(_pointwise_a, options={"cache": False})
    with pytest.warns(KernelCacheWarning, match="made for another key"), torch.no_grad():
        compiled(*_draws(1))
    _check(_pointwise_a, compiled, _draws)


_LIB_A = "int plait_trust_probe(void) { return 1; }"
_LIB_B = "int plait_trust_probe(void) { return 2; }"


def test_an_installed_library_of_another_source_under_this_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard evaluator and the chunk hasher are built this way (one per installation)."""
    monkeypatch.setenv("PLAIT_GUARDS_CACHE_DIR", str(tmp_path))
    symbols = ["plait_trust_probe"]
    assert build.installed_library("probe_a", _LIB_A, symbols, ()).plait_trust_probe() == 1
    assert build.installed_library("probe_b", _LIB_B, symbols, ()).plait_trust_probe() == 2
    (lib_a,), (lib_b,) = (
        sorted(tmp_path.glob("probe_a-*.so")),
        sorted(tmp_path.glob("probe_b-*.so")),
    )
    # NOTE: another file name: ctypes would hand back the library already loaded from lib_a
    _plant(lib_b, lib_a)
    with pytest.warns(KernelCacheWarning, match="made for another key"):
        lib = build.installed_library("probe_a", _LIB_A, symbols, ())
    assert lib.plait_trust_probe() == 1


# --- private directories ------------------------------------------------------------------------


def _deny_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $PLAIT_CACHE_DIR and a home where nothing can be created: the /tmp fallback is used,
    in ``tmp_path/tmp`` (what ``tempfile.gettempdir()`` answers here)."""
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.delenv("PLAIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(home))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.parametrize("hostile", ["another owner", "world-writable", "a symlink"])
def test_a_prepared_tmp_fallback_is_refused_and_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: str
) -> None:
    tmp = _deny_home(monkeypatch, tmp_path)
    planted = tmp / f"plait-kernels-{os.geteuid()}"
    if hostile == "a symlink":
        target = tmp_path / "theirs"
        target.mkdir(mode=0o700)
        planted.symlink_to(target)
    else:
        planted.mkdir(mode=0o700)
        if hostile == "another owner":
            os.chown(planted, OTHER_UID, OTHER_UID)
        else:
            os.chmod(planted, 0o777)
    before = sorted(p.name for p in planted.rglob("*"))
    compiled = plait.compile(_pointwise_a, options={"cache": False})
    refused = f"refuses the directory {planted}"
    with pytest.warns(KernelCacheWarning, match=refused) as caught, torch.no_grad():
        compiled(*_draws(0))
    assert len([w for w in caught if w.category is KernelCacheWarning]) == 1
    assert sorted(p.name for p in planted.rglob("*")) == before
    used = build.cache_dir()
    assert used != planted and (os.stat(used).st_mode & 0o777) == 0o700
    assert os.stat(used).st_uid == os.geteuid()
    _check(_pointwise_a, compiled, _draws)


def test_a_cache_dir_writable_by_others_is_refused_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(root))
    model = convnet()
    compiled = plait.compile(
        model, options={"warm_start": "fingerprint", "cache": str(root / "artifacts")}
    )
    with pytest.warns(Warning) as caught, torch.no_grad():
        compiled(sample())
    messages = [str(w.message) for w in caught]
    assert [m for m in messages if "refuses the directory" in m], messages
    assert status(compiled.specializations[-1]) == "not cached"
    assert not (root / "artifacts" / "objects").exists()
    assert not _kernel_libs(root)
    _check(model, compiled, _image, model)


def test_private_dir_refuses_what_others_control(tmp_path: Path) -> None:
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)  # NOTE: no sticky bit: others could move the cache away
    with pytest.raises(UnsafeDirectoryError, match="without the sticky bit"):
        private_dir(open_parent / "cache")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectoryError, match=f"owned by uid {OTHER_UID}"):
        private_dir(theirs)
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o770)
    with pytest.raises(UnsafeDirectoryError, match="writable by others"):
        private_dir(group)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    assert private_dir(sticky / "a" / "b").is_dir()


def test_everything_the_caches_create_is_private_under_umask_000(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(root))
    monkeypatch.setenv("PLAIT_GUARDS_CACHE_DIR", str(tmp_path / "installed"))
    old = os.umask(0)
    try:
        model = convnet()
        compiled = plait.compile(
            model, options={"warm_start": "fingerprint", "cache": str(root / "artifacts")}
        )
        with torch.no_grad():
            compiled(sample())
        build.installed_library("probe_a", _LIB_A, ["plait_trust_probe"], ())
    finally:
        os.umask(old)
    made = [p for d in (root, tmp_path / "installed") for p in [d, *d.rglob("*")]]
    assert _kernel_libs(root) and any(p.suffix == ".so" for p in made)
    for p in made:
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        assert mode & 0o077 == 0, f"{p} has mode {oct(mode)}"
        if p.is_dir() or p.suffix == ".so":
            assert mode == 0o700, f"{p} has mode {oct(mode)}"
        else:
            assert mode == 0o600, f"{p} has mode {oct(mode)}"
    _check(model, compiled, _image, model)


# --- staging files are never predictable --------------------------------------------------------


def test_a_planted_symlink_at_a_staging_name_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(root))
    private_dir(root)
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    for name in ("probe.json", "toolchain.json"):
        (root / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
    assert build.remembered("probe", ["identity"], lambda: {"answer": 42}) == {"answer": 42}
    assert victim.read_text() == "the user's file"
    assert build.remembered("probe", ["identity"], lambda: {"answer": 0}) == {"answer": 42}


# --- file-system failures cost the cache, never the call ----------------------------------------


def _failing(real: Any, under: Path, code: int) -> Any:
    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        if str(dst).startswith(str(under)):
            raise OSError(code, os.strerror(code), str(dst))
        return real(src, dst, *args, **kwargs)

    return replace


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_kernel_cache_that_cannot_be_written_warns_once_and_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(root))
    private_dir(root)
    monkeypatch.setattr(os, "replace", _failing(os.replace, root, code))
    model, other = convnet(), convnet(seed=3)
    compiled = plait.compile(model, options={"cache": False})
    with pytest.warns(KernelCacheWarning, match=os.strerror(code)) as caught, torch.no_grad():
        compiled(sample())
    assert len([w for w in caught if w.category is KernelCacheWarning]) == 1
    second = plait.compile(other, options={"cache": False})
    with torch.no_grad():  # NOTE: warned once per process, not per compile
        second(sample())
    assert not [p for p in root.rglob("*") if p.is_file() and p.name.startswith(".")]
    _check(model, compiled, _image, model)
    _check(other, second, _image, other)


def test_a_kernel_cache_dir_that_cannot_be_created_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "read-only"
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(blocked / "cache"))
    real_mkdir = os.mkdir

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(str(blocked)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    compiled = plait.compile(_pointwise_a, options={"cache": False})
    with pytest.warns(KernelCacheWarning, match="Read-only file system"), torch.no_grad():
        compiled(*_draws(0))
    assert build.cache_dir() != blocked / "cache"
    _check(_pointwise_a, compiled, _draws)


@pytest.mark.parametrize("damage", [b"\xff\xfe\x00 not text", b"", b"sha256 0 key 0\n"])
def test_a_damaged_sidecar_is_rebuilt_once_and_never_breaks_later_compiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: bytes
) -> None:
    root = tmp_path / "cache"
    _compile_in(monkeypatch, root, _pointwise_a)
    sidecars = sorted(root.rglob("*.sha256"))
    assert sidecars
    for sidecar in sidecars:
        sidecar.write_bytes(damage)
    monkeypatch.setattr(build, "_LOADED", {})
    compiled = plait.compile(_pointwise_a, options={"cache": False})
    with pytest.warns(KernelCacheWarning, match="does not match"), torch.no_grad():
        compiled(*_draws(1))
    _check(_pointwise_a, compiled, _draws)
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setenv("PLAIT_STAX_NO_COMPILE", "1")  # NOTE: repaired: a plain hit now
    again = plait.compile(_pointwise_a, options={"cache": False})
    with torch.no_grad():
        again(*_draws(2))
    _check(_pointwise_a, again, _draws)


def test_an_artifact_store_on_a_full_disk_warns_once_and_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "artifacts"
    monkeypatch.setattr(os, "replace", _failing(os.replace, cache, errno.ENOSPC))
    model = convnet()
    compiled = plait.compile(model, options={"warm_start": "fingerprint", "cache": str(cache)})
    with pytest.warns(CacheWarning, match="No space left") as caught, torch.no_grad():
        compiled(sample())
    assert len([w for w in caught if w.category is CacheWarning]) == 1
    assert not [p for p in cache.rglob("*") if p.is_file() and p.name.startswith(".")]
    _check(model, compiled, _image, model)
