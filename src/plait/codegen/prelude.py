"""The C++ prelude every translation unit starts with (``csrc/prelude.h``, package data): 16-bit
float conversions (bitwise as PyTorch's), NaN-propagating min/max, PyTorch's integer and floor
division, integer power, and the math functions, declared ``omp declare simd`` so loops calling them
vectorize through glibc's vector math library (libmvec) when it is present. The one thing filled in
here: the math functions' declarations, generated from the lists below, at the header's
``@PLAIT_MATH_DECLS@`` line. Kernel cache keys hash the filled-in text, so an edit of the header
rebuilds them.

NOTE: no C++ standard headers: they would cost more compile time than the kernels themselves.

Example:
    >>> "bf16_store" in PRELUDE
    True
"""

from importlib import resources

from plait.errors import InternalCompilerError

# NOTE: glibc's libmvec has vector versions of all of these (since 2.35, like tanh and erf).
_UNARY_LIBM = ("exp", "log", "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
               "cosh", "asinh", "acosh", "atanh", "expm1", "log1p", "log2", "log10", "exp2",
               "erfc")  # fmt: skip
_BINARY_LIBM = ("pow", "atan2", "hypot")
_MATH_DECLS = tuple(
    f"{t} {name}{suffix}({', '.join([t] * arity)})"
    for t, suffix in (("float", "f"), ("double", ""))
    for names, arity in ((_UNARY_LIBM, 1), (_BINARY_LIBM, 2))
    for name in names
)
_SIMD = "#if PLAIT_LIBMVEC\n#pragma omp declare simd notinbranch\n#endif\n"
_DECLS = 'extern "C" {\n' + "".join(f"{_SIMD}{d};\n" for d in _MATH_DECLS) + "}\n"

_MARK = "// @PLAIT_MATH_DECLS@: plait.codegen.prelude puts the libm declarations here\n"


def source() -> str:
    """The prelude's source as shipped (``csrc/prelude.h``), before the declarations go in."""
    return resources.files("plait.codegen").joinpath("csrc", "prelude.h").read_text()


def _fill(text: str) -> str:
    if text.count(_MARK) != 1:
        raise InternalCompilerError("csrc/prelude.h lost its @PLAIT_MATH_DECLS@ line")
    return text.replace(_MARK, _DECLS)


PRELUDE = _fill(source())
