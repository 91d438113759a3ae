"""plait.guards: guards, as data, and their evaluation.

:mod:`plait.guards.guard` defines guards (``Guard``, ``GuardSet``, ``GuardEnv`` and the reads a
guard can describe as data); capture records them (:mod:`plait.frontend.guard_plan` decides which
a trace needs). The compile stage adds its own: the ambient settings a compile read
(:mod:`plait.guards.ambient`) and frozen parameters and buffers (:mod:`plait.guards.state`).
:mod:`plait.guards.native` is the native evaluator of a guard set (C++ in ``csrc/``), which the
API passes to the guard sets it checks: importing this package registers nothing.

The package spans two layers: ``guard`` sits below capture (it imports only PyTorch), the rest
beside the artifact cache (pyproject.toml's import-linter contracts). So this module imports only
``guard``; import the others by their module.

Example:
    >>> from plait.guards import Guard, GuardEnv, GuardSet
    >>> g = Guard("scalar", "arg n", "n == 4", 4, lambda env: env.leaves[0])
    >>> GuardSet([g]).holds(GuardEnv((), [4]))
    True
"""

from plait.guards.guard import Guard, GuardEnv, GuardSet

__all__ = ["Guard", "GuardEnv", "GuardSet"]
