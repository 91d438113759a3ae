"""plait.contract: the numerical contract, declared before compilation.

The contract is data: a versioned TOML file shipped in the package (``default.toml``). It declares,
per op class and dtype, the rtol/atol budget, the accumulation dtype compiled code must use and
whether nondeterministic kernels are allowed; the float64-anchored model factor; the bitwise rule
for order-preserving transforms; and the finite-difference budgets for derivative rules.

The conformance gate reads it; nothing in the compiler may lower or override a value: a
:class:`Contract` is frozen, and a looser one can only come from an edited file whose changelog says
why (see :func:`loosened`).

Example:
    >>> import plait.contract
    >>> c = plait.contract.load()
    >>> c.tolerance("reduction", "float32").rtol
    1e-05
    >>> c.model_factor("bfloat16")
    3.0
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from plait.contract.history import Loosening, budget_keys, loosened
from plait.contract.model import (
    DTYPES,
    FACTOR_DTYPES,
    FLOAT_DTYPES,
    LAYOUTS,
    OP_CLASSES,
    ChangelogEntry,
    Contract,
    ContractError,
    GradcheckSpec,
    Tolerance,
    dtype_key,
    from_data,
    parse,
)

DEFAULT_RESOURCE = "default.toml"


def default_text() -> str:
    """The text of the contract shipped in the package."""
    return resources.files(__name__).joinpath(DEFAULT_RESOURCE).read_text(encoding="utf-8")


def load(path: str | Path | None = None) -> Contract:
    """Load and validate a contract: the packaged default when ``path`` is None.

    Raises :class:`ContractError` naming the offending key when the file is malformed.

    Example:
        >>> load().version
        '1.1.0'
    """
    if path is None:
        return parse(default_text(), source=f"plait/contract/{DEFAULT_RESOURCE}")
    return parse(Path(path).read_text(encoding="utf-8"), source=str(path))


__all__ = [
    "DTYPES",
    "FACTOR_DTYPES",
    "FLOAT_DTYPES",
    "LAYOUTS",
    "OP_CLASSES",
    "ChangelogEntry",
    "Contract",
    "ContractError",
    "GradcheckSpec",
    "Loosening",
    "Tolerance",
    "budget_keys",
    "default_text",
    "dtype_key",
    "from_data",
    "load",
    "loosened",
    "parse",
]
