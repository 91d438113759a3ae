"""The ``plait`` command.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(main, ["--help"])
    >>> "explain" in result.output
    True
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from plait.manifest import Manifest


@click.group()
@click.version_option(package_name="plait")
def main() -> None:
    """plait: a tensor compiler for PyTorch programs that proves it did not change them."""


@main.command()
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest itself, re-indented.")
def explain(manifest: Path, as_json: bool) -> None:
    """Print a saved manifest as a readable report: passes, rewrites, fallbacks, guards."""
    try:
        m = Manifest.load(manifest)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise click.ClickException(f"{manifest}: not a plait manifest: {exc}") from exc
    click.echo(m.dumps() if as_json else m.report())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
