"""plait.export (L7): a compiled program as a portable, versioned artifact that loads without
the model's code and without pickle (docs/export.md specifies the format).

:func:`export` compiles a model or function with ``plait.compile``'s pipeline and returns an
:class:`Artifact` (``save(path)`` writes it: a zip archive of the program's IR text, its weights
in safetensors, its calling convention, guards, manifest, numerical contract, reference inputs
and outputs, and optionally its native kernels). :func:`load` returns a callable that runs it on
this machine's native backend, behind its guards. :func:`verify` judges it here against its
stored references through the conformance gate (``plait verify ARTIFACT`` on the command line).

Example:
    >>> import os, tempfile, torch, plait
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
    >>> artifact = plait.export(model, (torch.randn(2, 4),), native=False)
    >>> path = artifact.save(os.path.join(tempfile.mkdtemp(), "model.plait"))
    >>> loaded = plait.load(path)
    >>> x = torch.randn(2, 4)
    >>> with torch.no_grad():
    ...     torch.equal(loaded(x), plait.compile(model)(x))
    True
    >>> plait.verify(path).ok
    True
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from plait.export import exporting, loading, verifying
from plait.export.archive import FORMAT, VERSION, Limits
from plait.export.exporting import Artifact
from plait.export.loaded import LoadedProgram
from plait.export.verifying import Verification


def export(
    model_or_fn: Any,
    args: Any,
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic: bool | None = None,
    native: bool = True,
    references: int = 2,
) -> Artifact:
    """Compile ``model_or_fn(*args, **kwargs)`` as ``plait.compile`` does (``fullgraph``,
    gradients off: an inference program) and make it an :class:`Artifact`.

    ``dynamic``: as ``plait.compile``'s; the artifact runs on the backend ``plait.compile``
    chooses (Stax compiles symbolic shapes). A program ``plait.compile`` would run on plait's
    reference interpreter (CUDA tensors where Triton is not installed) is exported so, with an
    :class:`~plait.errors.ExportWarning`, recorded in the artifact (and warned again at each
    load). ``native``: carry the C++ kernel libraries, or a CUDA program's compiled Triton kernels
    and launchers (loaded only where the load trusts the artifact's digest; otherwise rebuilt
    from the IR). ``references``: how many reference cases (fresh random inputs) to store, at
    least (more where the gate needs them: an output of fewer than four elements, a 0-d loss,
    gives one error sample per case). Raises :class:`~plait.errors.ExportError` for a program
    that cannot be exported (an opaque call, an in-place write of an input or of
    state, an argument or result that is not a tensor or plain value), and
    :class:`~plait.conformance.ConformanceError` when the artifact fails the gate at export.

    Example:
        >>> import torch, plait
        >>> artifact = plait.export(lambda x, y: x @ y + 1, (torch.randn(2, 3), torch.randn(3, 4)))
        >>> len(artifact.semantic_hash), artifact.verdict.ok
        (64, True)
    """
    return exporting.export(
        model_or_fn, args, kwargs, dynamic=dynamic, native=native, references=references
    )


def load(
    path: str | Path,
    *,
    trust: str | Iterable[str] | None = None,
    limits: Limits | None = None,
) -> LoadedProgram:
    """Load the artifact at ``path``: a callable with the exported calling convention.

    Nothing from the file is unpickled or executed: every member is checked first (names,
    sizes, hashes, declared dtypes and shapes; see docs/export.md), and a malformed or
    malicious file raises an :class:`~plait.errors.ArtifactError` naming what is wrong. Native
    kernel libraries in the artifact are code: they are loaded only when ``trust`` names the
    artifact's digest (``"sha256:..."``, :attr:`Artifact.digest`) and this machine's toolchain
    (for Triton kernels: Triton version and GPU target) is theirs; otherwise the kernels are
    built here from the IR (``loaded.native`` and
    ``plait.explain(loaded)`` say which, and why). ``limits``: the sizes a load refuses.

    Example:
        >>> import os, tempfile, torch, plait
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh()).eval()
        >>> artifact = plait.export(model, (torch.randn(4, 3),))
        >>> path = artifact.save(os.path.join(tempfile.mkdtemp(), "model.plait"))
        >>> plait.load(path).native["status"]
        'rebuilt'
        >>> plait.load(path, trust=artifact.digest).native["status"]
        'loaded'
        >>> try:
        ...     plait.load(path)(torch.randn(5, 3))
        ... except plait.errors.CompiledInputError as exc:
        ...     print(str(exc).split("program: ")[1])
        input: f32[4, 3]: expected f32[4, 3] on cpu, got f32[5, 3] on cpu
    """
    return loading.load(path, trust=trust, limits=limits)


def verify(
    path: str | Path,
    *,
    trust: str | Iterable[str] | None = None,
    limits: Limits | None = None,
) -> Verification:
    """Run the artifact at ``path`` on this machine on its stored reference inputs and judge
    its outputs against its stored references under its stored contract, through the
    conformance gate. ``ok`` is the verdict; ``str()`` the report.

    Example:
        >>> import os, tempfile, torch, plait
        >>> artifact = plait.export(torch.nn.GELU(), (torch.randn(8),))
        >>> result = plait.verify(artifact.save(os.path.join(tempfile.mkdtemp(), "g.plait")))
        >>> result.ok, result.bitwise_as_exported
        (True, True)
    """
    return verifying.verify(path, trust=trust, limits=limits)


class _ExportModule(types.ModuleType):
    """NOTE: ``plait.export`` names both this package and the function: importing the package
    sets ``plait.export`` to the module, so the module calls :func:`export`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Artifact:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _ExportModule

__all__ = [
    "FORMAT",
    "VERSION",
    "Artifact",
    "Limits",
    "LoadedProgram",
    "Verification",
    "export",
    "load",
    "verify",
]
