"""nn.Module's call for a wrapper module: the wrapper's own hooks run, the global ones do not.

A global module hook (``register_module_forward_hook`` and its kin) runs at every module call.
Eager calls the user's module, so each global hook runs once per module. A
:class:`~plait.compiled_callables.CompiledModule` is called in the module's place and then
runs (or stands for) the module, whose calls run the global hooks: called through nn.Module's
own ``_call_impl``, each global hook would run once more, on the wrapper (a hook that edits an
output would edit it twice). These are nn.Module's own methods, with the global hook tables
they read replaced by empty ones; hooks registered on the wrapper itself run as nn.Module runs
them.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Wrapper(nn.Module):
    ...     _call_impl = call_impl
    ...     def forward(self, x):
    ...         return x * 2
    >>> seen = []
    >>> handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(m))
    >>> _ = Wrapper()(torch.ones(1)); handle.remove()
    >>> seen
    []
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from torch import nn

# NOTE: the call-time global hook tables of torch.nn.modules.module (not the registration
# hooks, which run when a parameter, buffer or submodule is assigned)
_CALL_TABLES = frozenset(
    {
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
        "_global_is_full_backward_hook",
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_forward_hooks_always_called",
        "_global_forward_hooks_with_kwargs",
    }
)


def without_global_hooks(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a function of torch.nn.modules.module) reading empty global hook tables."""
    assert isinstance(fn, types.FunctionType)
    scope = dict(fn.__globals__)
    for name in _CALL_TABLES & set(fn.__code__.co_names):
        table = scope[name]
        scope[name] = None if table is None else type(table)()
    return types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)


call_impl = without_global_hooks(nn.Module._call_impl)
get_backward_hooks = without_global_hooks(nn.Module._get_backward_hooks)
get_backward_pre_hooks = without_global_hooks(nn.Module._get_backward_pre_hooks)
