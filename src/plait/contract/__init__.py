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

import os
import stat
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
        '1.3.0'
    """
    if path is None:
        text = default_text()
        cached = _DEFAULT.get(text)
        if cached is None:
            # NOTE: a Contract is immutable; parsing the packaged text costs ~10 ms, and the
            # gate loads it on every check. Keyed by the text: an edited file is parsed again
            cached = parse(text, source=f"plait/contract/{DEFAULT_RESOURCE}")
            _DEFAULT.clear()
            _DEFAULT[text] = cached
        return cached
    return parse(_read_text(Path(path)), source=str(path))


_DEFAULT: dict[str, Contract] = {}  # NOTE: the packaged text's last parse


MAX_BYTES = 16 << 20  # NOTE: a contract is a few KiB; a larger file is refused, not read


def _read_text(path: Path) -> str:
    """The UTF-8 text of the regular file at ``path``; :class:`ContractError` naming the file
    and the problem otherwise (unreadable, a FIFO or device, too large, not UTF-8). NOTE: opened
    without blocking, so a FIFO is refused instead of waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ContractError(f"{path}: not a regular file")
            if st.st_size > MAX_BYTES:
                raise ContractError(f"{path}: {st.st_size} bytes, larger than {MAX_BYTES}")
            data = f.read()
    except OSError as exc:
        raise ContractError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


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
