"""Structured logs: what the compiler did, as it does it, through Python's :mod:`logging`.

``PLAIT_LOGS`` names the channels to show, comma-separated, in the spirit of ``TORCH_LOGS``:
``PLAIT_LOGS=guards,cache`` shows their ``INFO`` records, ``+passes`` adds ``DEBUG`` (the graph
after each pass), ``all`` (or ``+all``) every channel. Each channel is the logger
``plait.<channel>`` (:data:`CHANNELS` says what each one tells). Nothing is shown by default:
the ``plait`` logger sits at ``WARNING`` until a channel is turned on, here or by the
application's own logging configuration. A name that is not a channel is refused with
``ValueError`` (never ignored).

Each record carries ``record.event`` (what happened, e.g. ``recompile``) and ``record.fields``
(its facts as a dict, e.g. the guard that failed), for tools that read records rather than text.
This module reads ``PLAIT_LOGS`` once, when it is first imported; :func:`configure` changes the
setting later. It imports nothing of plait: every layer may log.

Example:
    >>> parse("guards,+cache") == {"guards": logging.INFO, "cache": logging.DEBUG}
    True
    >>> parse("nonsense")
    Traceback (most recent call last):
    ...
    plait.logs.LogChannelError: PLAIT_LOGS: unknown channel 'nonsense'; channels: capture, ...
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

ENVIRONMENT = "PLAIT_LOGS"
ROOT = "plait"

# channel -> what its INFO records tell (and its DEBUG records, after the semicolon)
CHANNELS: dict[str, str] = {
    "capture": "each program captured (nodes, guards, semantic hash) and each fallback with the "
    "user's line; debug: the captured graph's text",
    "guards": "why each specialization was compiled: the first call, or a recompile with the "
    "guard that failed; the recompile limit; debug: every guard of a new specialization",
    "passes": "each pass: whether it changed the graph, the rules that fired, its time; debug: "
    "the graph after each pass that changed it",
    "codegen": "what the backend made of a graph: kernels, extern calls, fallbacks with their "
    "reasons; debug: each kernel's source",
    "cache": "each artifact cache lookup: a hit (and its tier), or a miss with the key part "
    "that differs; entries discarded and rebuilt",
}

_FORMAT = "%(levelname).1s %(asctime)s.%(msecs)03d [%(name)s] %(message)s"
_DATE = "%H:%M:%S"


class LogChannelError(ValueError):
    """An unknown log channel (in ``PLAIT_LOGS``, ``options={"logs": ...}`` or
    ``plait.logs.channel``): code ``PLAIT-C170``, classified by name in ``plait.errors`` (this
    module imports nothing else of plait)."""


class _PlaitHandler(logging.StreamHandler):
    """The handler :func:`configure` installs (and removes): stderr, one line per record."""


def parse(text: str) -> dict[str, int]:
    """``PLAIT_LOGS``'s value as a level per channel: ``name`` is ``INFO``, ``+name``
    ``DEBUG``, ``all`` every channel; spaces and empty items are ignored."""
    levels: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        level = logging.DEBUG if item.startswith("+") else logging.INFO
        name = item.lstrip("+").strip()
        names = list(CHANNELS) if name == "all" else [name]
        if name not in CHANNELS and name != "all":
            raise LogChannelError(
                f"{ENVIRONMENT}: unknown channel {name!r}; channels: {', '.join(CHANNELS)} "
                "(a leading + for debug records, 'all' for every channel)"
            )
        for n in names:
            levels[n] = min(level, levels.get(n, logging.INFO))
    return levels


def configure(setting: str | Mapping[str, int]) -> dict[str, int]:
    """Show the channels ``setting`` names (``PLAIT_LOGS``'s syntax, or a level per channel) on
    stderr, and no others; an empty setting turns plait's logs off again. Returns the levels.

    Example:
        >>> configure("guards")
        {'guards': 20}
        >>> logging.getLogger("plait.guards").getEffectiveLevel() == logging.INFO
        True
        >>> configure("")
        {}
    """
    levels = parse(setting) if isinstance(setting, str) else dict(setting)
    unknown = sorted(set(levels) - set(CHANNELS))
    if unknown:
        raise LogChannelError(f"unknown log channels {unknown}; channels: {', '.join(CHANNELS)}")
    root = logging.getLogger(ROOT)
    for handler in [h for h in root.handlers if isinstance(h, _PlaitHandler)]:
        root.removeHandler(handler)
    for name in CHANNELS:
        logging.getLogger(f"{ROOT}.{name}").setLevel(levels.get(name, logging.NOTSET))
    # NOTE: off by default, even under an application's INFO root logger: plait's own level
    # is WARNING until a channel is on; then its records go to one stderr handler of its own
    # and not on to the root's handlers (each line once)
    root.setLevel(logging.WARNING)
    root.propagate = not levels
    if levels:
        handler = _PlaitHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, _DATE))
        root.addHandler(handler)
    return levels


def channel(name: str) -> logging.Logger:
    """The logger of channel ``name`` (``plait.<name>``)."""
    if name not in CHANNELS:
        raise LogChannelError(f"unknown log channel {name!r}; channels: {', '.join(CHANNELS)}")
    return logging.getLogger(f"{ROOT}.{name}")


def enabled(name: str, level: int = logging.INFO) -> bool:
    """Whether channel ``name`` shows records of ``level``: ask before computing an expensive
    message (a graph's text)."""
    return channel(name).isEnabledFor(level)


def emit(name: str, event: str, message: str | Callable[[], str], /, **fields: Any) -> None:
    """An ``INFO`` record on channel ``name``: ``message`` (or a function that makes it, called
    only when the channel is on), ``event`` and ``fields`` as the record's attributes.
    NOTE: no warning level here: what must reach a user unasked is a Python warning or an
    error, and a log record at ``WARNING`` would print a second time through logging's
    last-resort handler, with the channels off."""
    _log(name, logging.INFO, event, message, fields)


def debug(name: str, event: str, message: str | Callable[[], str], /, **fields: Any) -> None:
    """A ``DEBUG`` record on channel ``name`` (see :func:`emit`)."""
    _log(name, logging.DEBUG, event, message, fields)


def _log(
    name: str, level: int, event: str, message: str | Callable[[], str], fields: dict[str, Any]
) -> None:
    logger = channel(name)
    if not logger.isEnabledFor(level):
        return
    text = message() if callable(message) else message
    # NOTE: stacklevel 3: the record names the caller of emit or debug, not this module
    logger.log(level, text, extra={"event": event, "fields": fields}, stacklevel=3)


def _configure_from_environment() -> None:
    setting = os.environ.get(ENVIRONMENT, "")
    if setting.strip():
        configure(setting)
    elif logging.getLogger(ROOT).level == logging.NOTSET:
        # NOTE: an application that set plait's level before this import keeps its choice
        logging.getLogger(ROOT).setLevel(logging.WARNING)


_configure_from_environment()
