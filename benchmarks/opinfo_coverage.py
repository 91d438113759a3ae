"""OpInfo coverage: every float32 CPU OpInfo sample through ``plait.compile``, classified.

    python -m benchmarks.opinfo_coverage                   # full sweep, writes docs/coverage.md
    python -m benchmarks.opinfo_coverage --ops sort,abs    # some ops only
    python -m benchmarks.opinfo_coverage --report-only     # rewrite the table from the results

Each sample runs in a worker process (``--workers``, default 2) under a per-sample time limit
(``--timeout``): a worker that hangs or dies is replaced, the sample recorded as ``timeout`` or
``crash``, and the op resumed at its next sample. Results go to ``--out`` (JSON lines, one per
sample and grad mode) as they arrive; the table in ``docs/coverage.md`` is written from them. How
one sample is judged is in :mod:`benchmarks.opinfo_sweep`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
from collections import Counter, defaultdict
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from plait.progress import MODES, Progress

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "out" / "opinfo" / "results.jsonl"
DEFAULT_DOC = ROOT / "docs" / "coverage.md"


# ---------------------------------------------------------------------------------------------
# The worker: runs ops' samples, reports each as it starts and ends


def _worker(conn: Connection, grad_modes: tuple[str, ...]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from benchmarks import opinfo_sweep as sweep

    ops = {sweep.op_key(op): op for op in sweep.float32_ops()}
    conn.send(("ready", None))
    while True:
        job = conn.recv()
        if job is None:
            return
        key, start = job
        index = start
        conn.send(("start", index))
        for outcome in sweep.run_op(ops[key], start=start, grad_modes=grad_modes):
            conn.send(("result", outcome.to_json()))
            if outcome.index != index:
                index = outcome.index
            if outcome.grad_mode == grad_modes[-1]:
                conn.send(("start", outcome.index + 1))
        conn.send(("done", None))


class _Slot:
    """One worker process and the op it is running."""

    def __init__(self, ctx: Any, grad_modes: tuple[str, ...]) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, grad_modes), daemon=True)
        self.proc.start()
        child.close()
        self.key: str | None = None
        self.index = 0
        self.since = time.monotonic()
        self.ready = False

    def give(self, key: str, start: int) -> None:
        self.key, self.index, self.since = key, start, time.monotonic()
        self.conn.send((key, start))

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


def sweep(
    keys: list[str],
    out: Path,
    *,
    workers: int = 2,
    timeout: float = 120.0,
    grad_modes: tuple[str, ...] = ("no_grad",),
    progress: Progress | None = None,
) -> float:
    """Run every sample of the ops ``keys``; append one JSON line per outcome to ``out``, one
    unit of ``progress`` per op done. Returns the wall time in seconds."""
    progress = progress or Progress("quiet")
    ctx = mp.get_context("spawn")
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    queue: list[tuple[str, int]] = [(k, 0) for k in keys]
    slots = [_Slot(ctx, grad_modes) for _ in range(max(1, workers))]
    startup_limit = 300.0
    with out.open("a") as sink, progress.task("OpInfo sweep", total=len(keys)) as advance:

        def record(row: dict[str, Any]) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()

        def replace(slot: _Slot, category: str, why: str) -> _Slot:
            if slot.key is not None:
                for mode in grad_modes:
                    record({"op": slot.key, "index": slot.index, "grad_mode": mode,
                            "category": category, "desc": "", "detail": why, "draw": "",
                            "fallbacks": [], "seconds": time.monotonic() - slot.since})  # fmt: skip
                queue.insert(0, (slot.key, slot.index + 1))
            slot.stop()
            return _Slot(ctx, grad_modes)

        while queue or any(s.key is not None for s in slots):
            for slot in slots:
                if slot.ready and slot.key is None and queue:
                    slot.give(*queue.pop(0))
            conns = [s.conn for s in slots]
            ready = wait(conns, timeout=5.0)
            now = time.monotonic()
            for i, slot in enumerate(slots):
                if slot.conn in ready:
                    try:
                        kind, payload = slot.conn.recv()
                    except (EOFError, OSError):
                        slot.proc.join(timeout=10)
                        code = slot.proc.exitcode
                        how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
                        slots[i] = replace(slot, "crash", f"the worker process died ({how})")
                        continue
                    slot.since = now
                    if kind == "ready":
                        slot.ready = True
                    elif kind == "start":
                        slot.index = payload
                    elif kind == "result":
                        record(payload)
                    elif kind == "done":
                        advance(note=str(slot.key))
                        slot.key = None
                elif slot.key is not None and now - slot.since > timeout:
                    why = f"no result within {timeout:.0f} s"
                    slots[i] = replace(slot, "timeout", why)
                elif not slot.ready and now - slot.since > startup_limit:
                    raise RuntimeError("a sweep worker did not start within 300 s")
        for slot in slots:
            if slot.proc.is_alive():
                slot.conn.send(None)
            slot.proc.join(timeout=10)
            slot.stop()
    return time.monotonic() - began


# ---------------------------------------------------------------------------------------------
# The report


def read_results(path: Path) -> list[dict[str, Any]]:
    """The outcomes recorded in ``path``; a later line for the same sample replaces an earlier."""
    rows: dict[tuple[str, int, str], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            # NOTE: categories by their first names
            row["category"] = {"eager_error": "not_judged", "nondeterministic": "random"}.get(
                row["category"], row["category"]
            )
            rows[(row["op"], row["index"], row["grad_mode"])] = row
    return list(rows.values())


# NOTE: an op's verdict is its worst sample's, in this order.
_SEVERITY = ("mismatch", "crash", "timeout", "error", "signed_zero", "fallback", "pass")


def op_verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per op: ``pass`` when every judged sample passed with no fallback, else the worst
    category; ``random`` and ``not_judged`` when nothing else was judged."""
    by_op: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        by_op[row["op"]].add(row["category"])
    out = {}
    for key, cats in by_op.items():
        judged = [c for c in _SEVERITY if c in cats]
        if judged:
            out[key] = judged[0]
        else:
            out[key] = "random" if "random" in cats else "not_judged"
    return out


# NOTE: capture errors name the user's file and line and quote it: here that is the harness's
# own call of the op, the same for every sample, so it is dropped from the table.
_HARNESS_LINE = re.compile(
    r"/\S+/benchmarks/opinfo_sweep\.py:\d+: "
    r"|\s*\| (inp, args, kwargs = |return fn\().*?(?= \| |$)"
)


def _reason_of(row: dict[str, Any]) -> str:
    text = re.sub(r"\s+", " ", _HARNESS_LINE.sub(" ", row.get("detail") or "")).strip()
    return text.replace("|", "\\|").replace("\n", " ")


def _normalized(reason: str) -> str:
    """A reason with the sample's specifics dropped, to count reasons across ops."""
    reason = re.sub(r"/\S+\.py:\d+: ", "", reason)
    reason = re.sub(r"\[[^\]]*\]", "[…]", reason)
    reason = re.sub(r"\bf32\[[^\]]*\]|\d+", "N", reason)
    return reason[:160].rstrip(" \\|")


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/coverage.md from the outcomes."""
    from benchmarks.opinfo_sweep import CATEGORIES

    lines = [
        "# OpInfo coverage",
        "",
        "Every float32 CPU sample of PyTorch's OpInfo database (`op_db`) compiled with",
        "`plait.compile` (default backend: Stax on the CPU) and judged against eager PyTorch",
        "under the numerical contract (the elementwise rule of each op's class; NaN/Inf positions",
        "equal; shapes, dtypes and result types equal; nested results leaf by leaf). Each sample",
        "is called three times: on its own values (the capture), on a second draw of the same",
        "sample (fresh values, same shapes: a result kept from the capture shows up here), and on",
        "that draw with NaN, ±inf and -0.0 written into every float tensor (judged where eager",
        "accepts them).",
        "Harness: `benchmarks/opinfo_sweep.py`; run it with `make coverage`",
        "(`python -m benchmarks.opinfo_coverage`). CI runs a slice: `tests/test_opinfo_slice.py`.",
        "",
        "Categories: **pass**; **mismatch** (a silent mismatch: a result unlike eager's and no",
        "error); **signed_zero** (only the sign of a zero differs); **error** (a plait error with",
        "its message); **fallback** (right results, but the manifest records an opaque node or a",
        "whole-program eager fallback); **crash** (any other exception); **timeout**;",
        "**random** (eager's call draws from torch's RNG, or its result changes with the seed,",
        "or is uninitialized memory: structure, shapes and dtypes judged; whether the values",
        "equal eager's under the same seeds is noted. OpInfo seeds most random ops inside the op",
        "and restores the RNG after, which makes eager deterministic: those are judged like any",
        "op, and a mismatch there says that the program seeds the RNG);",
        "**not_judged** (eager rejects the sample, or it holds sparse tensors: not judged).",
        "",
        f"Run: {meta.get('when', '?')}, torch {meta.get('torch', '?')}, "
        f"grad modes {', '.join(meta.get('grad_modes', ['no_grad']))}, "
        f"{meta.get('workers', '?')} worker(s) on {meta.get('cpus', '?')} CPU(s), "
        f"wall time {meta.get('wall_s', 0) / 60:.1f} min in all.",
        "",
        *[
            f"- {run['ops']} op(s), grad modes {', '.join(run['grad_modes'])}: "
            f"{run['wall_s'] / 60:.1f} min"
            for run in meta.get("runs", [])
        ],
        "",
        "## Totals",
        "",
    ]
    samples = Counter(r["category"] for r in rows)
    verdicts = op_verdicts(rows)
    per_op = Counter(verdicts.values())
    judged_ops = sum(v for k, v in per_op.items() if k not in ("random", "not_judged"))
    lines += [
        "| category | samples (each grad mode counted) | ops (worst sample) |",
        "|---|---:|---:|",
    ]
    for cat in CATEGORIES:
        lines.append(f"| {cat} | {samples.get(cat, 0)} | {per_op.get(cat, 0)} |")
    lines.append(f"| **total** | {len(rows)} | {len(verdicts)} |")
    share = per_op.get("pass", 0) / judged_ops if judged_ops else 0.0
    lines += [
        "",
        f"**{per_op.get('pass', 0)} of {judged_ops} judged ops ({share:.1%}) pass every sample "
        "with no fallback** (ops whose samples are all random or rejected by eager are "
        "not judged).",
        "",
        *_extern_share(rows, verdicts),
    ]
    lines += _section_time(rows)
    lines += _section_mismatches(rows)
    lines += _section_reasons(rows, "error", "Clear errors")
    lines += _section_reasons(rows, "crash", "Crashes")
    lines += _section_reasons(rows, "timeout", "Timeouts")
    lines += _section_reasons(rows, "signed_zero", "Signed zeros")
    lines += _section_reasons(rows, "fallback", "Fallbacks")
    lines += _section_reasons(rows, "random", "Random ops (not counted as mismatches)")
    lines += _section_failures_per_op(rows, verdicts)
    return "\n".join(lines) + "\n"


def _extern_share(rows: list[dict[str, Any]], verdicts: dict[str, str]) -> list[str]:
    """Of the passing ops, how many run through plait's own IR ops alone (generated kernels,
    plus the built-in externs such as convolution and matmul) and how many run typed ATen
    extern nodes, that is PyTorch's kernels for some of their work (honesty: not plait's)."""
    externs: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        if verdicts.get(row["op"]) == "pass":
            externs[row["op"]].update(row.get("externs") or {})
    passing = [op for op, v in verdicts.items() if v == "pass"]
    with_aten = sorted(op for op in passing if externs[op])
    top = Counter(name for op in with_aten for name in externs[op])
    named = ", ".join(f"{name} ({n})" for name, n in top.most_common(12))
    return [
        f"Of the {len(passing)} passing ops, {len(passing) - len(with_aten)} run through "
        f"plait's own IR ops alone and {len(with_aten)} with typed ATen extern nodes "
        "(PyTorch's kernels called by Stax, not a fallback; docs/ir.md). Most used, by ops: "
        f"{named or 'none'}.",
        "",
    ]


def _section_time(rows: list[dict[str, Any]]) -> list[str]:
    per_op: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for r in rows:
        per_op[r["op"]] += float(r.get("seconds", 0.0))
        count[r["op"]] += 1
    total = sum(per_op.values())
    lines = [
        "## Where the time goes",
        "",
        f"{total / 60:.1f} min of worker time over {len(rows)} samples "
        f"({total / max(1, len(rows)) * 1e3:.0f} ms a sample: capture, passes, the C++ build "
        "through plait's kernel cache, three compiled and four eager calls). The ops that took "
        "longest:",
        "",
        "| op | samples | seconds |",
        "|---|---:|---:|",
    ]
    for key, seconds in sorted(per_op.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"| {key} | {count[key]} | {seconds:.0f} |")
    return [*lines, ""]


def _section_mismatches(rows: list[dict[str, Any]]) -> list[str]:
    bad = sorted(
        (r for r in rows if r["category"] == "mismatch"), key=lambda r: (r["op"], r["index"])
    )
    lines = ["## Silent mismatches", ""]
    if not bad:
        return [*lines, "None.", ""]
    total: Counter[str] = Counter(r["op"] for r in rows)
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in bad:
        by_op[r["op"]].append(r)
    lines += [
        "One row per op: how many of its samples (over all grad modes) mismatched, and the first.",
        "",
        "| op | mismatched | grad modes | first sample | call | what differed |",
        "|---|---:|---|---|---|---|",
    ]
    for key, hits in sorted(by_op.items()):
        first = hits[0]
        modes = ", ".join(sorted({r["grad_mode"] for r in hits}))
        desc = first["desc"].replace("|", "\\|")
        lines.append(
            f"| {key} | {len(hits)} of {total[key]} | {modes} | {first['index']}: {desc} | "
            f"{first['draw']} | {_reason_of(first)} |"
        )
    return [*lines, ""]


def _section_reasons(rows: list[dict[str, Any]], category: str, title: str) -> list[str]:
    hits = [r for r in rows if r["category"] == category]
    lines = [f"## {title}: top reasons", ""]
    if not hits:
        return [*lines, "None.", ""]
    ops_by_reason: dict[str, set[str]] = defaultdict(set)
    count: Counter[str] = Counter()
    for r in hits:
        reason = _normalized(_reason_of(r))
        count[reason] += 1
        ops_by_reason[reason].add(r["op"])
    lines += ["| samples | ops | reason (numbers as N) | some ops |", "|---:|---:|---|---|"]
    for reason, n in count.most_common(25):
        some = ", ".join(sorted(ops_by_reason[reason])[:6])
        lines.append(f"| {n} | {len(ops_by_reason[reason])} | {reason} | {some} |")
    if len(count) > 25:
        lines.append(f"| … | | {len(count) - 25} more reasons | |")
    return [*lines, ""]


def _section_failures_per_op(rows: list[dict[str, Any]], verdicts: dict[str, str]) -> list[str]:
    first: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["op"], r["index"])):
        if r["category"] == verdicts[r["op"]] and r["op"] not in first:
            first[r["op"]] = r
    lines = [
        "## Every op that does not pass",
        "",
        "Its verdict is its worst sample's; the reason is that sample's.",
        "",
        "| op | verdict | samples by category | reason |",
        "|---|---|---|---|",
    ]
    per_op: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        per_op[r["op"]][r["category"]] += 1
    for key in sorted(verdicts):
        verdict = verdicts[key]
        if verdict in ("pass", "random", "not_judged"):
            continue
        counts = ", ".join(f"{c} {n}" for c, n in sorted(per_op[key].items()))
        reason = _reason_of(first[key])[:240] if key in first else ""
        lines.append(f"| {key} | {verdict} | {counts} | {reason} |")
    return [*lines, ""]


# ---------------------------------------------------------------------------------------------
# The command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated op keys (default: every float32 CPU op)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per sample")
    parser.add_argument("--grad-modes", default="no_grad", help="no_grad, grad or no_grad,grad")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep --out; without --ops, skip the ops it has in these grad modes",
    )
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--progress", choices=MODES, default="auto",
                        help="progress on stderr (default: a bar on a terminal)")  # fmt: skip
    args = parser.parse_args(argv)
    grad_modes = tuple(m for m in args.grad_modes.split(",") if m)
    meta_path = args.out.with_suffix(".meta.json")
    if not args.report_only:
        from benchmarks import opinfo_sweep

        keys = [opinfo_sweep.op_key(op) for op in opinfo_sweep.float32_ops()]
        if args.ops:
            wanted = args.ops.split(",")
            unknown = sorted(set(wanted) - set(keys))
            if unknown:
                parser.error(f"unknown op(s): {', '.join(unknown)}")
            keys = [k for k in keys if k in wanted]
        if not args.resume and args.out.exists():
            args.out.unlink()
        elif args.resume and args.out.exists() and not args.ops:
            seen = {r["op"] for r in read_results(args.out) if r["grad_mode"] in grad_modes}
            keys = [k for k in keys if k not in seen]
        with Progress(args.progress) as progress:
            wall = sweep(keys, args.out, workers=args.workers, timeout=args.timeout,
                         grad_modes=grad_modes, progress=progress)  # fmt: skip
        import torch

        old = json.loads(meta_path.read_text()) if args.resume and meta_path.exists() else {}
        meta_path.write_text(json.dumps({
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__,
            "grad_modes": sorted(set(old.get("grad_modes", [])) | set(grad_modes)),
            "workers": args.workers, "cpus": os.cpu_count(),
            "wall_s": wall + float(old.get("wall_s", 0.0)),
            "runs": [*old.get("runs", []),
                     {"ops": len(keys), "grad_modes": list(grad_modes), "wall_s": wall}],
        }))  # fmt: skip
    rows = read_results(args.out)
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    args.doc.write_text(render(rows, meta))
    counts = Counter(r["category"] for r in rows)
    print(", ".join(f"{k} {v}" for k, v in counts.most_common()), f"-> {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
