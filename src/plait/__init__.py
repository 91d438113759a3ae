"""plait: a tensor compiler for PyTorch programs that never changes what they compute.

The public API is re-exported here, lazily: ``import plait.conformance`` (the independent gate)
must not load the compiler it judges, so nothing below is imported until it is first used.

Example:
    >>> import plait
    >>> plait.__version__
    '0.1.0'
    >>> callable(plait.compile)
    True
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Captured": "plait.api",
    "capture": "plait.api",
    "compile": "plait.api",
    "explain": "plait.api",
    "report": "plait.compile_report",
    "export": "plait.export",
    "load": "plait.export",
    "verify": "plait.export",
    "GraphCaptureError": "plait.errors",
}


# subpackages reachable as attributes (``plait.conformance.check``) without an explicit import
_SUBPACKAGES = ("conformance", "contract", "ir", "passes", "runtime", "manifest")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"plait.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'plait' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Captured",
    "GraphCaptureError",
    "__version__",
    "capture",
    "compile",
    "explain",
    "export",
    "load",
    "report",
    "verify",
]
