"""The ResNet classification benchmark: eager PyTorch, plait (stax) and torch.compile (inductor)
side by side on a fixed image set with fixed weights; also ``plait bench``.

    python -m benchmarks.resnet_classification                 # the default run (make bench)
    python -m benchmarks.resnet_classification --quick --json out.json   # under a minute
    plait bench --help

It measures, per system: compile cost (wrapper call and first call, cold and warm caches, each in
a fresh process), steady-state latency (p50/p95) and throughput from interleaved repetitions,
logits parity judged by the conformance gate (with errors against eager and float64 shown),
codegen evidence (native / extern / fallback nodes), peak memory; then an ablation per plait
optimisation and a short training phase. Outputs: JSON (schema in
``benchmarks/schema/resnet_classification.schema.json``), Markdown, PNG. The exit status is 0
when every plait configuration passed the gate, 1 when one failed it, 3 when one failed to run,
4 when the JSON broke its own schema. See docs/benchmark.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from benchmarks.bench import report
from benchmarks.bench.config import ABLATIONS, DEVICES, MODELS, BenchConfig
from plait.progress import Progress

OUT_DEFAULT = Path("benchmarks/out")
STEM = "resnet_classification"


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(t) for t in text.split(",") if t.strip())


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(t.strip() for t in text.split(",") if t.strip())


def _ablations(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    if text.strip() == "all":
        return tuple(a.name for a in ABLATIONS)
    if text.strip() == "none":
        return ()
    return _names(text)


def _paths(
    out: Path | None, json_path: Path | None, md: Path | None, png: Path | None
) -> dict[str, Path | None]:
    if out is None and json_path is None and md is None and png is None:
        out = OUT_DEFAULT
    if out is None:
        return {"json": json_path, "markdown": md, "chart": png}
    return {
        "json": json_path or out / f"{STEM}.json",
        "markdown": md or out / f"{STEM}.md",
        "chart": png or out / f"{STEM}.png",
    }


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--quick", is_flag=True, help="Under a minute: 32x32, batch 2, eager+plait.")
@click.option("--model", type=click.Choice(MODELS), help="resnet18 (default) or resnet50.")
@click.option("--image-size", type=int, help="Image side in pixels (default 64; quick 32).")
@click.option("--batch-sizes", help="Comma-separated batch sizes (default 1,8; quick 2).")
@click.option("--device", type=click.Choice(DEVICES), help="cpu (default), cuda, or auto.")
@click.option("--systems", help="Comma-separated: eager,plait,inductor (default all three).")
@click.option("--repeats", type=int, help="Timed repetitions per system (default 20).")
@click.option("--warmup", type=int, help="Untimed warm-up calls per system (default 3).")
@click.option("--threads", type=int, help="torch.set_num_threads / OMP_NUM_THREADS (default 1).")
@click.option("--seed", type=int, help="Seed of the weights (default 0).")
@click.option("--data", type=click.Choice(["digits", "synthetic"]), help="Image set.")
@click.option("--parity-images", type=int, help="Images for the displayed errors (default 64).")
@click.option("--gate-draws", type=int, help="Fresh input draws the gate judges (default 3).")
@click.option("--gate-layouts", help="Layouts the gate checks plait in (contiguous,channels_last).")
@click.option("--ablations", "ablations", help="all (default), none, or a comma-separated list.")
@click.option("--ablation-workers/--no-ablation-workers", default=None,
              help="Measure each ablation's cold compile in a fresh process.")  # fmt: skip
@click.option("--compile-workers/--no-compile-workers", default=None,
              help="Measure cold/warm compile cost and memory in fresh processes.")  # fmt: skip
@click.option("--train-steps", type=int, help="SGD steps in the training phase (0: skip).")
@click.option("--train-batch", type=int, help="Training batch size (default 8).")
@click.option(
    "--train-systems",
    help="Comma-separated systems to train (default eager,plait,inductor; --quick: eager,plait).",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help=f"Directory for {STEM}.json/.md/.png (default {OUT_DEFAULT}).")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON here.")  # fmt: skip
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the Markdown report here.")  # fmt: skip
@click.option("--chart", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the PNG chart here.")  # fmt: skip
@click.option("--progress", "progress_mode", default="auto",
              type=click.Choice(["auto", "rich", "plain", "quiet"]),
              help="Progress display on stderr (default: bars on a terminal).")  # fmt: skip
@click.option("--perturb-plait", type=float, hidden=True,
              help="Test only: scale plait's logits by 1+x (the gate must fail).")  # fmt: skip
@click.pass_context
def main(ctx: click.Context, **kw: Any) -> None:
    """The ResNet classification benchmark: eager vs plait (stax) vs torch.compile (inductor).

    Exit status: 0 parity passed, 1 a plait configuration failed the conformance gate, 3 a plait
    configuration failed to run, 4 the JSON broke its schema.
    """
    from benchmarks.bench.run import run

    paths = _paths(kw.pop("out"), kw.pop("json_path"), kw.pop("markdown"), kw.pop("chart"))
    progress = Progress(kw.pop("progress_mode"))
    try:
        cfg = BenchConfig.preset(
            quick=kw.pop("quick"),
            model=kw.pop("model"),
            image_size=kw.pop("image_size"),
            batch_sizes=_ints(kw.pop("batch_sizes")),
            device=kw.pop("device"),
            systems=_names(kw.pop("systems")),
            gate_layouts=_names(kw.pop("gate_layouts")),
            ablations=_ablations(kw.pop("ablations")),
            train_systems=_names(kw.pop("train_systems")),
            **kw,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        result = run(cfg, progress)
    finally:
        progress.close()
    problem = report.validate(result)
    if paths["json"] is not None:
        report.write_json(result, paths["json"])
    text = report.markdown(result)
    if paths["markdown"] is not None:
        paths["markdown"].parent.mkdir(parents=True, exist_ok=True)
        paths["markdown"].write_text(text)
    if paths["chart"] is not None:
        missing = report.chart(result, paths["chart"])
        if missing:
            click.echo(missing, err=True)
    click.echo(text)
    for name, path in paths.items():
        if path is not None:
            click.echo(f"{name}: {path}", err=True)
    if problem:
        click.echo(f"the JSON does not match its schema: {problem}", err=True)
        ctx.exit(4)
    verdict = result["verdict"]
    for line in verdict["plait_failures"] + verdict["plait_errors"]:
        click.echo(f"FAILED: {line}", err=True)
    ctx.exit(int(verdict["exit_code"]))


if __name__ == "__main__":
    sys.exit(main())
