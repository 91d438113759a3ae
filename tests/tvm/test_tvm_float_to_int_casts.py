"""Float to integer casts in TVM kernels give eager's integers for every float, as the C++
kernels do (tests/codegen/test_float_to_int_casts.py): PyTorch's CPU casts take int8, int16
and int32 through a 32-bit conversion and uint8 and int64 through a 64-bit one, and NaN,
infinities and values out of the wide type's range give what the machine's conversion gives (on
x86 the lowest integer). LLVM's conversion of such a value is undefined (poison): the kernels
write the machine's answer out. Integers are exact under the contract: ``torch.equal``.
"""

from __future__ import annotations

import pytest
import torch

from tests.codegen.test_float_to_int_casts import INTS, SOURCES, _check


@pytest.mark.parametrize("source", SOURCES, ids=str)
@pytest.mark.parametrize("target", INTS, ids=str)
def test_tvm_cast_matches_eager(source: torch.dtype, target: torch.dtype) -> None:
    compiled = _check(lambda x: (x * 1).to(target), source, backend="tvm")
    kernels = compiled.specializations[-1].manifest.executor
    assert "tvm" in str(kernels), kernels
