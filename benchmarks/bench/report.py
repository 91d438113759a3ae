"""The benchmark's outputs: the JSON document (validated against its schema), a Markdown
report, and a PNG chart of latency and throughput per system.

Example:
    >>> _mb(3 * 2**20), _x(1.234), _x(None)
    ('3.0', '1.23x', '–')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.bench.timing import ROOT

SPREAD_FOR_LOG = 30  # NOTE: bars spanning more than this factor (CPU beside GPU) get a log axis.
SCHEMA_PATH = ROOT / "benchmarks" / "schema" / "resnet_classification.schema.json"


def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data


def validate(result: dict[str, Any]) -> str | None:
    """Validate against the schema; the error text, or None. Without jsonschema: None."""
    try:
        import jsonschema
    except ImportError:
        return None
    try:
        jsonschema.validate(result, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"{where}: {exc.message}"
    return None


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=False, allow_nan=False) + "\n")


# --- Markdown ----------------------------------------------------------------------------------
def _mb(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**20:.1f}"


def _x(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}x"


def _s(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _e(v: float | None) -> str:
    return "–" if v is None else f"{v:.1e}"


def _gate(g: dict[str, Any] | None) -> str:
    if g is None:
        return "reference"
    if not g["ok"]:
        return f"**FAILED** ({g['errors']} errors)"
    margin = g.get("worst_margin")
    return "pass" + (f" ({margin:.0%} of budget)" if margin is not None else "")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _counts(c: dict[str, Any] | None) -> str:
    if not c:
        return "–"
    counts = c.get("counts") or {}
    if "native" in counts:
        return f"{counts['native']}/{counts['extern']}/{counts['fallback']}"
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "–"


def _headline(v: dict[str, Any]) -> str:
    parts = []
    if not v["parity_ok"]:
        parts.append("**Parity: FAILED**: " + "; ".join(v["plait_failures"]))
    if v["plait_errors"]:
        parts.append("**plait FAILED to run**: " + "; ".join(v["plait_errors"]))
    if not parts:
        return "**Parity: PASSED** (every plait configuration passed the conformance gate)"
    return "\n\n".join(parts)


def markdown(result: dict[str, Any]) -> str:
    cfg, env, v = result["config"], result["environment"], result["verdict"]
    lines = [
        f"# ResNet classification benchmark ({cfg['model']})",
        "",
        f"{env['date']} · {env['cpu_model']} ({env['cpu_count']} CPUs, {env['threads']} "
        f"thread(s)) · torch {env['torch']} · plait {env['plait']} · load average "
        f"{env['load_average_start'][0]:.1f} → {(env['load_average_end'] or [0])[0]:.1f}",
        "",
        f"Images: {result['dataset']['name']} ({result['dataset']['source']}), "
        f"{cfg['image_size']}x{cfg['image_size']}; weights: seeded, untrained "
        "(accuracy is meaningless, parity is not).",
        "",
        _headline(v),
    ]
    lines += ["", "## Inference", ""]
    rows = []
    for r in result["results"]:
        d = r["parity"]["display"]
        rows.append(
            [
                r["system"],
                str(r["batch_size"]),
                _s(r["latency"]["p50_ms"]),
                _s(r["latency"]["p95_ms"]),
                _s(r["throughput_images_per_s"], 1),
                _x(r["speedup_vs_eager_p50"]),
                _gate(r["parity"]["gate"]),
                _e(d["vs_eager"]["max_abs"]),
                _e(d["vs_float64"]["max_rel"]),
                f"{d['top1_agreement_vs_eager']:.0%}",
                _counts(r["codegen"]),
            ]
        )
    head = ["system", "batch", "p50 ms", "p95 ms", "images/s", "speedup", "gate",
            "max abs vs eager", "max rel vs f64", "top-1 = eager",
            "native/extern/fallback"]  # fmt: skip
    lines += _table(head, rows)
    lines += ["", "## Compile cost and memory (fresh processes)", ""]
    rows = []
    for s in result["systems"]:
        c = s["compile"] or {}
        cold, warm = c.get("cold") or {}, c.get("warm") or {}
        rows.append(
            [
                s["name"],
                str(c.get("batch_size", "–")),
                _s(cold.get("wrapper_s")),
                _s(cold.get("first_call_s")),
                _s(warm.get("wrapper_s")),
                _s(warm.get("first_call_s")),
                _mb(cold.get("compile_rss_growth_bytes")),
                _mb(warm.get("steady_peak_rss_growth_bytes")),
                _mb((warm.get("codegen") or {}).get("planned_peak_bytes")),
            ]
        )
    head = ["system", "batch", "wrapper cold s", "first call cold s", "wrapper warm s",
            "first call warm s", "compile RSS growth MB", "steady peak RSS growth MB",
            "planned peak MB"]  # fmt: skip
    lines += _table(head, rows)
    lines += _ablations(result.get("ablations"))
    lines += _training(result.get("training"))
    return "\n".join(lines) + "\n"


def _ablations(ab: dict[str, Any] | None) -> list[str]:
    if not ab:
        return []
    base = ab.get("baseline") or {}
    lines = [
        "",
        f"## Ablations (batch {ab.get('batch_size')}; × = without / with: above 1, the "
        "optimisation lowered that cost)",
        "",
        f"Full plait: p50 {_s((base.get('latency') or {}).get('p50_ms'))} ms, cold first call "
        f"{_s(base.get('compile_cold_first_call_s'))} s, planned peak "
        f"{_mb(base.get('planned_peak_bytes'))} MB.",
        "",
    ]
    rows = []
    for e in ab["variants"]:
        if not e["available"] or e["error"]:
            rows.append([e["name"], ", ".join(e["improves"]), e["reason"] or e["error"]]
                        + ["–"] * 6)  # fmt: skip
            continue
        eff, claims = e["effect"], e["claims"]
        held = ", ".join(f"{k}: {v}" for k, v in claims.items())
        rows.append(
            [
                e["name"],
                ", ".join(e["improves"]),
                "measured",
                _s(e["latency"]["p50_ms"]),
                _x(eff["latency"]),
                _x(eff["compile"]),
                _x(eff["memory_planned"]),
                _gate(e["parity"]["gate"]),
                held,
            ]
        )
    head = ["optimisation off", "claims to improve", "status", "p50 ms", "latency ×",
            "cold compile ×", "planned memory ×", "gate", "claim held"]  # fmt: skip
    return lines + _table(head, rows)


def _training(t: dict[str, Any] | None) -> list[str]:
    if not t:
        return []
    lines = ["", f"## Training ({t['steps']} steps of {t['optimizer']}, batch {t['batch_size']})"]
    lines.append("")
    rows = []
    for s in t["systems"]:
        rows.append(
            [
                s["system"],
                _s(s["first_step_s"]),
                _s(s["step_latency"]["p50_ms"]),
                _s(s["images_per_s"], 1),
                _e(s["loss_max_abs_diff_vs_eager"]),
                _e(s["params_vs_eager"]["max_abs"]),
                _state(s.get("state_after_steps")),
                s["executors"]["forward"],
                s["executors"]["backward"],
                _gate(s["gate"]),
            ]
        )
    head = ["system", "first step s", "step p50 ms", "images/s", "loss diff", "param diff",
            "state vs float64", "forward ran in", "backward ran in", "gate (grads)"]  # fmt: skip
    lines += _table(head, rows)
    for s in t["systems"]:
        if s["executors"].get("statement"):
            lines += ["", f"{s['system']}: {s['executors']['statement']}."]
    return lines


def _state(state: dict[str, Any] | None) -> str:
    """The model rule's verdict on the state after the steps: RMS error against eager's."""
    if not state:
        return "-"
    base = state["eager_rms_error_vs_float64"]
    ratio = state["rms_error_vs_float64"] / base if base > 0 else 1.0
    verdict = "pass" if state["within_contract"] else "**FAILED**"
    return f"{verdict} ({ratio:.2f}x eager's RMS error)"


# --- chart -------------------------------------------------------------------------------------
def chart(result: dict[str, Any], path: Path) -> str | None:
    """Latency (p50, p95 whisker) and throughput per system and batch size; the error text
    when matplotlib is missing, else None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no chart: {exc}"
    rows = result["results"]
    names = list(dict.fromkeys(r["system"] for r in rows))
    sizes = sorted({r["batch_size"] for r in rows})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        mine = {r["batch_size"]: r for r in rows if r["system"] == name}
        xs = [k + (i - (len(names) - 1) / 2) * width for k in range(len(sizes))]
        p50 = [mine[b]["latency"]["p50_ms"] if b in mine else 0 for b in sizes]
        p95 = [mine[b]["latency"]["p95_ms"] - mine[b]["latency"]["p50_ms"] if b in mine else 0
               for b in sizes]  # fmt: skip
        ips = [mine[b]["throughput_images_per_s"] if b in mine else 0 for b in sizes]
        ax1.bar(xs, p50, width, yerr=[[0] * len(p95), p95], capsize=3, label=name)
        ax2.bar(xs, ips, width, label=name)
    for ax in (ax1, ax2):
        heights = [b.get_height() for b in ax.patches if b.get_height() > 0]
        if heights and max(heights) / min(heights) > SPREAD_FOR_LOG:
            ax.set_yscale("log")
    cfg = result["config"]
    for ax, title in ((ax1, "latency p50 (ms), whisker to p95"), (ax2, "throughput (images/s)")):
        ax.set_xticks(range(len(sizes)), [f"batch {b}" for b in sizes])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    ax1.legend()
    fig.suptitle(
        f"{cfg['model']} {cfg['image_size']}x{cfg['image_size']}, {cfg['threads']} thread(s), "
        f"{result['environment']['date']}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
