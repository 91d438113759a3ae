"""``plait diagnose`` and ``plait fuzz``: the diagnosis tools on the command line.

Standalone click commands; the ``plait`` group adds them with :func:`register`.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(fuzz_command, ["-n", "2", "--seed", "3"])
    >>> result.exit_code, "2 graphs" in result.output
    (0, True)
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import click

from plait.progress import MODES, Progress


def load_target(target: str) -> tuple[Any, Any, dict[str, Any]]:
    """``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``: call the function, which returns
    ``(model_or_fn, args)`` or ``(model_or_fn, args, kwargs)``."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise click.BadParameter(
            f"{target!r}: expected a repro directory, MODULE:FUNCTION or FILE.py:FUNCTION"
        )
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise click.BadParameter(f"{where}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise click.BadParameter(f"{where}: cannot be loaded as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    made = getattr(module, name)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise click.ClickException(
            f"{target} returned {type(made).__name__}; expected (model_or_fn, args[, kwargs])"
        )
    return made[0], made[1], dict(made[2]) if len(made) == 3 else {}


@click.command("diagnose")
@click.argument("target")
@click.option("--options", "options_json", default=None, help="plait.compile options (JSON).")
@click.option(
    "--passes", default=None,
    help="The pass pipeline (sets options['passes']); 'inference' and 'training' in it stand for "
    "the default pipelines, e.g. 'inference,my-pass'.",
)  # fmt: skip
@click.option(
    "--repro-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where the repro goes (default: a fresh temporary directory).",
)  # fmt: skip
@click.option("--seed", default=0, show_default=True, help="The gate's seed.")
def diagnose_command(
    target: str, options_json: str | None, passes: str | None, repro_dir: Path | None, seed: int
) -> None:
    """Re-run a repro, or bisect a program to the first divergent pass and node.

    TARGET is a repro directory (exit status 1 while its divergence reproduces, 0 once it is
    gone) or MODULE:FUNCTION / FILE.py:FUNCTION naming a function that returns
    (model_or_fn, args[, kwargs]): it is compiled as plait.compile would with the options,
    judged by the conformance gate and, when it fails, bisected; a repro directory is written
    (exit status 1 when a divergence was found, 0 when the gate passes)."""
    from plait.diagnose import bisect, rerun

    path = Path(target)
    if path.is_dir():
        if not (path / "repro.json").is_file():
            raise click.ClickException(f"{target}: not a repro directory (no repro.json)")
        result = rerun(path)
        click.echo(str(result))
        sys.exit(1 if result.reproduced else 0)
    options: dict[str, Any] = json.loads(options_json) if options_json else {}
    if not isinstance(options, dict):
        raise click.BadParameter("--options must be a JSON object")
    if passes is not None:
        options["passes"] = passes
    model, args, kwargs = load_target(target)
    found = bisect(model, args, kwargs, options=options, repro_dir=repro_dir, seed=seed)
    click.echo(str(found))
    sys.exit(0 if found.ok else 1)


@click.command("fuzz")
@click.option("-n", "count", default=200, show_default=True, help="How many graphs.")
@click.option("--seed", default=0, show_default=True, help="The run's seed.")
@click.option(
    "--repro-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where repros of divergences go (graph-<i> each).",
)  # fmt: skip
@click.option("--seconds", type=float, default=None, help="Stop after this many seconds.")
@click.option(
    "--chunk", type=int, default=1000, show_default=True,
    help="Graphs per fresh process (a process keeps every kernel library it loads mapped).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.option(
    "--progress", "progress_mode", type=click.Choice(MODES), default="auto", show_default=True,
    help="Progress on stderr: a bar on a terminal (auto), plain lines, or none (quiet).",
)  # fmt: skip
def fuzz_command(
    count: int, seed: int, repro_dir: Path | None, seconds: float | None, chunk: int,
    as_json: bool, progress_mode: str,
) -> None:  # fmt: skip
    """Run random well-typed graphs through every pass and the Stax backend against the
    reference interpreter under the numerical contract; each divergence is bisected and saved
    as a repro. Exit status 1 when any graph diverged."""
    from plait.diagnose.fuzz import fuzz

    in_chunks = chunk if count > chunk else None
    with Progress(progress_mode) as progress, progress.task("fuzzing", total=count) as advance:
        done = [0]

        def step(index: int, so_far: Any) -> None:
            advance(index + 1 - done[0], note=f"{len(so_far.findings)} diverged")
            done[0] = index + 1

        report = fuzz(
            count, seed, repro_dir=repro_dir, seconds=seconds, chunk=in_chunks, progress=step
        )
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
    else:
        click.echo(str(report))
    sys.exit(0 if report.ok else 1)


def register(group: click.Group) -> None:
    """Add ``diagnose`` and ``fuzz`` to the ``plait`` command group."""
    group.add_command(diagnose_command)
    group.add_command(fuzz_command)
