"""The compile report: what plait did to one compiled callable, as one self-contained HTML file.

:func:`report` writes it (``plait report`` on the command line): each specialization with its
guards and why it was compiled; the captured graph, the graph after each pass with the diff it
made and the rules that fired, and the final program; a picture of each program's graph (nodes
coloured by what runs them, fused kernels outlined); each generated kernel's source; timings per
stage; the memory plan; and the conformance gate's verdicts when they are passed in. The file
needs no network to view: its CSS, script and pictures are inline.

Example:
    >>> import tempfile, torch, plait
    >>> f = plait.compile(lambda x: (x.relu() * 2).sum(1), options={"cache": False})
    >>> _ = f(torch.randn(4, 8))
    >>> path = plait.report(f, tempfile.mkdtemp() + "/f.html")
    >>> text = path.read_text()
    >>> "pass 0: canonicalize" in text and "kernel k0" in text
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plait.compile_report.page import render
from plait.compile_report.views import (
    CallableView,
    from_compiled,
    from_explanation,
    from_manifest,
)
from plait.errors import InvalidArgumentTypeError
from plait.manifest import Manifest

__all__ = [
    "CallableView",
    "from_compiled",
    "from_explanation",
    "from_manifest",
    "render",
    "render_html",
    "report",
]


def render_html(compiled: Any, verdicts: Sequence[Any] = ()) -> str:
    """The report of ``compiled`` as HTML text: what :func:`plait.compile` returned, a loaded
    export artifact (``plait.load``: its manifests only), or a :class:`~plait.manifest.Manifest`.
    ``verdicts``: the gate's reports (``plait.conformance.check``), each shown with the
    specializations it judged.

    Example:
        >>> from plait.manifest import Manifest
        >>> page = render_html(Manifest(source_hash="ab" * 32))
        >>> page.startswith("<!DOCTYPE html>"), "specialization 0" in page
        (True, True)
    """
    if isinstance(compiled, Manifest):
        return render(from_manifest(compiled, "in memory"), verdicts)
    if hasattr(compiled, "_plait"):
        return render(from_compiled(compiled), verdicts)
    from plait.api import explain

    try:
        explanation = explain(compiled)
    except TypeError:
        raise InvalidArgumentTypeError(
            f"plait.report expects what plait.compile returned, got {type(compiled).__name__}"
        ) from None
    source = "a loaded artifact: its manifests (this process ran no pass)"
    return render(from_explanation(explanation, source), verdicts)


def report(compiled: Any, path: str | Path, *, verdicts: Sequence[Any] = ()) -> Path:
    """Write the compile report of ``compiled`` to ``path`` (an HTML file) and return the path.
    See :func:`render_html`.

    Example:
        >>> import tempfile
        >>> from plait.manifest import Manifest
        >>> path = report(Manifest(source_hash="ab" * 32), tempfile.mkdtemp() + "/m.html")
        >>> path.suffix, path.stat().st_size > 1000
        ('.html', True)
    """
    out = Path(path)
    out.write_text(render_html(compiled, verdicts), encoding="utf-8")
    return out
