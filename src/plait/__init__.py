"""plait: a tensor compiler for PyTorch programs that never changes what they compute.

The public API is re-exported here; each piece lives in its own subpackage (see DESIGN.md).

Example:
    >>> import plait
    >>> plait.__version__
    '0.1.0'
"""

__version__ = "0.1.0"

from plait.api import Captured, capture, compile
from plait.errors import GraphCaptureError

__all__ = ["Captured", "GraphCaptureError", "__version__", "capture", "compile"]
