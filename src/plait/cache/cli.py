"""``plait cache``: look after the artifact cache (stats, verify, clear, explain a miss).

``--dir`` names either a cache directory (what ``$PLAIT_CACHE_DIR`` names; artifacts live in its
``artifacts/`` folder, kernels beside them) or a store itself (what ``plait.compile(...,
options={"cache": DIR})`` names: ``index.json`` and ``objects/`` in it); a directory that holds
neither is refused rather than reported empty. The default is the one ``plait.compile`` uses.
``--url`` (``stats``, ``verify``) names the remote tier (default ``$PLAIT_CACHE_URL``).

Example:
    >>> import tempfile
    >>> from click.testing import CliRunner
    >>> out = CliRunner().invoke(cache_group, ["stats", "--dir", tempfile.mkdtemp()]).output
    >>> "0 entries" in out
    True
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from plait.cache import LocalStore, cache_root, remote
from plait.cache.key import explain_miss
from plait.cache.lookup import entry_parts
from plait.cache.remote import RedisStore, RemoteUnavailableError
from plait.manifest import Manifest, printable

_DIR = click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The cache directory (default: $PLAIT_CACHE_DIR, else the per-user cache directory).",
)


_URL = click.option(
    "--url",
    default=None,
    help="The remote tier (redis://host:port/db; default: $PLAIT_CACHE_URL, else none).",
)


def _is_store(path: Path) -> bool:
    """Whether ``path`` is a store's own directory (:class:`LocalStore` keeps these in it)."""
    return any((path / name).exists() for name in ("index.json", "index.lock", "objects"))


def _store(root: Path | None) -> LocalStore:
    """The store ``--dir`` names: the directory itself when it is one (``options={"cache":
    DIR}``), else its ``artifacts/`` folder (``$PLAIT_CACHE_DIR``). A directory with other
    contents and neither is refused: reporting it as an empty cache would hide the mistake."""
    if root is None:
        return LocalStore(cache_root() / "artifacts")
    if _is_store(root):
        return LocalStore(root)
    artifacts = root / "artifacts"
    if artifacts.is_dir() or not root.is_dir() or not any(root.iterdir()) or _kernel_files(root):
        return LocalStore(artifacts)
    raise click.ClickException(
        f"{printable(str(root))} holds no plait cache: neither a store (index.json, objects/, "
        'as options={"cache": DIR} makes) nor a cache directory (artifacts/, kernels, as '
        "$PLAIT_CACHE_DIR names); name one of those with --dir"
    )


def _remote(url: str | None) -> RedisStore | None:
    """The remote tier ``--url`` (else ``$PLAIT_CACHE_URL``) names; None when neither does."""
    url = url or remote.url_setting()
    if url is None:
        return None
    try:
        return RedisStore(url)
    except (ValueError, ImportError) as exc:
        raise click.ClickException(printable(str(exc))) from None


def _remote_stats(store: RedisStore) -> tuple[str, dict[str, object]]:
    """The remote tier's line and numbers; an unreachable server is a line, not a failure."""
    try:
        st = store.stats()
    except RemoteUnavailableError as exc:
        return f"{store.location}: unavailable ({exc})", {
            "location": store.location,
            "error": str(exc),
        }
    return str(st), dict(st.__dict__)


class _Group(click.Group):
    """A cache directory plait refuses (another user's, writable by others) or cannot use is
    one line and exit status 1, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except OSError as exc:
            raise click.ClickException(printable(str(exc))) from None


def _kernel_files(root: Path | None) -> list[Path]:
    """The kernel cache's files (``plait.codegen.build``: the named cache directory itself, else
    the kernel cache directory that build uses)."""
    if root is not None:
        kernels = root
    else:
        from plait.codegen.build import cache_dir

        kernels = cache_dir()
    if not kernels.is_dir():
        return []
    return [p for p in kernels.glob("??/*") if p.suffix in (".so", ".sha256")]


def load_manifest(path: Path, problem: str = "") -> Manifest:
    """The manifest at ``path``, or a :class:`click.ClickException` (exit status 1) with one
    line that names the file, ``problem`` (what the command could not do) and what is wrong
    with the file; everything it quotes is :func:`~plait.manifest.printable`."""
    where = printable(str(path)) + (f": {problem}" if problem else "")
    try:
        return Manifest.load(path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.ClickException(f"{where}: cannot read it: {printable(reason)}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise click.ClickException(f"{where}: {printable(str(exc))}") from None


@click.group("cache", cls=_Group)
def cache_group() -> None:
    """The content-addressed artifact cache: compiled specializations keyed by what decided
    them (semantic hash, guards, target, options, toolchain, ambient settings, frozen
    weights)."""


@cache_group.command()
@_DIR
@_URL
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def stats(root: Path | None, url: str | None, as_json: bool) -> None:
    """Entries, size and size limit of the cache (and the kernel files beside it), and of its
    remote tier when there is one (a server that does not answer is reported, exit status 0)."""
    store = _store(root)
    st = store.stat()
    kernels = _kernel_files(root)
    kernel_bytes = sum(p.stat().st_size for p in kernels)
    tier = _remote(url)
    line, numbers = _remote_stats(tier) if tier is not None else ("", {})
    if as_json:
        data = {**st.__dict__, "kernel_files": len(kernels), "kernel_bytes": kernel_bytes}
        if tier is not None:
            data["remote"] = numbers
        click.echo(json.dumps(data, indent=2))
        return
    if tier is None:
        click.echo(str(st))
    else:
        click.echo(f"local: {st}")
        click.echo(f"remote: {line}")
    click.echo(f"kernels: {len(kernels)} files, {kernel_bytes / 2**20:.1f} MiB")
    entries = store.list()
    kinds = [_kind(e.meta) for e in entries]
    click.echo(
        f"{kinds.count('artifact')} compiled artifacts, {kinds.count('program')} captured "
        f"programs, {kinds.count('record')} records (first-run hints, automatic dynamic dims)"
    )
    for e, kind in list(zip(entries, kinds))[:10]:
        source = str(e.meta.get("source") or "?")[:16]
        click.echo(f"  {e.key[:16]}…  {kind:8}  {e.size / 2**20:8.1f} MiB  source {source}…")


def _kind(meta: dict) -> str:
    """An entry's kind as ``stats`` lists it: a compiled artifact (its meta has no kind), a
    captured program (a warm start's snapshot) or a small record."""
    kind = meta.get("kind")
    return "artifact" if kind is None else "program" if kind == "snapshot" else "record"


@cache_group.command()
@_DIR
@_URL
def verify(root: Path | None, url: str | None) -> None:
    """Check every entry against its own hash; remove and report those that fail (in the
    remote tier too, when there is one). Exit status 1 when anything was wrong."""
    report = _store(root).verify()
    tier = _remote(url)
    click.echo(str(report) if tier is None else f"local: {report}")
    ok = report.ok
    if tier is not None:
        try:
            there = tier.verify()
        except RemoteUnavailableError as exc:
            raise click.ClickException(f"remote: {tier.location}: unavailable ({exc})") from None
        click.echo(f"remote: {there}")
        ok = ok and there.ok
    if not ok:
        sys.exit(1)


@cache_group.command()
@_DIR
@click.option("--kernels", is_flag=True, help="Also remove the compiled kernel libraries.")
def clear(root: Path | None, kernels: bool) -> None:
    """Remove every artifact (and with --kernels every kernel library)."""
    n = _store(root).clear()
    click.echo(f"removed {n} entries")
    if kernels:
        files = _kernel_files(root)
        for p in files:
            p.unlink(missing_ok=True)
        click.echo(f"removed {len(files)} kernel files")


@cache_group.command("explain-miss")
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_DIR
def explain_miss_command(manifest: Path, root: Path | None) -> None:
    """Why a compile's key (from its saved manifest) is not in the cache: the nearest entry and
    the key parts that differ from it."""
    key = load_manifest(manifest, "no cache key in this manifest").cache_key
    parts, digest = key.get("parts"), key.get("digest")
    if not isinstance(parts, dict) or not isinstance(digest, str):
        raise click.ClickException(f"{printable(str(manifest))}: no cache key in this manifest")
    store = _store(root)
    entries = store.list()
    if any(e.key == digest for e in entries):
        click.echo(f"hit: entry {digest[:16]}… is in the cache")
        return
    click.echo(f"miss: {digest[:16]}… is not in {store.root}")
    click.echo(str(explain_miss(parts, entry_parts(store, limit=None))))
