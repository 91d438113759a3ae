"""Value types of the IR: tensors (shape, dtype, device), Python scalars, and None.

A dim is an ``int`` or a sympy expression (see :mod:`plait.symbolic`). Types are immutable and
hashable; two types are equal when their text forms are equal.

Example:
    >>> import torch
    >>> from plait.ir.types import TensorType
    >>> t = TensorType((4, 8), torch.float32)
    >>> str(t)
    'f32[4, 8]'
    >>> t.numel
    32
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TypeAlias

import sympy
import torch

from plait.ir.errors import IRTypeError, IRValueError
from plait.symbolic import Dim, dim_to_text, normalize, product

# NOTE: the short names are the text format's spelling; the table is the closed dtype vocabulary.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
    torch.complex128: "c128",
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}

FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# NOTE: complex values flow only through ops that compute them as eager does (PyTorch's own
# kernels: ``aten`` extern nodes, opaque nodes) and through pure data movement; see
# :data:`plait.ir.ops.registry.COMPLEX_OPS`.
COMPLEX_DTYPES = (torch.complex64, torch.complex128)


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise IRTypeError(
            f"dtype {dtype} is not supported by plait's IR; supported: "
            f"{', '.join(str(d) for d in DTYPE_NAMES)}"
        ) from None


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES


def is_complex(dtype: torch.dtype) -> bool:
    return dtype in COMPLEX_DTYPES


@functools.lru_cache(maxsize=64)
def canonical_device(device: str | torch.device) -> str:
    """``'cpu'`` or ``'cuda:N'``: one spelling per device."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else 0}"
    if dev.type in ("cpu", "meta"):
        return dev.type
    raise IRTypeError(f"device {dev} is not supported by plait's IR (cpu, cuda:N)")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: torch.dtype
    device: str = "cpu"

    def __post_init__(self) -> None:
        shape = self.shape
        # NOTE: static shapes (the common case) need no normalizing: plain ints stay as they are
        if type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape):
            shape = tuple(normalize(d) for d in shape)
            for d in shape:
                if isinstance(d, int) and d < 0:
                    raise IRValueError(f"negative dimension {d} in shape {shape}")
        object.__setattr__(self, "shape", shape)
        dtype_name(self.dtype)
        object.__setattr__(self, "device", canonical_device(self.device))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return product(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype, self.device)

    def with_dtype(self, dtype: torch.dtype) -> TensorType:
        return TensorType(self.shape, dtype, self.device)

    def __str__(self) -> str:
        dims = ", ".join(dim_to_text(d) for d in self.shape)
        dev = "" if self.device == "cpu" else f"@{self.device}"
        return f"{dtype_name(self.dtype)}[{dims}]{dev}"

    @staticmethod
    def of(t: torch.Tensor) -> TensorType:
        """The type of a concrete tensor (static shape)."""
        return TensorType(tuple(int(s) for s in t.shape), t.dtype, str(t.device))


SCALAR_KINDS = ("int", "float", "bool")


@dataclass(frozen=True)
class ScalarType:
    """A Python scalar value: ``int``, ``float`` or ``bool``."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in SCALAR_KINDS:
            raise IRValueError(f"scalar kind must be one of {SCALAR_KINDS}, got {self.kind!r}")

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class NoneType:
    def __str__(self) -> str:
        return "none"


Type: TypeAlias = TensorType | ScalarType | NoneType


def scalar_type_of(value: object) -> ScalarType:
    """The type of a literal operand; a sympy expression is a symbolic ``int``."""
    if isinstance(value, bool):
        return ScalarType("bool")
    if isinstance(value, int):
        return ScalarType("int")
    if isinstance(value, float):
        return ScalarType("float")
    if isinstance(value, sympy.Expr) and value.is_integer:
        return ScalarType("int")
    raise IRTypeError(f"not a scalar: {value!r}")
