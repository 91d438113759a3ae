"""plait.diagnose: miscompile bisection, minimal standalone repros, a graph fuzzer.

A tool beside the pipeline (it may import anything of plait): :func:`bisect` finds the first
pass and node whose output diverges beyond the numerical contract and writes a repro directory;
:func:`rerun` re-runs one; :func:`fuzz` runs random well-typed graphs through every pass and the
Stax backend against the reference interpreter; :func:`break_even` weighs a compile against what
it saves per call. See docs/diagnose.md.

Example:
    >>> import torch, plait.diagnose
    >>> result = plait.diagnose.bisect(lambda x: torch.relu(x) * 2, (torch.randn(4, 4),))
    >>> result.ok
    True
"""

from plait.diagnose.bisection import Bisection, NodeReport, bisect
from plait.diagnose.break_even import BreakEven, break_even
from plait.diagnose.fuzz import FuzzReport, fuzz
from plait.diagnose.judging import Measure
from plait.diagnose.reproducer import Rerun, load_repro, rerun, write_repro

__all__ = [
    "Bisection",
    "BreakEven",
    "FuzzReport",
    "Measure",
    "NodeReport",
    "Rerun",
    "bisect",
    "break_even",
    "fuzz",
    "load_repro",
    "rerun",
    "write_repro",
]
