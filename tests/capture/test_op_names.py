"""Capture names torch calls as ``torch.overrides.resolve_name`` does: plait's index of public
names (:mod:`plait.frontend.op_names`) is PyTorch's own, on the running PyTorch, so that op
names (opaque nodes, in-place targets, messages) never depend on which index made them."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch.overrides import resolve_name

from plait.frontend.op_names import op_name, public_name

COMPARE = """
from torch.overrides import get_overridable_functions, resolve_name
from plait.frontend.op_names import name_index, public_name
ours = name_index()
assert ours == {f: resolve_name(f) for f in ours}
for funcs in get_overridable_functions().values():
    for f in funcs:
        assert public_name(f) == resolve_name(f), f
print(len(ours))
"""


def test_the_index_is_pytorchs_index_of_names() -> None:
    """In a process of its own: both indexes are built once per process, and a test that
    patches a torch namespace (``torch.Tensor.tanh = ...``) would show in whichever is built
    while it runs."""
    proc = subprocess.run(
        [sys.executable, "-c", COMPARE], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 1000


def test_names_of_calls_a_capture_sees() -> None:
    cases = [
        (torch.add, "torch.add"),
        (torch.Tensor.add, "torch.Tensor.add"),
        (torch.nn.functional.relu, "torch.nn.functional.relu"),
        (torch.Tensor.shape.__get__, "torch.Tensor.shape.__get__"),
        (torch.ops.aten.add.Tensor, "aten.add.Tensor"),
    ]
    for func, name in cases:
        assert public_name(func) == resolve_name(func) == name
    assert op_name(torch.nn.functional.relu) == "nn.functional.relu"
    assert op_name(torch.Tensor.shape.__get__) == "Tensor.shape"


def test_a_callable_torch_does_not_name_keeps_its_qualified_name() -> None:
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert public_name(scaled) is None
    assert op_name(scaled) == scaled.__qualname__
