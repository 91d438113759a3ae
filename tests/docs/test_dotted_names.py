"""Every ``plait.x.y`` name the README and the guides mention resolves: the longest prefix that
is a module imports, and the rest are attributes of it. A moved or renamed module, function or
class fails here with the page and line that still name the old one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"(?<![\w./-])plait(?:\.[A-Za-z_]\w*)+")


def mentions() -> list[tuple[str, int, str]]:
    """``(page, line, name)`` for each dotted name in README.md and docs/*.md."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            found += [(str(page.relative_to(ROOT)), number, m) for m in NAME.findall(line)]
    return found


def unresolved(name: str) -> str | None:
    """Why ``name`` does not resolve, or None when it does."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # NOTE: no such module: a shorter prefix, the rest as attributes
            return f"importing {module_name} fails: {exc}"
        for i, attr in enumerate(parts[cut:], cut):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:i])} has no attribute {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no prefix of it is a module"


def test_every_plait_name_in_the_docs_resolves() -> None:
    found = mentions()
    assert len(found) > 100  # NOTE: the scan sees the docs at all
    why = {name: unresolved(name) for name in {name for _, _, name in found}}
    broken = [f"{page}:{line}: {name}: {why[name]}" for page, line, name in found if why[name]]
    assert not broken, "\n".join(broken)
