"""An HTML document read back with :mod:`html.parser`: its structure checked (every element
closed in order, one html/head/body, a title) and its ids, links and resources collected."""

from __future__ import annotations

from html.parser import HTMLParser

# NOTE: elements HTML closes by itself
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}  # fmt: skip
# NOTE: SVG elements written self-closing are closed by their own tag
SELF_CLOSED = {"polyline", "rect", "path", "circle", "line"}


class Document(HTMLParser):
    """Parse ``text``; ``problems`` lists every structural defect found."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.counts: dict[str, int] = {}
        self.ids: dict[str, int] = {}
        self.hrefs: list[str] = []
        self.resources: list[str] = []  # NOTE: every src= and every non-fragment href=
        self.title = ""
        self.text_by_tag: dict[str, list[str]] = {}
        self.feed(text)
        self.close()
        if self.stack:
            self.problems.append(f"unclosed at the end: {self.stack}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # NOTE: an SVG <title> is a tooltip, not the document's title
        counted = "svg:" + tag if "svg" in self.stack else tag
        self.counts[counted] = self.counts.get(counted, 0) + 1
        for name, value in attrs:
            if name == "id" and value is not None:
                self.ids[value] = self.ids.get(value, 0) + 1
            if name == "href" and value is not None:
                self.hrefs.append(value)
                if not value.startswith("#"):
                    self.resources.append(value)
            if name == "src":
                self.resources.append(str(value))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.problems.append(f"end tag of the void element {tag}")
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack:
            self.text_by_tag.setdefault(self.stack[-1], []).append(data)
            if self.stack[-1] == "title" and "svg" not in self.stack:
                self.title += data

    def check(self) -> None:
        """Raise AssertionError naming every defect: structure, duplicate ids, links to ids
        that are not there, resources outside the document."""
        problems = list(self.problems)
        for tag in ("html", "head", "body", "title"):
            if self.counts.get(tag) != 1:
                problems.append(f"{self.counts.get(tag, 0)} <{tag}> elements")
        problems += [f"id {k!r} used {n} times" for k, n in self.ids.items() if n > 1]
        missing = sorted({h[1:] for h in self.hrefs if h.startswith("#")} - set(self.ids))
        problems += [f"a link to #{m}, which no element has" for m in missing]
        problems += [f"a resource outside the document: {r}" for r in self.resources]
        assert not problems, "\n".join(problems[:30])
