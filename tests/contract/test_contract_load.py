"""The shipped contract loads, is complete and immutable; malformed files fail with clear errors."""

from __future__ import annotations

import copy
import dataclasses
import doctest
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import plait.contract
import plait.contract.history
import plait.contract.model
from plait.contract import (
    DTYPES,
    FACTOR_DTYPES,
    FLOAT_DTYPES,
    OP_CLASSES,
    ContractError,
    dtype_key,
    from_data,
    load,
    parse,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def default_data() -> dict[str, Any]:
    return tomllib.loads(plait.contract.default_text())


def test_default_contract_declares_every_op_class_and_dtype() -> None:
    contract = load()
    assert contract.schema_version == plait.contract.model.SCHEMA_VERSION
    for op_class in OP_CLASSES:
        for dtype in DTYPES:
            tol = contract.tolerance(op_class, dtype)
            assert tol.rtol >= 0 and tol.atol >= 0
            assert isinstance(tol.nondeterminism_allowed, bool)
    for dtype in FACTOR_DTYPES:
        assert contract.model_factor(dtype) >= 1.0
        assert contract.model_floor(dtype) >= 0.0
    assert contract.bitwise_order_preserving is True
    assert contract.version in {entry.version for entry in contract.changelog}


def test_model_rule_keys() -> None:
    # NOTE: relations, not literals: the worst element is the noisier statistic, so its factor is
    # never below the RMS factor; an empty baseline list means eager's own layout alone.
    contract = load()
    for dtype in FACTOR_DTYPES:
        assert contract.model_tail_factor(dtype) >= contract.model_factor(dtype)
    assert set(contract.baseline_layouts) <= set(plait.contract.LAYOUTS)
    data = default_data()
    data["model"]["baseline_layouts"] = []
    assert from_data(data).baseline_layouts == ()


def test_integers_and_bools_are_exact_everywhere() -> None:
    contract = load()
    for op_class in OP_CLASSES:
        for dtype in ("integer", "bool", torch.int32, torch.uint8, torch.bool):
            assert contract.tolerance(op_class, dtype).exact


def test_budgets_are_ordered_by_precision() -> None:
    # NOTE: relations between contract values, not literals: a wider dtype never gets a looser
    # budget than a narrower one, and data movement is exact.
    contract = load()
    order = ["float64", "float32", "float16", "bfloat16"]
    for op_class in OP_CLASSES:
        rtols = [contract.tolerance(op_class, d).rtol for d in order]
        assert rtols == sorted(rtols), op_class
        assert contract.tolerance(op_class, "float32").accum_dtype in ("float32", "float64")
        for half in ("float16", "bfloat16"):
            assert contract.tolerance(op_class, half).accum_dtype == "float32"
    for dtype in FLOAT_DTYPES:
        assert contract.tolerance("data_movement", dtype).exact
        assert (
            contract.tolerance("pointwise", dtype).rtol
            <= contract.tolerance("reduction", dtype).rtol
            <= contract.tolerance("model", dtype).rtol
        )


def test_torch_dtypes_and_names_map_to_rows() -> None:
    assert dtype_key(torch.float32) == "float32"
    assert dtype_key(torch.half) == "float16"
    assert dtype_key(torch.bfloat16) == "bfloat16"
    assert dtype_key(torch.int64) == dtype_key("int8") == "integer"
    assert dtype_key(torch.bool) == "bool"
    with pytest.raises(ContractError, match="complex64"):
        dtype_key(torch.complex64)
    with pytest.raises(ContractError, match="unknown op class"):
        load().tolerance("convolution", "float32")
    with pytest.raises(ContractError, match="no model factor for float64"):
        load().model_factor(torch.float64)


def test_contract_is_immutable() -> None:
    contract = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        contract.version = "9"  # type: ignore[misc]
    with pytest.raises(TypeError):
        contract.tolerances[("model", "float32")] = contract.tolerance("model", "float64")  # type: ignore[index]
    with pytest.raises(TypeError):
        contract.data["op"]["model"] = {}
    tol = contract.tolerance("model", "float32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        tol.rtol = 1.0  # type: ignore[misc]


def test_load_reads_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(plait.contract.default_text(), encoding="utf-8")
    assert load(path).tolerances == load().tolerances
    assert load(str(path)).source == str(path)


def _mutated(edit: Any) -> dict[str, Any]:
    data = copy.deepcopy(default_data())
    edit(data)
    return data


MALFORMED = {
    "unknown op class 'convolution'": lambda d: d["op"].update(convolution=d["op"]["conv"]),
    "missing dtype 'bfloat16'": lambda d: d["op"]["matmul"].pop("bfloat16"),
    "missing table \\[op.attention\\]": lambda d: d["op"].pop("attention"),
    "rtol must be finite and >= 0": lambda d: d["op"]["pointwise"]["float32"].update(rtol=-1e-6),
    "atol must be finite and >= 0": lambda d: d["op"]["reduction"]["float16"].update(
        atol=float("inf")
    ),
    "atol must be a number": lambda d: d["op"]["reduction"]["float16"].update(atol="1e-3"),
    "never narrower than bfloat16": lambda d: d["op"]["matmul"]["bfloat16"].update(
        accum="bfloat16"
    ),
    "do not round": lambda d: d["op"]["model"]["integer"].update(atol=1.0),
    "unknown field 'rtl'": lambda d: d["op"]["model"]["float32"].update(rtl=1.0),
    "nondeterministic must be true or false": lambda d: d["op"]["model"]["float32"].update(
        nondeterministic="no"
    ),
    "must be >= 1": lambda d: d["model"]["factor"].update(float32=0.5),
    "model.floor: missing dtype 'float16'": lambda d: d["model"]["floor"].pop("float16"),
    "model.factor: unknown dtype 'float8'": lambda d: d["model"]["factor"].update(float8=2.0),
    "schema_version must be": lambda d: d.update(schema_version=99),
    "has no \\[\\[changelog\\]\\] entry": lambda d: d.update(version="9.9.9"),
    "missing \\[\\[changelog\\]\\]": lambda d: d.pop("changelog"),
    "reason must be a non-empty string": lambda d: d["changelog"][0].update(reason=" "),
    "order_preserving must be true or false": lambda d: d["bitwise"].update(order_preserving=1),
    "gradcheck.eps must be finite and > 0": lambda d: d["gradcheck"].update(eps=0.0),
    "baseline_layouts: unknown layout 'nhwc'": lambda d: d["model"].update(
        baseline_layouts=["contiguous", "nhwc"]
    ),
    "baseline_layouts must be a list": lambda d: d["model"].update(baseline_layouts="contiguous"),
    "missing model.baseline_layouts": lambda d: d["model"].pop("baseline_layouts"),
    "model.tail_factor: missing dtype 'bfloat16'": lambda d: d["model"]["tail_factor"].pop(
        "bfloat16"
    ),
    "tail_factor.float32 must be >= model.factor.float32": lambda d: d["model"][
        "tail_factor"
    ].update(float32=1.5),
    "baseline_layouts: a layout is named twice": lambda d: d["model"].update(
        baseline_layouts=["channels_last", "channels_last"]
    ),
}


@pytest.mark.parametrize("message", list(MALFORMED), ids=list(range(len(MALFORMED))))
def test_malformed_contracts_are_rejected_with_the_key(message: str) -> None:
    with pytest.raises(ContractError, match=message):
        from_data(_mutated(MALFORMED[message]), source="broken.toml")


def test_invalid_toml_text_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="not valid TOML"):
        parse("schema_version = = 1")
    path = tmp_path / "bad.toml"
    # NOTE: a schema 1 file (factor on the worst error, no baseline layouts) is refused, never
    # reinterpreted under schema 2's meaning.
    path.write_text(
        plait.contract.default_text().replace("schema_version = 2", "schema_version = 1")
    )
    with pytest.raises(ContractError, match=f"{path}: schema_version must be 2"):
        load(path)


@pytest.mark.parametrize(
    "module", [plait.contract, plait.contract.model, plait.contract.history], ids=str
)
def test_docstring_examples_run(module: Any) -> None:
    failures, _ = doctest.testmod(module, verbose=False)
    assert failures == 0


# --- every malformed file is a ContractError naming the problem ---------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"schema_version = 1\n\xff\xfe = 2\n", "not UTF-8"),
        (b"x = " + b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        (b"x = " + b"{a = " * 5_000 + b"1" + b"}" * 5_000, "nested too deep"),
    ],
    ids=["not UTF-8", "nested arrays", "nested inline tables"],
)
def test_a_malformed_contract_file_is_a_contract_error(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "contract.toml"
    path.write_bytes(content)
    with pytest.raises(ContractError, match=problem) as caught:
        load(path)
    assert str(path) in str(caught.value)


def test_a_contract_path_that_is_not_a_regular_file_is_refused_without_reading(
    tmp_path: Path,
) -> None:
    import os

    fifo = tmp_path / "contract.toml"
    os.mkfifo(fifo)  # NOTE: a blocking open would wait for a writer forever
    with pytest.raises(ContractError, match="not a regular file"):
        load(fifo)
    with pytest.raises(ContractError, match="cannot be read"):
        load(tmp_path)
    with pytest.raises(ContractError, match="cannot be read"):
        load(tmp_path / "absent.toml")
