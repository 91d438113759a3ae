"""The README and the guides link only to files of this repository, and each file they link to
exists; the README leads to the architecture and the tutorial. (mkdocs --strict checks the
links between pages of the site; the README is not one of them.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    return LINK.findall(text)


def test_links_stay_in_the_repository_and_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for link in _links(page):
            target = link.split("#")[0]
            if not target:
                continue  # NOTE: an anchor in the same page
            if re.match(r"^[a-z]+:", target):
                broken.append(f"{page.name}: {link} (outside the repository)")
                continue
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{page.name}: {link}")
    assert not broken, broken


def test_the_readme_leads_to_the_architecture_and_the_tutorial() -> None:
    links = _links(ROOT / "README.md")
    assert "docs/architecture.md" in links and "docs/tutorial.md" in links
    assert "shared/" not in (ROOT / "README.md").read_text()
