"""Locate the user's line that made a torch call: the innermost frame outside plait and torch."""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

import torch

# NOTE: plait's package directory is this file's grandparent (no import of plait itself: the
# capture layer may not import the API above it).
_PLAIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP = (_PLAIT_DIR + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


@dataclass(frozen=True)
class UserFrame:
    filename: str
    lineno: int
    function: str
    code: str


def user_frame() -> UserFrame | None:
    """The innermost stack frame whose file is neither in plait nor in torch."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_SKIP) and not frame.f_code.co_filename.startswith("<frozen"):
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            return UserFrame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, code)
        frame = frame.f_back  # type: ignore[assignment]
    return None
