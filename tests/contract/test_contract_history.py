"""Tolerances only tighten: a looser budget needs a changelog entry that names it.

Unit tests of :func:`plait.contract.loosened` on synthetic contracts, and the real check: the
working tree's contract against its last committed version, and that against the version before.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import plait.contract
from plait.contract import budget_keys, loosened

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONTRACT_PATH = "src/plait/contract/default.toml"


def base() -> dict[str, Any]:
    return tomllib.loads(plait.contract.default_text())


def with_entry(data: dict[str, Any], *changes: str, reason: str = "measured") -> dict[str, Any]:
    data["changelog"].append(
        {"version": "1.0.1", "date": "2026-12-01", "reason": reason, "changes": list(changes)}
    )
    return data


def test_identical_and_tightened_contracts_loosen_nothing() -> None:
    old, new = base(), base()
    assert loosened(old, new) == []
    new["op"]["matmul"]["float32"]["rtol"] /= 2
    new["model"]["factor"]["float32"] = 1.5
    new["op"]["model"]["float32"]["accum"] = "float64"
    assert loosened(old, new) == []
    assert loosened(plait.contract.load(), plait.contract.load()) == []


def test_loosening_without_reason_is_reported() -> None:
    old, new = base(), base()
    new["op"]["matmul"]["float16"]["rtol"] *= 2
    (change,) = loosened(old, new)
    assert change.key == "op.matmul.float16.rtol"
    assert change.reason is None
    assert change.new == 2 * change.old
    assert "NO changelog entry" in str(change)


def test_loosening_with_a_new_entry_naming_the_key_carries_its_reason() -> None:
    old, new = base(), base()
    new["model"]["factor"]["bfloat16"] *= 2
    with_entry(new, "model.factor.bfloat16", reason="flash attention in bf16 measured 4x")
    (change,) = loosened(old, new)
    assert change.reason == "flash attention in bf16 measured 4x"


def test_an_entry_naming_another_key_is_no_reason() -> None:
    old, new = base(), base()
    new["op"]["conv"]["float32"]["atol"] *= 10
    with_entry(new, "op.conv.float32.rtol")
    assert [c.reason for c in loosened(old, new)] == [None]


def test_patterns_name_many_keys() -> None:
    old, new = base(), base()
    for op_class in ("conv", "attention"):
        new["op"][op_class]["bfloat16"]["rtol"] *= 2
    with_entry(new, "op.*.bfloat16.rtol")
    changes = loosened(old, new)
    assert len(changes) == 2 and all(c.reason == "measured" for c in changes)


def test_an_old_entry_cannot_explain_a_new_loosening() -> None:
    old = with_entry(base(), "op.matmul.float32.rtol")
    new = copy.deepcopy(old)
    new["op"]["matmul"]["float32"]["rtol"] *= 3
    assert [c.reason for c in loosened(old, new)] == [None]


@pytest.mark.parametrize(
    ("key", "edit"),
    [
        (
            "op.matmul.bfloat16.accum",
            lambda d: d["op"]["matmul"]["bfloat16"].update(accum="float16"),
        ),
        (
            "op.model.float32.nondeterministic",
            lambda d: d["op"]["model"]["float32"].update(nondeterministic=True),
        ),
        ("bitwise.order_preserving", lambda d: d["bitwise"].update(order_preserving=False)),
        ("model.floor.float32", lambda d: d["model"]["floor"].update(float32=100.0)),
        ("model.tail_factor.float16", lambda d: d["model"]["tail_factor"].update(float16=9.0)),
        ("schema_version", lambda d: d.update(schema_version=3)),
        ("model.noise_bits", lambda d: d["model"].update(noise_bits=20)),
        ("gradcheck.atol", lambda d: d["gradcheck"].update(atol=1.0)),
        ("op.reduction.float16.rtol", lambda d: d["op"]["reduction"]["float16"].pop("rtol")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_kind_of_loosening_is_seen(key: str, edit: Any) -> None:
    old, new = base(), base()
    edit(new)
    assert [c.key for c in loosened(old, new)] == [key]


def test_schema_1s_worst_error_factor_is_its_tail_factor() -> None:
    # NOTE: schema 1 judged the worst error by `factor`: raising the worst-error factor from it
    # is a loosening that a changelog entry must name.
    old = base()
    old["schema_version"] = 1
    for key in ("tail_factor", "baseline_layouts"):
        old["model"].pop(key)
    keys = budget_keys(old)
    assert keys["model.tail_factor.float32"] == keys["model.factor.float32"]
    found = {c.key for c in loosened(old, base())}
    assert "schema_version" in found and "model.baseline_layouts" in found
    tails = {f"model.tail_factor.{d}" for d in plait.contract.FACTOR_DTYPES}
    assert {
        k for k in tails if base()["model"]["tail_factor"][k.rsplit(".", 1)[1]] > keys[k]
    } <= found


def test_adding_a_baseline_layout_loosens_and_dropping_one_tightens() -> None:
    # NOTE: eager's error in each baseline layout may raise the baseline the factor scales; a
    # contract without the key (1.0.0) judges against eager in the case's own layout alone.
    none = base()
    none["model"].pop("baseline_layouts")
    assert budget_keys(none)["model.baseline_layouts"] == ()
    (change,) = loosened(none, base())
    assert change.key == "model.baseline_layouts" and change.reason is None
    fewer = base()
    fewer["model"]["baseline_layouts"] = ["contiguous"]
    assert loosened(base(), fewer) == [] and loosened(base(), none) == []
    assert [c.key for c in loosened(fewer, base())] == ["model.baseline_layouts"]


def test_every_budget_key_is_compared() -> None:
    keys = budget_keys(base())
    assert "op.attention.float16.rtol" in keys
    assert "model.factor.float32" in keys and "model.floor.float16" in keys
    assert "model.baseline_layouts" in keys and "model.tail_factor.bfloat16" in keys
    assert "gradcheck.rtol" in keys and "bitwise.order_preserving" in keys


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    )
    return out.stdout


def _history() -> tuple[Path, list[str]]:
    """The repository root and the commits that touched the contract, newest first."""
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None:
        pytest.skip("git is not installed: no history to compare the contract against")
    try:
        top = Path(_git(root, "rev-parse", "--show-toplevel").strip())
        commits = _git(top, "log", "--format=%H", "-n", "2", "--", CONTRACT_PATH).split()
    except subprocess.CalledProcessError:
        pytest.skip("not a git checkout: no history to compare the contract against")
    return top, commits


def test_the_contract_never_loosens_without_a_reason() -> None:
    top, commits = _history()
    current = (top / CONTRACT_PATH).read_text(encoding="utf-8")
    pairs = []  # (label, old text, new text)
    if commits:
        committed = _git(top, "show", f"{commits[0]}:{CONTRACT_PATH}")
        pairs.append((f"working tree vs {commits[0][:10]}", committed, current))
    if len(commits) > 1:
        previous = _git(top, "show", f"{commits[1]}:{CONTRACT_PATH}")
        pairs.append((f"{commits[0][:10]} vs {commits[1][:10]}", previous, committed))
    for label, old, new in pairs:
        # NOTE: the changelog is append-only: an entry once committed is never edited away.
        kept = tomllib.loads(new)["changelog"]
        edited = [e for e in tomllib.loads(old)["changelog"] if e not in kept]
        assert not edited, f"{label}: changelog entries edited or removed: {edited}"
        unexplained = [c for c in loosened(tomllib.loads(old), tomllib.loads(new)) if not c.reason]
        assert not unexplained, f"{label}: loosened without a changelog reason:\n" + "\n".join(
            str(c) for c in unexplained
        )
    plait.contract.parse(current)  # NOTE: and what is there now is a valid contract.
