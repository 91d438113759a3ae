"""plait.guards: guard management for compiled specializations (L6).

Guards themselves are data defined where capture records them (:mod:`plait.frontend.guards`:
``Guard``, ``GuardSet``, ``GuardEnv``); this package adds what the compile stage guards: the
ambient settings a compile read (:mod:`plait.guards.ambient`), frozen parameters and buffers
(:mod:`plait.guards.state`), the fast fetch of a module's live state, and the native evaluator
that runs :meth:`GuardSet.holds` (:mod:`plait.guards.native`, registered on import).

Example:
    >>> from plait.guards import ambient_guards
    >>> any(g.source == "torch.get_num_threads()" for g in ambient_guards())
    True
"""

from plait.frontend.guards import Guard, GuardEnv, GuardSet
from plait.guards.ambient import (
    CALL_SETTINGS,
    Setting,
    ambient_guards,
    call_settings,
    process_settings,
)
from plait.guards.native import status as native_status
from plait.guards.state import StateFetcher, frozen_guards

__all__ = [
    "CALL_SETTINGS",
    "Guard",
    "GuardEnv",
    "GuardSet",
    "Setting",
    "StateFetcher",
    "ambient_guards",
    "call_settings",
    "frozen_guards",
    "native_status",
    "process_settings",
]
