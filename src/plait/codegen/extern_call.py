"""How the executor runs one extern node (:class:`ExternCall`), apart from the rules that make
one (:mod:`plait.codegen.extern`), so that a rule's own module (the CUDA batch norm's) can
build calls that :mod:`plait.codegen.extern`'s table names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ExternCall:
    """How the executor runs one extern node."""

    fn: Callable[..., Any]
    op_class: str
    detail: str
    # NOTE: the library whose compile-time refusal or acceptance the plan reports ("oneDNN",
    # "MKL"); empty for PyTorch's own ops.
    library: str = ""
    # NOTE: plait's native calls: their one result is a tensor they allocate in these strides,
    # sharing no operand's memory; where the plan expects these strides (:meth:`native_result`)
    # the runner takes it as it is, and the memory plan gives it an arena buffer (the call
    # takes it as the keyword ``out``, writes it and returns it) as a kernel's result gets one
    strides: tuple[int, ...] | None = None
    # NOTE: plait's native calls: the C entries of csrc's kernels they call
    # (:func:`plait.codegen.native_entries.unit_of`), whose libraries an export carries
    entries: tuple[str, ...] = ()
    # NOTE: plait's native calls: their arrays, for a run of them as one C call
    # (:class:`plait.codegen.native_launch.NativeLaunch`); None where the call cannot be run so
    launch: Any = None

    def native_result(self, planned: Sequence[object]) -> bool:
        """Whether the plan's strides for the result are the ones this call writes."""
        return self.strides is not None and tuple(planned) == self.strides
