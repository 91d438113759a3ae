"""Codegen's error type: a graph, or a node of it, that the Stax backend cannot compile.

Example:
    >>> err = CodegenError("opaque call to torch.fliplr", node_id=3, op="opaque")
    >>> str(err)
    'node 3 (opaque): opaque call to torch.fliplr'
"""

from __future__ import annotations

from plait.errors import PlaitCompileError


class CodegenError(PlaitCompileError):
    """Compilation to native code failed, or (strict mode) a node would fall back to PyTorch.

    ``node_id`` and ``op`` name the node when one is to blame.
    """

    error_code = "PLAIT-C110"

    def __init__(self, reason: str, *, node_id: int | None = None, op: str | None = None) -> None:
        self.reason = reason
        self.node_id = node_id
        self.op = op
        where = f"node {node_id} ({op}): " if node_id is not None else ""
        super().__init__(f"{where}{reason}")


class BuildError(CodegenError):
    """The C++ compiler rejected generated code (a bug in plait: the log is attached)."""

    error_code = "PLAIT-C111"
