"""How the executor runs one extern node (:class:`ExternCall`), apart from the rules that make
one (:mod:`plait.codegen.extern`), so that a rule's own module (the CUDA batch norm's) can
build calls that :mod:`plait.codegen.extern`'s table names."""

from __future__ import annotations

from collections.abc import Callable
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
    # NOTE: every result is a tensor the call allocated, in the strides its dry run had, sharing
    # no operand's storage (plait's native calls): the runner takes it as it is
    fresh: bool = False
