"""The compile report as one self-contained HTML document: its CSS, its few lines of script and
its pictures are inline, and it names no URL, so it opens anywhere, offline.

Example:
    >>> from plait.manifest import Manifest
    >>> from plait.compile_report.views import from_manifest
    >>> page = render(from_manifest(Manifest(source_hash="ab" * 32), "m.json"))
    >>> page.startswith("<!DOCTYPE html>") and "specialization 0" in page
    True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from plait.compile_report.sections import (
    details,
    esc,
    passes_html,
    pre,
    program_html,
    table,
    timings_html,
    verdict_html,
)
from plait.compile_report.views import CallableView, SpecializationView
from plait.manifest import describe_regions

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 2em 4em; color: #1d1d1f; }
h1 { font-size: 1.5em; margin-top: 1em; } h2 { border-bottom: 2px solid #ccc; margin-top: 2em; }
h3 { margin-top: 1.6em; } h4 { margin: 1.2em 0 .4em; } h5 { margin: 1em 0 .3em; }
nav ul { columns: 2; } code, pre { font: 12px/1.35 ui-monospace, monospace; }
pre { background: #f6f8fa; padding: .6em; overflow: auto; max-height: 40em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } details { margin: .4em 0; } summary { cursor: pointer; }
.diff span { display: block; } .diff .add { background: #d7f5dd; }
.diff .del { background: #fbdada; } .diff .hunk { color: #6a737d; }
.note { color: #6a737d; } .fallback { color: #b00020; }
.verdict.pass { color: #137333; font-weight: bold; } .verdict.fail { color: #b00020;
  font-weight: bold; }
.svgbox { overflow: auto; max-height: 48em; border: 1px solid #ddd; background: #fff; }
svg.graph text { font: 11px ui-monospace, monospace; text-anchor: middle; }
svg.graph .edges polyline { fill: none; stroke: #8a8a8a; stroke-width: 1; }
svg.graph rect.node { stroke: #555; stroke-width: .8; }
svg.graph rect.kernel { fill: none; stroke: #1b7f3b; stroke-width: 1.5; stroke-dasharray: 5 3; }
svg.graph .kernel-label { fill: #1b7f3b; text-anchor: start; font-size: 10px; }
.legend span { margin-right: 1.2em; white-space: nowrap; }
.swatch { display: inline-block; width: 1em; height: 1em; border: 1px solid #555;
  vertical-align: middle; margin-right: .3em; }
.kernel-swatch { border: 1.5px dashed #1b7f3b; }
.ev-native { border-left: 4px solid #52b788; } .ev-extern { border-left: 4px solid #4a7fd4; }
.ev-fallback { border-left: 4px solid #d62828; } .ev-dead { border-left: 4px solid #aaa; }
.ev-interpreted { border-left: 4px solid #e0a800; }
pre.ir span { display: block; padding-left: 4px; } :target { background: #fff3b0; }
.bar { display: inline-block; height: .8em; background: #4a7fd4; }
"""

# NOTE: a link to something inside a closed <details> opens it (and its parents) first
SCRIPT = """
function plaitReveal() {
  var id = decodeURIComponent(location.hash.slice(1));
  var el = id && document.getElementById(id);
  for (var p = el; p; p = p.parentElement) { if (p.tagName === 'DETAILS') p.open = true; }
  if (el) el.scrollIntoView({block: 'center'});
}
window.addEventListener('hashchange', plaitReveal);
window.addEventListener('load', plaitReveal);
"""


def render(view: CallableView, verdicts: Sequence[Any] = ()) -> str:
    """The report of ``view`` with the gate's ``verdicts`` (``plait.conformance.Report``s): a
    verdict that judged some specialization (its ``judged`` keys) goes with each one it
    judged; one that names none goes at the top."""
    from plait import __version__

    general = [v for v in verdicts if not getattr(v, "judged", None)]
    body = [
        f"<h1>plait compile report: {esc(view.name)}</h1>",
        f"<p>From {esc(view.source)}; plait {esc(__version__)}. "
        f"{len(view.specializations)} specialization(s).</p>",
        _contents(view),
        _overview(view),
    ]
    if general:
        body.append("<h2 id=verdicts>the conformance gate's verdicts</h2>")
        body += [verdict_html(v) for v in general]
    for spec in view.specializations:
        judged = [v for v in verdicts if spec.key and spec.key in _judged_keys(v)]
        body.append(_specialization(spec, judged))
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>plait report: {esc(view.name)}</title>",
            f"<style>{CSS}</style>",
            "</head><body>",
            *body,
            f"<script>{SCRIPT}</script>",
            "</body></html>",
            "",
        ]
    )


def _judged_keys(verdict: Any) -> set[str]:
    return {str(j.key) for j in getattr(verdict, "judged", [])}


def _contents(view: CallableView) -> str:
    items = []
    for s in view.specializations:
        parts = [f'<a href="#{s.anchor}">{esc(s.title)}</a>']
        if s.passes:
            parts.append(f'<a href="#{s.anchor}-passes">passes</a>')
        for i, p in enumerate(s.programs):
            parts.append(f'<a href="#{s.anchor}-p{i}">{esc(p.title)}</a>')
        items.append("<li>" + " · ".join(parts) + "</li>")
    return "<nav><ul>" + "".join(items) + "</ul></nav>"


def _overview(view: CallableView) -> str:
    out = []
    rows = []
    for s in view.specializations:
        m = s.manifest
        counts = m.executor.get("evidence", {}).get("counts", {})
        runs = ", ".join(f"{esc(k)} {v}" for k, v in sorted(counts.items()) if v) or "-"
        rows.append(
            [
                f'<a href="#{s.anchor}">{esc(s.title)}</a>',
                esc(_why(s)),
                esc(m.options.get("backend", "?")),
                esc(m.cache.get("status", "-")),
                str(len(m.fallbacks)),
                runs,
            ]
        )
    head = ["specialization", "why compiled", "backend", "cache", "fallbacks", "nodes run as"]
    out.append(table(head, rows, "overview"))
    explanation = view.explanation
    if explanation is not None and explanation.limit_fallback is not None:
        lf = explanation.limit_fallback
        out.append(
            f'<p class="fallback">Past the recompile limit, {esc(lf["calls"])} call(s) ran '
            f"eagerly: {esc(lf['reason'])}</p>"
        )
    if explanation is not None and explanation.regions is not None:
        out.append("<h2 id=regions>regions</h2>")
        out.append(pre("\n".join(describe_regions(explanation.regions))))
    return "\n".join(out)


def _why(s: SpecializationView) -> str:
    if s.guard_evaluator.startswith("unknown"):
        return "recorded in a saved manifest"
    return "the first call" if s.reason is None else f"recompiled: {s.reason}"


def _specialization(s: SpecializationView, verdicts: list[Any]) -> str:
    m = s.manifest
    out = [f'<section class="specialization" id="{s.anchor}">', f"<h2>{esc(s.title)}</h2>"]
    out.append(f"<p><b>Why it was compiled:</b> {esc(_why(s))}</p>")
    if s.shared_with is not None:
        out.append(
            f"<p>It shares its compiled artifact with {esc(s.shared_with)} (an identical "
            "block): its passes, programs and kernels are shown there.</p>"
        )
    nodes = m.graph
    after = nodes.get("nodes_optimized", "-")
    facts = [
        ["program (semantic hash)", f"<code>{esc(m.source_hash or '-')}</code>"],
        ["specialization key", f"<code>{esc(s.key or '-')}</code>"],
        ["backend", esc(m.options.get("backend", "?"))],
        ["backend chosen because", esc(m.options.get("backend_choice", "requested"))],
        ["calls it ran", esc("-" if s.calls is None else s.calls)],
        ["nodes captured → optimized", esc(f"{nodes.get('nodes_captured', '-')} → {after}")],
        ["cache", esc(_cache_line(m.cache))],
    ]
    out.append(table(["", ""], facts, "facts"))
    out.append(_fallbacks(m.fallbacks))
    checked = f"checked by the {s.guard_evaluator} evaluator"
    guards = "".join(f"<li><code>{esc(g)}</code></li>" for g in s.guards)
    out.append(details(f"{len(s.guards)} guards ({esc(checked)})", f"<ol>{guards}</ol>"))
    if s.settings:
        rows = [[f"<code>{esc(k)}</code>", esc(v)] for k, v in s.settings.items()]
        out.append(details("settings of the calls it runs", table(["setting", "value"], rows)))
    if m.cache.get("events"):
        out.append(details("cache events", pre("\n".join(map(str, m.cache["events"])))))
    if m.autograd:
        out.append(details("training: the forward/backward partition", pre(_dump(m.autograd))))
    setup = {"options": m.options, "toolchain": m.toolchain}
    out.append(details("options and toolchain", pre(_dump(setup))))
    out.append(f"<h3 id={s.anchor}-timings>timings</h3>")
    out.append(timings_html(m.timings))
    if verdicts:
        out.append(f"<h3 id={s.anchor}-verdicts>the conformance gate's verdicts</h3>")
        out += [verdict_html(v) for v in verdicts]
    if s.shared_with is None:
        out.append(f"<h3 id={s.anchor}-captured>the captured graph</h3>")
        if s.captured is not None:
            out.append(details("captured graph (IR)", pre(s.captured, "ir")))
        else:
            out.append("<p class=note>no captured graph here</p>")
        out.append(f"<h3 id={s.anchor}-passes>passes</h3>")
        out.append(passes_html(s.anchor, s.passes, m.options.get("passes")))
        out += [program_html(s, i, p) for i, p in enumerate(s.programs)]
    out.append("</section>")
    return "\n".join(out)


def _fallbacks(fallbacks: list[dict[str, Any]]) -> str:
    if not fallbacks:
        return "<p>No fallback: everything this specialization runs was compiled.</p>"
    items = "".join(
        f"<li><b>{esc(f.get('what', '?'))}</b>: {esc(f.get('reason', '?'))}</li>" for f in fallbacks
    )
    return f'<div class="fallback"><b>{len(fallbacks)} fallback(s):</b><ul>{items}</ul></div>'


def _cache_line(cache: dict[str, Any]) -> str:
    if not cache:
        return "not used"
    line = str(cache.get("status", "?"))
    if cache.get("tier"):
        line += f" ({cache['tier']} tier)"
    if cache.get("miss"):
        line += f": {cache['miss']}"
    return line


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)
