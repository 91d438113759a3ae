"""``plait.verify``: an artifact's program judged on this machine, against the references it
stores, under the contract it stores, through the conformance gate.

The gate runs the loaded program on the stored reference inputs and judges its outputs against
the stored eager outputs by the contract's model rule (anchored on the stored float64 outputs
where there are any), and checks that a second call reproduces the first. Beside the verdict,
the report says whether the outputs are the very bits the compiled program gave at export (on
another CPU or toolchain they may differ within the contract).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.conformance import Report
from plait.export.archive import Limits
from plait.export.loading import load
from plait.export.references import judge, same_bits
from plait.frontend import pytree


@dataclass
class Verification:
    """The verdict on one artifact: ``ok`` (the gate's), its ``report``, whether the outputs
    are ``bitwise_as_exported``, what became of its ``native`` kernels, and its identity."""

    path: str
    digest: str
    semantic_hash: str
    format_version: int
    report: Report
    bitwise_as_exported: bool | None
    native: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "digest": self.digest,
            "semantic_hash": self.semantic_hash,
            "format_version": self.format_version,
            "bitwise_as_exported": self.bitwise_as_exported,
            "native": self.native,
            "contract_version": self.report.contract_version,
            "failures": [str(f) for f in self.report.failures],
            "notes": [*self.notes, *self.report.notes],
        }

    def __str__(self) -> str:
        verdict = "conforms" if self.ok else "DOES NOT CONFORM"
        bits = {True: "yes", False: "no (within the contract, another CPU or toolchain may "
                "round otherwise)", None: "not recorded"}[self.bitwise_as_exported]  # fmt: skip
        lines = [
            f"{self.path}: {verdict} (contract {self.report.contract_version})",
            f"  program {self.semantic_hash[:16]}…, artifact {self.digest[:23]}…, "
            f"format {self.format_version}",
            f"  native kernels: {self.native.get('status')}: {self.native.get('reason')}",
            f"  same bits as at export: {bits}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        lines += ["  " + line for line in str(self.report).splitlines()]
        return "\n".join(lines)


def verify(
    path: str | Path,
    *,
    trust: str | Iterable[str] | None = None,
    limits: Limits | None = None,
) -> Verification:
    """See :func:`plait.export.verify` (the public entry point)."""
    loaded = load(path, trust=trust, limits=limits)
    cases = loaded.references
    report = judge(loaded, cases, loaded.contract, loaded.input_outputs)
    bitwise = None
    if "compiled" in cases.outputs:
        bitwise = True
        for k in range(cases.count):
            args, kwargs = cases.call(k)
            got = pytree.flatten(loaded(*args, **kwargs), "output")[1]
            want = cases.outputs["compiled"][k]
            bitwise = bitwise and same_bits(got, want)
    return Verification(
        str(path),
        loaded.digest,
        loaded.semantic_hash,
        loaded.format_version,
        report,
        bitwise,
        dict(loaded.native),
        list(loaded.notes),
    )
