"""The zoo benchmark's outputs: the JSON document and a Markdown report (coverage and parity,
cold compiles, steady-state latency per thread count, plait's fallback reasons, skips, errors).

A cell of a system that failed shows ``error`` (the text is listed under *Errors*), never a
number.

Example:
    >>> _gate({"ok": True, "worst_margin": 0.5, "errors": 0}), _gate(None)
    ('pass (50%)', '–')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KINDS_SHOWN = ("eager", "plait", "inductor", "onnxruntime", "openvino")


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")


def worst(gate: dict[str, Any]) -> str:
    first = next((f for f in gate["failures"] if f["severity"] == "error"), None)
    if first is None:
        return "gate failed"
    return f"{first['check']} {first['where']} @ {first['case']}: {first['message']}"[:300]


def _gate(g: dict[str, Any] | None) -> str:
    if g is None:
        return "–"
    if not g["ok"]:
        return f"**FAILED** ({g['errors']} errors)"
    margin = g.get("worst_margin")
    return "pass" + (f" ({margin:.0%})" if margin is not None else "")


def _s(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _kinds(result: dict[str, Any]) -> list[str]:
    return [k for k in KINDS_SHOWN if k in result["config"]["systems"]]


def _cell(s: dict[str, Any] | None, value: str) -> str:
    if s is None:
        return "–"
    return "error" if s["error"] else value


def _coverage(p: dict[str, Any] | None) -> tuple[str, str]:
    if not p:
        return "–", "–"
    share = p.get("compiled_share")
    counts = p.get("counts") or {}
    detail = "–" if share is None else f"{share:.0%}"
    if counts:
        detail += f" ({counts.get('native', 0)}/{counts.get('extern', 0)}/"
        detail += f"{counts.get('fallback', 0)})"
    return p["status"], detail


def markdown(result: dict[str, Any]) -> str:
    env, cfg, v = result["environment"], result["config"], result["verdict"]
    ran = [m for m in result["models"] if m["status"] == "ran"]
    kinds = _kinds(result)
    git = env["git"]
    commit = (git.get("commit") or "?")[:10] + (" (dirty)" if git.get("dirty") else "")
    lines = [
        "# Model zoo, CPU inference (float32)",
        "",
        f"{env['date']} · {env['cpu_model']} ({env['cpu_count']} CPUs) · threads "
        f"{', '.join(map(str, cfg['threads']))} · torch {env['torch']} · plait {env['plait']} "
        f"· commit {commit}"
        f" · load average {env['load_average_start'][0]:.1f} → "
        f"{(env['load_average_end'] or [0])[0]:.1f}",
        "",
        f"{'Quick (tiny configs)' if cfg['quick'] else 'Full sizes'}; random weights from configs; "
        f"{cfg['repeats']} interleaved repetitions after {cfg['warmup']} warm-up call(s); "
        f"the gate judges {cfg['gate_draws']} fresh draw(s) plus a stress draw.",
        "",
        "**plait parity: PASSED on every model judged**" if v["parity_ok"]
        else "**plait parity: FAILED**: " + "; ".join(v["plait_failures"]),
    ]  # fmt: skip
    lines += ["", "## Coverage and parity", ""]
    lines.append(
        "plait: `whole` (every node native or extern), `partial` (some nodes run by PyTorch), "
        "`fallback` (capture failed; the program ran eagerly). Compiled share: native + extern "
        "over nodes run (native/extern/fallback). Gate: the conformance gate's verdict and the "
        "share of its model-rule budget used."
    )
    lines.append("")
    rows = []
    for m in ran:
        status, share = _coverage(m["plait"])
        plait = m["systems"].get("plait")
        if plait and plait["error"]:
            status, share = "error", "–"
        row = [m["name"], m["input"], f"{(m['parameters'] or 0) / 1e6:.3g}", status, share]
        row += [_cell(m["systems"].get(k), _gate(m["systems"][k]["gate"]) if k in m["systems"]
                      else "–") for k in kinds if k != "eager"]  # fmt: skip
        rows.append(row)
    head = ["model", "input", "params M", "plait", "compiled share (n/e/f)"]
    lines += _table(head + [f"{k} gate" for k in kinds if k != "eager"], rows)
    lines += ["", "## Cold compile (s, first call; caches empty)", ""]
    lines.append(
        "plait and inductor: wrapper + first call. ONNX Runtime and OpenVINO: ONNX export + "
        "session + first call (the export is shared; shown apart)."
    )
    lines.append("")
    rows = []
    for m in ran:
        row = [m["name"]]
        export = next((s["compile"].get("export_s") for s in m["systems"].values()
                       if s["compile"].get("export_s") is not None), None)  # fmt: skip
        for k in kinds:
            if k == "eager":
                continue
            s = m["systems"].get(k)
            row.append(_cell(s, _s((s or {}).get("compile", {}).get("cold_s"))))
        row.append(_s(export))
        rows.append(row)
    lines += _table(["model"] + [k for k in kinds if k != "eager"] + ["ONNX export"], rows)
    for threads in cfg["threads"]:
        lines += _latency(ran, kinds, str(threads))
    lines += _notes(result)
    return "\n".join(lines) + "\n"


def _latency(ran: list[dict[str, Any]], kinds: list[str], threads: str) -> list[str]:
    lines = ["", f"## Steady state, {threads} thread(s): p50 ms (medians of interleaved "
             "repetitions)", ""]  # fmt: skip
    rows = []
    for m in ran:
        row = [m["name"]]
        for k in kinds:
            s = m["systems"].get(k)
            lat = ((s or {}).get("latency") or {}).get(threads)
            err = ((s or {}).get("latency_errors") or {}).get(threads)
            row.append("error" if (s and s["error"]) or err else _s((lat or {}).get("p50_ms")))
        plait = ((m["systems"].get("plait") or {}).get("latency") or {}).get(threads) or {}
        row += [_x(plait.get("speedup_vs_eager_p50")), _x(plait.get("speedup_vs_inductor_p50"))]
        rows.append(row)
    return lines + _table(["model", *kinds, "plait vs eager", "plait vs inductor"], rows)


def _notes(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    models = result["models"]
    fallbacks = [
        (m["name"], f) for m in models for f in ((m["plait"] or {}).get("fallbacks") or [])
    ]
    if fallbacks:
        lines += ["", "## plait fallbacks (from the manifest)", ""]
        lines += [f"- {name}: {_one_line(f)}" for name, f in fallbacks]
    skipped = [m for m in models if m["status"] != "ran"]
    if skipped:
        lines += ["", "## Skipped", ""]
        lines += [f"- {m['name']}: {_one_line(m['reason'])}" for m in skipped]
    errors = []
    for m in models:
        for k, s in m["systems"].items():
            if s["error"]:
                errors.append(f"- {m['name']} / {k}: {_one_line(s['error'])}")
            for t, e in (s.get("latency_errors") or {}).items():
                errors.append(f"- {m['name']} / {k} ({t} threads): {_one_line(e)}")
            gate = s.get("gate")
            if gate is not None and not gate["ok"]:
                errors.append(f"- {m['name']} / {k} gate: {_one_line(worst(gate))}")
    if errors:
        lines += ["", "## Errors and gate failures", "", *errors]
    return lines


def _one_line(text: str | None, limit: int = 400) -> str:
    return " ".join((text or "").split())[:limit].replace("|", "\\|")
