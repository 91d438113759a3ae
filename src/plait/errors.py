"""plait's user-facing error and warning types.

DESIGN.md asks for distinct error types, never one for everything. The capture frontend raises
:class:`GraphCaptureError`; the compiled callable raises :class:`RecompileLimitError` and
:class:`CompiledInputError`.

Example:
    >>> from plait.errors import GraphCaptureError
    >>> err = GraphCaptureError("Tensor.item", "reads tensor data", filename="m.py", lineno=3)
    >>> str(err).splitlines()[0]
    'm.py:3: Tensor.item: reads tensor data'
"""

from __future__ import annotations


class GraphCaptureError(RuntimeError):
    """The program cannot be captured into one graph.

    ``operation`` names the torch-level call, ``reason`` says why, ``filename``/``lineno``/``code``
    locate the user's line that made the call, and ``kind`` is one of ``"data-dependent"``
    (a read of tensor data), ``"unsupported"`` (no table entry PyTorch could run as an opaque
    node) or ``"limitation"`` (a capture feature plait does not have).
    """

    def __init__(
        self,
        operation: str,
        reason: str,
        *,
        kind: str = "unsupported",
        filename: str | None = None,
        lineno: int | None = None,
        code: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.operation = operation
        self.reason = reason
        self.kind = kind
        self.filename = filename
        self.lineno = lineno
        self.code = code
        self.hint = hint
        where = f"{filename}:{lineno}: " if filename is not None else ""
        lines = [f"{where}{operation}: {reason}"]
        if code:
            lines.append(f"    {code}")
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))


class RecompileLimitError(RuntimeError):
    """A compiled callable was asked for more specializations than its recompile limit."""


class CompiledInputError(TypeError):
    """A compiled callable was called with inputs that do not fit how it was captured."""


class PlaitWarning(UserWarning):
    """Base class of plait's warnings."""


# --- export artifacts (plait.export) ----------------------------------------------------------
class ExportError(RuntimeError):
    """``plait.export`` refused a program: it cannot become a portable artifact (an opaque call,
    a write to its inputs or state, an argument or result that is not a tensor or plain scalar).
    Says what and why."""


class ArtifactError(ValueError):
    """An export artifact that ``plait.load`` or ``plait.verify`` refused, naming the member
    and what is wrong with it. Nothing from the file was executed."""


class ArtifactFormatError(ArtifactError):
    """A malformed or malicious artifact: not a zip archive, a truncated file, a member name
    that is absolute, climbs out (``..``) or is a symlink, a member that fails its recorded
    hash, a tensor whose dtype, shape or byte length disagrees with its declaration, a size past
    the load's limits, a program that names code (an opaque call)."""


class ArtifactVersionError(ArtifactError):
    """An artifact of a format version this plait does not read."""


class ArtifactTrustError(ArtifactError):
    """The artifact's digest is not the one the load was told to trust (``trust=``): its native
    kernels are never loaded."""


class ExportWarning(PlaitWarning):
    """An export or load ran degraded (the reference interpreter instead of native kernels,
    native kernels rebuilt instead of loaded); the artifact records why."""


class CaptureFallbackWarning(PlaitWarning):
    """Capture fell back: the program (or one call in it) runs eagerly in PyTorch."""


# --- the failure taxonomy (DESIGN.md): four distinct types, never one -------------------------
class PlaitCompileError(RuntimeError):
    """Compilation failed: a stage could not produce a program (codegen, build, an unsupported
    construct). Says which stage and why."""


class SemanticDriftError(RuntimeError):
    """A transformed graph broke an IR invariant or its identity: a pass (named in ``pass_name``)
    produced a graph the verifier rejects. This is a compiler bug, not a user error."""

    def __init__(self, pass_name: str, message: str, node_id: int | None = None) -> None:
        self.pass_name = pass_name
        self.node_id = node_id
        where = f" at node {node_id}" if node_id is not None else ""
        super().__init__(f"pass {pass_name!r} broke the IR{where}: {message}")


# NOTE: the third kind, numerics outside the contract, is plait.conformance.ConformanceError: it
# belongs to the independent gate, which imports nothing of the compiler (this module included).


class PerformanceRegressionError(RuntimeError):
    """A compile or run missed a declared budget (compile time, latency, memory)."""
