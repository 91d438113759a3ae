"""The IR's own error types. The IR imports nothing of plait above it, so ``plait.errors``
classifies these by name (its ``_BY_NAME``): an invalid argument to an IR API
(:class:`IRValueError`, code ``PLAIT-C170``), an argument of a wrong type
(:class:`IRTypeError`, ``PLAIT-C171``), an unknown name (:class:`IRKeyError`, ``PLAIT-C172``),
and a private file that is not a regular file (:class:`NotRegularFileError`) or is larger than
its limit (:class:`StoredFileError`), both ``PLAIT-C144``. Each keeps the Python base the IR
always raised.

Example:
    >>> try:
    ...     raise IRKeyError("graph has no input named 'x'")
    ... except KeyError as exc:
    ...     str(exc)
    '"graph has no input named \\'x\\'"'
"""

from __future__ import annotations


class IRValueError(ValueError):
    """An invalid value given to an IR API (a kind, a name, a shape, an op definition)."""


class IRTypeError(TypeError):
    """A value of a type the IR does not take (a dtype, a device, an attribute value)."""


class IRKeyError(KeyError):
    """A name the IR does not know (an input, an op, a derivative rule)."""


class StoredFileError(ValueError):
    """A file plait reads back is not a regular file, or is larger than its limit."""


class NotRegularFileError(OSError):
    """A path plait reads a private file from is not a regular file (a FIFO, a device)."""
