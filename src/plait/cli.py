"""The ``plait`` command.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(main, ["--help"])
    >>> "explain" in result.output and "bench" in result.output
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


main.add_command(cache_group)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
