"""Reject tolerance literals in tests: an ``atol``/``rtol`` set to a number.

Tolerances come from the numerical contract (``plait.contract.load().tolerance(op_class, dtype)``,
or ``tests.util.contract_tol``); exact comparisons use ``torch.equal`` or
``tests.util.assert_bitwise``. Only the contract's own tests (``tests/contract/``), which test
tolerances themselves, may write numbers. The scan is textual, so a literal inside a child
process's source string counts too.

Usage: ``python tools/check_test_tolerances.py [TESTS_DIR]`` (default ``tests``); exits 1 and
names file and line of each literal found.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# NOTE: relative to the tests folder; these test the contract's tolerances themselves
EXEMPT = ("contract",)

# atol=1e-5, rtol = 0, "atol": .5, atol=-1: a keyword, an assignment or a mapping key
LITERAL = re.compile(r"""\b["']?(atol|rtol)["']?\s*[=:]\s*[-+]?(\d|\.\d)""")


def literals(root: Path) -> list[str]:
    """``path:line: text`` for each tolerance literal under ``root`` outside the exempt folders."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts and rel.parts[0] in EXEMPT:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if LITERAL.search(line):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "tests")
    found = literals(root)
    for row in found:
        print(row)
    if found:
        print(
            f"{len(found)} tolerance literal(s) in {root}: take rtol/atol from the numerical "
            "contract (tests.util.contract_tol), or compare exactly (tests.util.assert_bitwise)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
