"""The ``plait`` command.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(main, ["--help"])
    >>> all(c in result.output for c in ("explain", "report", "bench", "verify", "fuzz"))
    True
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from plait.cache.cli import cache_group, load_manifest
from plait.diagnose.cli import register as register_diagnosis
from plait.manifest import printable


@click.group()
@click.version_option(package_name="plait")
def main() -> None:
    """plait: a tensor compiler for PyTorch programs that proves it did not change them."""


# NOTE: what reading a manifest's content as plait wrote it raises when it was not
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError)


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
    except _MALFORMED as exc:
        what = printable(f"{type(exc).__name__}: {exc}")
        raise click.ClickException(
            f"{printable(str(manifest))}: not a plait manifest: malformed content ({what})"
        ) from None
    click.echo(printable(text))


@main.command()
@click.argument("target")
@click.option(
    "-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="The HTML file to write (default: plait-report.html, or MANIFEST.html).",
)  # fmt: skip
@click.option("--backend", default=None, help="plait.compile's backend (default: its own).")
@click.option("--options", "options_json", default=None, help="plait.compile options (JSON).")
@click.option("--grad", is_flag=True, help="Call with gradients on (default: torch.no_grad()).")
@click.option("--gate", is_flag=True, help="Judge the program with the conformance gate too.")
def report(
    target: str, out: Path | None, backend: str | None, options_json: str | None, grad: bool,
    gate: bool,
) -> None:  # fmt: skip
    """Write the compile report of one compiled callable: one self-contained HTML file
    (specializations, guards, the graph after capture and after each pass with its diff, a
    picture of the final program, kernel sources, timings, memory plan, the gate's verdict).

    TARGET is a saved manifest (a .json file: the report shows what it recorded, with no graph,
    picture or kernel source) or MODULE:FUNCTION / FILE.py:FUNCTION naming a function that
    returns (model_or_fn, args[, kwargs]): compiled with plait.compile, called once, reported.
    Prints the path of the file written."""
    import json

    import torch

    from plait.compile_report import report as write_report

    if target.endswith(".json") and Path(target).is_file():
        manifest = load_manifest(Path(target))
        try:
            written = write_report(manifest, out or Path(Path(target).stem + ".html"))
        except _MALFORMED as exc:
            what = printable(f"{type(exc).__name__}: {exc}")
            raise click.ClickException(
                f"{printable(target)}: not a plait manifest: malformed content ({what})"
            ) from None
        click.echo(printable(str(written)))
        return
    from plait.api import compile as plait_compile
    from plait.diagnose.cli import load_target

    options = json.loads(options_json) if options_json else None
    if options is not None and not isinstance(options, dict):
        raise click.BadParameter("--options must be a JSON object")
    model, args, kwargs = load_target(target)
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    compiled = plait_compile(model, backend=backend, options=options)
    with torch.set_grad_enabled(grad):
        compiled(*args, **kwargs)
    verdicts = []
    if gate:
        if kwargs:
            raise click.ClickException("--gate judges positional arguments only; this target "
                                       "passes keywords")  # fmt: skip
        from plait.conformance import check

        module = model if isinstance(model, torch.nn.Module) else None
        verdicts.append(check(model, compiled, args, grads=grad, candidate_module=module))
    written = write_report(compiled, out or Path("plait-report.html"), verdicts=verdicts)
    click.echo(printable(str(written)))


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
register_diagnosis(main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
