"""NumPy scalars as operands of the ops a program calls.

``x * arr.sum()`` passes a ``np.float32``: eager's operators treat a NumPy integer or float
scalar as the Python number of its value (it promotes and rounds as ``x * 2.5`` would), so
capture turns it into that number's literal. A ``np.bool_`` is not treated so (eager's
``bool_tensor * np.bool_(True)`` is a float tensor): it stays unsupported.

Example:
    >>> import numpy as np
    >>> numpy_number(np.float32(2.5)), numpy_number(np.int64(3)), numpy_number(np.bool_(1)) is True
    (2.5, 3, False)
"""

from __future__ import annotations

import sys
from typing import Any


def numpy_number(x: Any) -> Any:
    """``x`` as a Python ``int`` or ``float`` where it is a NumPy integer or float scalar; ``x``
    itself otherwise."""
    np = sys.modules.get("numpy")
    if np is None:
        return x
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x
