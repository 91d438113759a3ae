"""The HTML of one specialization's parts: passes with their diffs, programs with their picture,
listing, evidence and kernels, timings, the memory plan, the gate's verdicts.

Every function returns HTML text with everything it shows escaped. Anchors follow one scheme
(:func:`anchor_of`): ``<spec>-p<program>-node-<id>`` and ``<spec>-p<program>-kernel-<name>``,
so the picture, the evidence table and the schedule all link to the same places.

Example:
    >>> anchor_of("s0", 1, "kernel", "k3")
    's0-p1-kernel-k3'
    >>> esc("<a & b>")
    '&lt;a &amp; b&gt;'
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

from plait.compile_report.graph_svg import COLOURS, LEGEND, graph_svg
from plait.compile_report.views import PassStep, ProgramView, SpecializationView, graph_listing

# NOTE: the rules table of one pass lists at most this many rewrites (the counts cover all)
MAX_REWRITES = 200


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def anchor_of(spec: str, program: int, kind: str, name: str) -> str:
    return f"{spec}-p{program}-{kind}-{name}"


def table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table of already-escaped cells."""
    attr = f' class="{cls}"' if cls else ""
    out = [f"<table{attr}><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead>"]
    out.append("<tbody>")
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</tbody></table>")
    return "\n".join(out)


def details(summary: str, body: str, open_: bool = False, cls: str = "") -> str:
    attrs = (" open" if open_ else "") + (f' class="{cls}"' if cls else "")
    return f"<details{attrs}><summary>{summary}</summary>\n{body}\n</details>"


def pre(text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<pre{attr}>{esc(text)}</pre>"


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return esc(n)
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n:,} B"


# --- passes --------------------------------------------------------------------------------
def diff_html(lines: list[str]) -> str:
    out = []
    for line in lines:
        cls = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")
        out.append(f'<span class="{cls}">{esc(line) or " "}</span>')
    # NOTE: one block per line, so no newline between them
    return '<pre class="diff">' + "".join(out) + "</pre>"


def passes_html(prefix: str, steps: list[PassStep], pipeline: Any) -> str:
    """A table of ``steps`` (one row per pass, linked) and a section per pass; ``prefix``
    makes their anchors (``<prefix>-pass-<i>``)."""
    if not steps:
        return f"<p>No pass ran (pipeline {esc(pipeline or '-')}).</p>"
    rows = []
    for step in steps:
        rules = ", ".join(f"{esc(k)}×{v}" for k, v in step.rule_counts().items()) or "-"
        ms = "" if step.seconds is None else f"{step.seconds * 1e3:.2f}"
        link = f'<a href="#{prefix}-pass-{step.index}">{esc(step.name)}</a>'
        rows.append([str(step.index), link, "yes" if step.changed else "no", rules, ms])
    head = ["#", "pass", "changed", "rules that fired", "ms"]
    out = [table(head, rows, "passes")]
    if steps[0].text is None:
        out.append(
            "<p class=note>The graphs after each pass are not known here: this specialization "
            "came from the artifact cache (the passes ran in the process that compiled it) "
            "or from a saved manifest.</p>"
        )
    out += [_pass_html(prefix, step) for step in steps]
    return "\n".join(out)


def _pass_html(spec: str, step: PassStep) -> str:
    title = f"pass {step.index}: {step.name}"
    out = [f'<section class="pass" id="{spec}-pass-{step.index}"><h4>{esc(title)}</h4>']
    if step.rewrites:
        rows = [
            [esc(r["rule"]), esc(_ids(r.get("replaced", []))), esc(_ids(r.get("produced", [])))]
            for r in step.rewrites[:MAX_REWRITES]
        ]
        body = table(["rule", "nodes replaced", "nodes produced"], rows, "rules")
        if len(step.rewrites) > MAX_REWRITES:
            body += f"<p>… and {len(step.rewrites) - MAX_REWRITES} more rewrites</p>"
        out.append(details(f"{len(step.rewrites)} rewrites", body, open_=len(rows) <= 20))
    elif step.changed:
        out.append("<p>changed the graph (no rule-level record)</p>")
    else:
        out.append("<p>unchanged</p>")
    if step.details:
        out.append(details("details", pre(_json(step.details))))
    if step.text is not None:
        if step.diff:
            changes = diff_html(step.diff)
            out.append(details("what changed (diff against the graph before)", changes, True))
        out.append(details("the graph after this pass", pre(step.text, "ir")))
    out.append("</section>")
    return "\n".join(out)


def _ids(ids: list[int]) -> str:
    return ", ".join(f"#{i}" for i in ids) or "-"


def _json(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True, default=str)


# --- programs --------------------------------------------------------------------------------
def legend_html() -> str:
    items = [
        f'<span class="swatch" style="background:{COLOURS[k]}"></span>{esc(v)}'
        for k, v in LEGEND.items()
    ]
    items.append('<span class="swatch kernel-swatch"></span>a fused kernel (outlined)')
    return '<p class="legend">' + " ".join(f"<span>{i}</span>" for i in items) + "</p>"


def program_html(spec: SpecializationView, p: int, prog: ProgramView) -> str:
    evidence = prog.evidence()
    kernel_of = prog.kernel_of()

    def anchor(kind: str, name: str) -> str:
        return "#" + anchor_of(spec.anchor, p, kind, name)

    counts = prog.executor.get("evidence", {}).get("counts", {})
    summary = ", ".join(f"{esc(k)} {v}" for k, v in sorted(counts.items()) if v) or "-"
    out = [
        f'<section class="program" id="{spec.anchor}-p{p}">',
        f"<h3>{esc(spec.title)}: {esc(prog.title)}</h3>",
        f"<p>backend {esc(prog.executor.get('backend', '?'))}, target "
        f"{esc(prog.executor.get('target', '-'))}; nodes by executor: {summary}; "
        f"{len(prog.kernels)} kernels</p>",
    ]
    if prog.graph is not None:
        svg = graph_svg(prog.graph, evidence, kernel_of, anchor)
        out.append(legend_html())
        out.append(details("picture of the graph", f'<div class="svgbox">{svg}</div>', True))
        out.append(details("the final program (IR)", _listing(spec.anchor, p, prog), True))
    else:
        out.append("<p class=note>No graph here (a saved manifest keeps none).</p>")
    table_of_nodes = _evidence(spec.anchor, p, prog, kernel_of)
    out.append(details(f"what runs each node ({len(evidence)} nodes)", table_of_nodes))
    out.append(details(f"schedule ({len(prog.schedule)} steps)", _schedule(spec.anchor, p, prog)))
    if prog.passes:
        title = f"passes of the {prog.title} after the forward/backward partition"
        out.append(f"<h4 id={spec.anchor}-p{p}-passes>{esc(title)}</h4>")
        out.append(passes_html(f"{spec.anchor}-p{p}", prog.passes, "training"))
    out.append(f"<h4>kernels of the {esc(prog.title)}</h4>")
    out.append(_kernels(spec.anchor, p, prog))
    out.append(f"<h4>memory plan of the {esc(prog.title)}</h4>")
    out.append(memory_html(prog.executor.get("memory_plan")))
    out.append("</section>")
    return "\n".join(out)


_NODE_LINE = re.compile(r"^#(\d+)\s")


def _listing(spec: str, p: int, prog: ProgramView) -> str:
    assert prog.graph is not None
    evidence = prog.evidence()
    lines = []
    for line in graph_listing(prog.graph).splitlines():
        m = _NODE_LINE.match(line)
        if m is None:
            lines.append(f"<span>{esc(line)}</span>")
            continue
        nid = int(m.group(1))
        executor, detail = evidence.get(nid, ("unknown", ""))
        lines.append(
            f'<span id="{anchor_of(spec, p, "node", str(nid))}" class="ev-{esc(executor)}" '
            f'title="{esc(executor)}: {esc(detail)}">{esc(line)}</span>'
        )
    return '<pre class="ir">' + "".join(lines) + "</pre>"


def _node_link(spec: str, p: int, prog: ProgramView, nid: Any) -> str:
    """``#id``, linked to the node's line of the listing where there is one."""
    if prog.graph is None:
        return f"#{esc(nid)}"
    return f'<a href="#{anchor_of(spec, p, "node", str(nid))}">#{esc(nid)}</a>'


def _kernel_link(spec: str, p: int, name: str) -> str:
    return f'<a href="#{anchor_of(spec, p, "kernel", name)}">{esc(name)}</a>'


def _evidence(spec: str, p: int, prog: ProgramView, kernel_of: dict[int, str]) -> str:
    nodes = prog.executor.get("evidence", {}).get("nodes", [])
    rows = []
    for n in nodes:
        nid = int(n["id"])
        detail = esc(n["detail"])
        name = kernel_of.get(nid)
        if name is not None:
            detail += " → " + _kernel_link(spec, p, name)
        node = _node_link(spec, p, prog, nid)
        runs = f'<span class="ev-{esc(n["executor"])}">{esc(n["executor"])}</span>'
        rows.append([node, esc(n["op"]), runs, detail])
    return table(["node", "op", "runs as", "detail"], rows, "evidence")


def _schedule(spec: str, p: int, prog: ProgramView) -> str:
    rows = []
    for i, step in enumerate(prog.schedule):
        if step.get("kind") == "kernel":
            what = _kernel_link(spec, p, str(step.get("name")))
        else:
            what = _node_link(spec, p, prog, step.get("node")) + " " + esc(step.get("op", ""))
        rows.append([str(i), esc(step.get("kind", "?")), what])
    return table(["step", "kind", "what"], rows, "schedule")


def _kernels(spec: str, p: int, prog: ProgramView) -> str:
    if not prog.kernels:
        return "<p>No generated kernel: every node runs as an extern call, a view or eagerly.</p>"
    first_of: dict[str, str] = {}  # NOTE: one source per symbol (identical kernels share it)
    rows, bodies = [], []
    for k in prog.kernels:
        r = k.record
        symbol = str(r.get("symbol", k.name))
        nodes = ", ".join(_node_link(spec, p, prog, n) for n in r.get("nodes", []))
        epilogue = ", ".join(f"#{n}" for n in r.get("epilogue_of", [])) or "-"
        link, template = _kernel_link(spec, p, k.name), esc(r.get("template", "?"))
        rows.append([link, template, nodes, esc(epilogue), f"<code>{esc(symbol)}</code>"])
        head = f'<h5 id="{anchor_of(spec, p, "kernel", k.name)}">kernel {esc(k.name)}</h5>'
        if symbol in first_of:
            same = _kernel_link(spec, p, first_of[symbol])
            bodies.append(f"{head}<p>same source as {same} (symbol {esc(symbol)})</p>")
            continue
        first_of[symbol] = k.name
        if k.source:
            body = details(f"source ({len(k.source.splitlines())} lines)", pre(k.source, "src"))
        else:
            sha = str(r.get("source_sha256", ""))[:16]
            body = f"<p class=note>source not kept here (sha256 {esc(sha)}…)</p>"
        bodies.append(head + body)
    columns = ["kernel", "template", "nodes", "epilogue of", "symbol"]
    return table(columns, rows, "kernels") + '<div class="sources">' + "\n".join(bodies) + "</div>"


def memory_html(plan: dict[str, Any] | None) -> str:
    if not plan:
        return "<p>No memory plan (this backend plans none).</p>"
    out = [
        f"<p>arena {_bytes(plan.get('arena_bytes'))}, peak live "
        f"{_bytes(plan.get('peak_live_bytes'))}, buffers reused: {esc(plan.get('reuse'))}</p>"
    ]
    rows = []
    for b in plan.get("buffers", []):
        live = b.get("live", ["?", "?"])
        extra = ""
        if b.get("alias_of"):
            extra = f"alias of %{esc(b['alias_of'])}"
        elif b.get("epilogue_of_node") is not None:
            extra = f"epilogue of #{esc(b['epilogue_of_node'])}"
        span = f"{esc(live[0])}–{esc(live[-1])}"
        value, home, offset = esc(b.get("value")), esc(b.get("home")), esc(b.get("offset", ""))
        rows.append([f"%{value}", home, _bytes(b.get("bytes")), offset, span, extra])
    head = ["value", "home", "bytes", "offset", "live (steps)", ""]
    out.append(details(f"{len(rows)} buffers", table(head, rows, "memory")))
    return "\n".join(out)


# --- timings and verdicts ----------------------------------------------------------------------
_ORDER = (
    "capture",
    "cache.snapshot",
    "cache.key",
    "passes",
    "pass.",
    "backend",
    "stax.",
    "training.",
    "cache.save",
)


def timings_html(timings: dict[str, Any]) -> str:
    """Each stage's seconds, as recorded (a kernel's build is in its kernel's row instead)."""
    entries = [
        (k, float(v))
        for k, v in timings.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and ".kernel." not in k
    ]
    if not entries:
        return "<p>No timings recorded.</p>"

    def rank(item: tuple[str, float]) -> tuple[int, str]:
        key = item[0]
        for i, prefix in enumerate(_ORDER):
            if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
                return i, key
        return len(_ORDER), key

    entries.sort(key=rank)
    top = max(v for _, v in entries) or 1.0
    rows = []
    for key, seconds in entries:
        sub = "." in key and not key.startswith("cache.")
        bar = f'<span class="bar" style="width:{max(1.0, 200 * seconds / top):.0f}px"></span>'
        name = ("&nbsp;&nbsp;" if sub else "") + esc(key)
        rows.append([name, f"{seconds * 1e3:.2f}", bar])
    return table(["stage", "ms", ""], rows, "timings")


def verdict_html(report: Any) -> str:
    """One conformance report (``plait.conformance.Report``)."""
    ok = bool(report.ok)
    cls = "pass" if ok else "fail"
    head = f'<p class="verdict {cls}">{esc(str(report).splitlines()[0])}</p>'
    rows = [
        [esc(f.severity), esc(f.check), esc(f.where), esc(f.case), esc(f.message)]
        for f in report.failures
    ]
    out = [head]
    if rows:
        out.append(table(["severity", "check", "where", "case", "message"], rows, "failures"))
    if report.margins:
        worst = sorted(report.margins.items(), key=lambda kv: -kv[1])[:10]
        shares = [[esc(k), f"{v:.1%}"] for k, v in worst]
        body = table(["value", "share of its budget used"], shares)
        out.append(details("closest to their budgets", body))
    if report.judged:
        out.append("<ul>" + "".join(f"<li>judged: {esc(j)}</li>" for j in report.judged) + "</ul>")
    if report.notes:
        out.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in report.notes) + "</ul>")
    checks = ", ".join(f"{esc(k)} {v}" for k, v in sorted(report.checks_run.items()))
    out.append(f"<p>checks run: {checks or '-'}</p>")
    return "\n".join(out)
