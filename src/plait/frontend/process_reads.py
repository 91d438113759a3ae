"""State of the process a program reads through library calls: the global random number
generators of Python and NumPy, a random generator object it holds, and the environment.

A library object is guarded by identity (:mod:`plait.frontend.pyvalues`): what it holds inside
is not inspected. These are the exceptions, where what it holds is exactly what the program
reads, and where a graph that baked in one read would compute something else than eager on the
next call:

- ``random.random()``, ``random.uniform(0, 1) < self.layerdrop``, ``np.random.rand()``: a draw
  from a global generator during capture would be a constant of the graph; eager draws again
  on each call. Capture compares the generators' states before and after the program ran
  (:class:`GlobalDraws`): a program that moved one is refused (the loud eager fallback; the
  capture's own run is that call's result, so the generator moved once, as eager's does).
- a ``random.Random`` or a NumPy ``Generator``/``RandomState`` the program holds
  (``self.rng.random()``): compared by its state (:func:`rng_state`), so a draw while the
  program runs is refused as any other value it changes.
- ``os.environ`` (read by name, or through ``os.getenv``): its contents are guarded (natively,
  the version tag of its dict).

Example:
    >>> import random
    >>> draws = GlobalDraws()
    >>> draws.moved()
    []
    >>> _ = random.random()
    >>> draws.moved()
    ["Python's random module"]
"""

from __future__ import annotations

import random
import sys
from typing import Any

# NOTE: the names through which code reads the environment (plait.snapshots.fingerprint's too)
ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb"})


def rng_state(v: Any) -> Any:
    """The state of a random generator object as a comparable value; None for anything else."""
    if isinstance(v, random.Random):
        try:
            return v.getstate()
        except NotImplementedError:  # NOTE: SystemRandom: no state to compare
            return None
    module = type(v).__module__ or ""
    if not module.startswith("numpy.random"):
        return None
    bit_generator = getattr(v, "bit_generator", None)
    if bit_generator is not None and hasattr(v, "integers"):  # NOTE: a numpy Generator
        return repr(bit_generator.state)
    get_state = getattr(v, "get_state", None)
    if get_state is None:
        return None
    name, keys, pos, has_gauss, cached = get_state()  # NOTE: a legacy RandomState
    return (name, keys.tobytes(), pos, has_gauss, cached)


def _global_generators() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("Python's random module", random._inst)]
    numpy = sys.modules.get("numpy.random.mtrand")
    if numpy is not None and getattr(numpy, "_rand", None) is not None:
        out.append(("NumPy's global random state (np.random)", numpy._rand))
    return out


class GlobalDraws:
    """The global random generators' states when made; :meth:`moved` names those that moved."""

    def __init__(self) -> None:
        self._before = [(name, g, rng_state(g)) for name, g in _global_generators()]

    def moved(self) -> list[str]:
        return [name for name, g, state in self._before if rng_state(g) != state]

    def refusal(self) -> str | None:
        """Why a program that moved one is refused (None: none moved)."""
        moved = self.moved()
        if not moved:
            return None
        return (
            f"the program draws from {moved[0]}: a graph would hold this capture's draw as a "
            "constant, where eager draws again on each call"
        )


__all__ = ["ENV_NAMES", "GlobalDraws", "rng_state"]
