"""The ``plait`` command.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(main, ["--help"])
    >>> "explain" in result.output and "bench" in result.output and "verify" in result.output
    True
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from plait.cache.cli import cache_group, load_manifest
from plait.manifest import printable


@click.group()
@click.version_option(package_name="plait")
def main() -> None:
    """plait: a tensor compiler for PyTorch programs that proves it did not change them."""


@main.command()
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest itself, re-indented.")
def explain(manifest: Path, as_json: bool) -> None:
    """Print a saved manifest as a readable report: passes, rewrites, fallbacks, guards.
    A file that is not a plait manifest (or not a regular file) is refused with one line and
    exit status 1; control characters in it are printed escaped."""
    m = load_manifest(manifest)
    try:
        text = m.dumps() if as_json else m.report()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        what = printable(f"{type(exc).__name__}: {exc}")
        raise click.ClickException(
            f"{printable(str(manifest))}: not a plait manifest: malformed content ({what})"
        ) from None
    click.echo(printable(text))


BENCH_MODULE = "benchmarks.resnet_classification"
ZOO_MODULE = "benchmarks.zoo"


def _checkout() -> Path | None:
    """The plait source checkout that holds ``benchmarks/`` (it is not installed): the current
    directory or one above it, else the checkout this package was installed from (editable)."""
    here = Path.cwd().resolve()
    candidates = [here, *here.parents, Path(__file__).resolve().parents[2]]
    for root in candidates:
        if (root / "benchmarks" / "resnet_classification.py").is_file():
            return root
    return None


def _bench_command(module_name: str = BENCH_MODULE) -> Any:
    root = _checkout()
    if root is None:
        raise click.ClickException(
            "plait bench runs benchmarks/resnet_classification.py from plait's source checkout, "
            "and none was found here or above: run it from the repository"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.ClickException(
            f"plait bench: cannot import {module_name} from {root}: {exc} "
            "(install the benchmark's dependencies: pip install -e '.[bench]')"
        ) from exc
    return module.main


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Run the ResNet classification benchmark (eager vs plait vs torch.compile).

    Options are the benchmark's own: see `plait bench --help`; `plait bench --quick --json
    out.json` is the under-a-minute configuration. Exit status 1 when parity fails.
    `plait bench zoo ...` runs the model-zoo benchmark instead (`plait bench zoo --help`).
    """
    if args and args[0] == "zoo":
        _bench_command(ZOO_MODULE).main(args=list(args[1:]), prog_name="plait bench zoo")
        return
    _bench_command().main(args=list(args), prog_name="plait bench")


# NOTE: exit statuses of `plait verify`: the verdict, or a refused artifact
VERIFY_CONFORMS, VERIFY_FAILS, VERIFY_REFUSED = 0, 1, 3


@main.command()
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--trust",
    multiple=True,
    metavar="DIGEST",
    help="Load the artifact's native kernels when its digest is this one (sha256:...).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def verify(artifact: Path, trust: tuple[str, ...], as_json: bool) -> None:
    """Run an export artifact on this machine on its stored reference inputs and judge it
    against its stored references under its stored contract (the conformance gate). Exit
    status 0 when it conforms, 1 when it does not, 3 when the artifact is refused (malformed,
    another format version, not the trusted digest) or cannot run here (a CUDA program on a
    machine without CUDA); nothing from a refused file runs."""
    import json

    from plait.errors import ArtifactError, PlaitCompileError
    from plait.export import verify as verify_artifact

    try:
        result = verify_artifact(artifact, trust=list(trust) or None)
    except (ArtifactError, PlaitCompileError, ValueError) as exc:
        click.echo(printable(f"{artifact}: refused: {exc}"), err=True)
        sys.exit(VERIFY_REFUSED)
    text = json.dumps(result.to_json(), indent=2, default=str) if as_json else str(result)
    click.echo(printable(text))
    sys.exit(VERIFY_CONFORMS if result.ok else VERIFY_FAILS)


main.add_command(cache_group)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
