"""The ambient ``TorchFunctionMode`` and ``TorchDispatchMode`` stacks of a call.

A user's mode (``with MyMode(): compiled(x)``), PyTorch's own (``FakeTensorMode``, a
``FlopCounterMode``, ``with torch.device("meta")``, ``torch.set_default_device``) sees every
torch call of an eager program and may change any result; a compiled program's kernels run no
torch calls for it to see, and its capture records plait's ops, not what the mode made of them.
Such a call runs the program as written (:func:`foreign_mode` names the mode). plait's own modes
(capture's tracer mode, the regions' op counter) are not the user's: they pass.

Example:
    >>> import torch
    >>> from torch.overrides import TorchFunctionMode
    >>> foreign_mode() is None
    True
    >>> with TorchFunctionMode():
    ...     foreign_mode()
    'a TorchFunctionMode (TorchFunctionMode)'
"""

from __future__ import annotations

import torch


def _own(mode: object) -> bool:
    return type(mode).__module__.startswith("plait.")


def capture_running() -> bool:
    """Whether a plait capture is tracing on this thread (its mode, marked ``plait_capture``,
    is on the TorchFunctionMode stack): a compiled callable called there is part of the program
    being captured, and runs as written so that the capture traces through it."""
    for i in range(torch._C._len_torch_function_stack()):
        if getattr(torch._C._get_function_stack_at(i), "plait_capture", False):
            return True
    return False


def foreign_mode() -> str | None:
    """The first mode on this thread's stacks that is not plait's own, described; None when
    there is none (the common case: two C calls)."""
    for kind, length, at in (
        ("TorchFunctionMode", torch._C._len_torch_function_stack, torch._C._get_function_stack_at),
        ("TorchDispatchMode", torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at),
    ):
        for i in range(length()):
            mode = at(i)
            if not _own(mode):
                return f"a {kind} ({type(mode).__name__})"
    return None


__all__ = ["capture_running", "foreign_mode"]
