"""``torch.compiler.is_compiling()`` answers True on the thread a capture runs on, as it does
while torch.compile traces.

Libraries branch on it to skip what a compiled graph has no use for: a check that reads tensor
data only to choose a faster path of the same function. transformers' mask code asks
``padding_mask.all()`` (a data read, which makes a capture refuse the whole model and fall back
to regions) unless it is compiling, and then builds the full mask instead, with the same
result; its decoders with a padded batch compiled 21-34% of their ops by regions, and compile
whole under the flag. Other threads keep PyTorch's own answer while a capture runs, and the
function is PyTorch's again once no capture runs. A capture with dynamic shapes leaves it off:
those paths of transformers' masks index with tensors on symbolic dims, which have no IR op
and cannot be opaque nodes (the whole program would run eagerly).

Example:
    >>> import torch
    >>> torch.compiler.is_compiling()
    False
    >>> with compiling():
    ...     torch.compiler.is_compiling()
    True
    >>> torch.compiler.is_compiling()
    False
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from plait.frontend.nested_fast_path import refuse_if_encoder_fast_path
from plait.frontend.thread_patch import ThreadPatch


def _is_compiling() -> bool:
    if _FLAG.active():
        refuse_if_encoder_fast_path(sys._getframe(1))  # NOTE: its mask check asks the flag
        return True
    return bool(_FLAG.original())


_FLAG = ThreadPatch(torch.compiler, "is_compiling", _is_compiling)


@contextmanager
def compiling() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` is True on this thread inside the block."""
    with _FLAG.on():
        yield
