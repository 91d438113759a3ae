"""A griffe extension for the API reference: plait's docstrings read as Markdown.

They title their doctests ``Example:``, which Google-style parsing reads as an admonition of
Markdown text (where a printed list looks like a link): renamed ``Examples:``, they are read as
code. Their Sphinx roles (``:func:`plait.compile```) become inline code."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`~?([^`]+)`")


class DocstringsAsMarkdown(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _HEADING.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(r"`\1`", text)
