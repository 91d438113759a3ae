"""plait's user-facing error and warning types, and the failure taxonomy.

The design (docs/architecture.md) asks for distinct error types, never one for everything.
Every plait error belongs to one of four categories, and carries a stable code
(``error.error_code``; docs/errors.md lists each with its cause and what to do):

- ``compile`` (``PLAIT-C...``): capture or compilation failed; :class:`PlaitCompileError` and its
  subclasses (:class:`GraphCaptureError`, :class:`RecompileLimitError`, :class:`CompiledInputError`,
  codegen's and autograd's errors, :class:`ExportError`), and the artifact refusals.
- ``semantic-drift`` (``PLAIT-D...``): a transformed graph broke an IR invariant or its identity;
  :class:`SemanticDriftError`.
- ``numerics`` (``PLAIT-N...``): values outside the numerical contract; :class:`NumericsError`
  (a diagnosis), and the gate's own ``plait.conformance.ConformanceError`` (the gate imports
  nothing of the compiler, this module included: it is classified here by name).
- ``performance`` (``PLAIT-P...``): a declared budget missed; :class:`PerformanceRegressionError`.

:func:`code_of` classifies any exception, plait's or not (None: not a plait failure).

Example:
    >>> from plait.errors import GraphCaptureError, code_of
    >>> err = GraphCaptureError("Tensor.item", "reads tensor data", filename="m.py", lineno=3)
    >>> str(err).splitlines()[0]
    'm.py:3: Tensor.item: reads tensor data'
    >>> err.error_code, err.category, code_of(err).title
    ('PLAIT-C101', 'compile', 'the program cannot be captured')
"""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("compile", "semantic-drift", "numerics", "performance")


@dataclass(frozen=True)
class ErrorCode:
    """One stable code of the taxonomy: its category, a title, what causes it, what to do."""

    code: str
    category: str
    title: str
    cause: str
    action: str


class PlaitError(Exception):
    """The base of plait's errors: ``error_code`` (stable, ``PLAIT-<letter><number>``) and
    ``category`` (one of :data:`CATEGORIES`)."""

    error_code = ""
    category = ""


# --- the four taxonomy types: never one for everything -------------------------------------
class PlaitCompileError(PlaitError, RuntimeError):
    """Compilation failed: a stage could not produce a program (codegen, build, an unsupported
    construct). Says which stage and why."""

    error_code, category = "PLAIT-C100", "compile"


class SemanticDriftError(PlaitError, RuntimeError):
    """A transformed graph broke an IR invariant or its identity: a pass (named in ``pass_name``)
    produced a graph the verifier rejects. This is a compiler bug, not a user error."""

    error_code, category = "PLAIT-D200", "semantic-drift"

    def __init__(self, pass_name: str, message: str, node_id: int | None = None) -> None:
        self.pass_name = pass_name
        self.node_id = node_id
        where = f" at node {node_id}" if node_id is not None else ""
        super().__init__(f"pass {pass_name!r} broke the IR{where}: {message}")


class NumericsError(PlaitError, AssertionError):
    """A compiled program computes values outside the numerical contract, as a diagnosis found
    (``plait.diagnose``: ``diagnosis`` holds it, with the stage, pass and node). The gate's own
    verdict is ``plait.conformance.ConformanceError`` (code ``PLAIT-N301``)."""

    error_code, category = "PLAIT-N300", "numerics"

    def __init__(self, message: str, diagnosis: object = None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


class PerformanceRegressionError(PlaitError, RuntimeError):
    """A compile or run missed a declared budget (compile time, latency, memory):
    ``options={"budgets": {...}}`` with ``on_miss="raise"`` (:mod:`plait.cost.budgets`)."""

    error_code, category = "PLAIT-P400", "performance"


# --- compile failures ------------------------------------------------------------------------
class GraphCaptureError(PlaitCompileError):
    """The program cannot be captured into one graph.

    ``operation`` names the torch-level call, ``reason`` says why, ``filename``/``lineno``/``code``
    locate the user's line that made the call, and ``kind`` is one of ``"data-dependent"``
    (a read of tensor data), ``"unsupported"`` (no table entry PyTorch could run as an opaque
    node) or ``"limitation"`` (a capture feature plait does not have).
    """

    error_code = "PLAIT-C101"

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


class RecompileLimitError(PlaitCompileError):
    """A compiled callable was asked for more specializations than its recompile limit."""

    error_code = "PLAIT-C102"


class CompiledInputError(PlaitCompileError, TypeError):
    """A compiled callable was called with inputs that do not fit how it was captured."""

    error_code = "PLAIT-C103"


class ProgramError(PlaitCompileError):
    """The captured program fails as it would in eager PyTorch (an index out of range, an
    in-place write to a leaf that requires grad): the user's program is wrong, and plait says
    so with PyTorch's words and Python base class. The refinements keep eager's base."""

    error_code = "PLAIT-C105"


class ProgramIndexError(ProgramError, IndexError):
    """:class:`ProgramError` where eager PyTorch raises an ``IndexError``."""


class ProgramTypeError(ProgramError, TypeError):
    """:class:`ProgramError` where eager PyTorch raises a ``TypeError``."""


class ProgramValueError(ProgramError, ValueError):
    """:class:`ProgramError` where eager PyTorch raises a ``ValueError``."""


class NativeUnavailableError(PlaitCompileError):
    """A native component (the guard evaluator, the hash, prepacked weights) is disabled or
    could not be built: plait runs its Python path instead, and says why."""

    error_code = "PLAIT-C112"


class MissingDependencyError(PlaitCompileError, ImportError):
    """An optional library a requested feature needs is not installed (the Redis client for a
    ``redis://`` cache); the message says what to install."""

    error_code = "PLAIT-C113"


class StoreFormatError(PlaitCompileError, ValueError):
    """A file or entry plait stored or reads back (a manifest, a repro directory, a cache
    entry, prepacked weights) is not in plait's format; the message says what is wrong."""

    error_code = "PLAIT-C144"


class NotSavableError(PlaitCompileError, ValueError):
    """A compiled program reads something with no process-independent form (an object of this
    process only): it is compiled and run, but not saved to the cache."""

    error_code = "PLAIT-C145"


class InvalidOptionError(PlaitCompileError, ValueError):
    """An invalid option or argument value to a plait API (``options=``, ``dynamic=``, a
    budget, a log channel); the message names it and what it takes."""

    error_code = "PLAIT-C170"


class InvalidArgumentTypeError(PlaitCompileError, TypeError):
    """An option or argument of a wrong type to a plait API; the message names it."""

    error_code = "PLAIT-C171"


class UnknownNameError(PlaitCompileError, LookupError):
    """A lookup of a name or entry plait does not know (a pass, a partitioner, a stored result,
    a module a warm start reads); the message names it and, where there are few, the known
    ones. ``str()`` is the message (a ``KeyError`` would quote it)."""

    error_code = "PLAIT-C172"


class UnknownKeyError(UnknownNameError, KeyError):
    """:class:`UnknownNameError` where plait always raised a ``KeyError`` (its ``str()`` keeps
    ``KeyError``'s quotes)."""


class InternalCompilerError(PlaitCompileError, AssertionError):
    """An internal invariant of the compiler broke outside the IR (a printer without a case, a
    plan that disagrees with itself): a plait bug, never a user error. The message says to
    report it. (An IR invariant broken by a pass is a :class:`SemanticDriftError`.)"""

    error_code = "PLAIT-C190"
    REPORT = " (an internal error of plait: please report it, with a repro from plait diagnose)"

    def __init__(self, message: object = "") -> None:
        text = str(message)  # NOTE: an unpickled error arrives with the note already on it
        super().__init__(text if text.endswith(self.REPORT) else f"{text}{self.REPORT}")


class InternalValueError(InternalCompilerError, ValueError):
    """:class:`InternalCompilerError` where plait always raised a ``ValueError``."""


class PlaitWarning(UserWarning):
    """Base class of plait's warnings."""


# --- export artifacts (plait.export) ----------------------------------------------------------
class ExportError(PlaitCompileError):
    """``plait.export`` refused a program: it cannot become a portable artifact (an opaque call,
    a write to its inputs or state, an argument or result that is not a tensor or plain scalar).
    Says what and why."""

    error_code = "PLAIT-C130"


class ArtifactError(PlaitError, ValueError):
    """An export artifact that ``plait.load`` or ``plait.verify`` refused, naming the member
    and what is wrong with it. Nothing from the file was executed."""

    error_code, category = "PLAIT-C140", "compile"


class ArtifactFormatError(ArtifactError):
    """A malformed or malicious artifact: not a zip archive, a truncated file, a member name
    that is absolute, climbs out (``..``) or is a symlink, a member that fails its recorded
    hash, a tensor whose dtype, shape or byte length disagrees with its declaration, a size past
    the load's limits, a program that names code (an opaque call)."""

    error_code = "PLAIT-C141"


class ArtifactVersionError(ArtifactError):
    """An artifact of a format version this plait does not read."""

    error_code = "PLAIT-C142"


class ArtifactTrustError(ArtifactError):
    """The artifact's digest is not the one the load was told to trust (``trust=``): its native
    kernels are never loaded."""

    error_code = "PLAIT-C143"


class ExportWarning(PlaitWarning):
    """An export or load ran degraded (the reference interpreter instead of native kernels,
    native kernels rebuilt instead of loaded); the artifact records why."""


class PerformanceWarning(PlaitWarning):
    """A compile missed a declared budget (``options={"budgets": {...}}``, the default
    ``on_miss="warn"``): code ``PLAIT-P400``, a warning instead of an error."""

    error_code = "PLAIT-P400"


class CaptureFallbackWarning(PlaitWarning):
    """Capture fell back: the program (or one call in it) runs eagerly in PyTorch."""


class ClockReadWarning(PlaitWarning):
    """The captured program read the clock (``time.perf_counter()``, ``datetime.now()``): a
    value computed from that reading is fixed in the compiled program, where eager reads the
    clock again on every call. Pass the reading as an argument if a result depends on it."""


# --- the codes -----------------------------------------------------------------------------
def _code(code: str, category: str, title: str, cause: str, action: str) -> ErrorCode:
    return ErrorCode(code, category, title, cause, action)


CODES: dict[str, ErrorCode] = {
    c.code: c
    for c in (
        _code("PLAIT-C100", "compile", "a compile stage could not produce a program",
              "a backend or stage refused the graph (the message names the stage and why)",
              "read the cause; compile with backend='eager' to run the captured graph, or report "
              "it with plait diagnose"),
        _code("PLAIT-C101", "compile", "the program cannot be captured",
              "a read of tensor data (item, bool, tolist), a torch call with no IR op under "
              "fullgraph=True, or a capture limitation; the message names the file and line",
              "move the data-dependent part out of the compiled function, or compile with "
              "fullgraph=False (it runs eagerly, warned and recorded)"),
        _code("PLAIT-C102", "compile", "the recompile limit was reached",
              "calls kept missing every specialization's guards (changing shapes or settings)",
              "raise options={'recompile_limit': n}, use dynamic=True for varying sizes, or "
              "options={'on_recompile_limit': 'eager'}; plait.explain says which guard failed"),
        _code("PLAIT-C103", "compile", "a call does not fit how the program was captured",
              "an argument of another kind (a tensor where a number was captured), structure "
              "or signature than the captured call",
              "call the compiled callable as the original was called when it was captured"),
        _code("PLAIT-C104", "compile", "a Stax program got an input of another type",
              "a tensor of another dtype, shape or device than the graph's input type",
              "call the program with the graph's input types (the message names the input)"),
        _code("PLAIT-C105", "compile", "the program fails as it would in eager PyTorch",
              "the program itself is wrong (an index out of range, a step of zero, an in-place "
              "write to a leaf that requires grad); capture raises what eager would",
              "fix the program: run it eagerly to see the same error"),
        _code("PLAIT-C112", "compile", "a native component is unavailable",
              "disabled by its environment variable (PLAIT_NATIVE_GUARDS=0, PLAIT_NATIVE_HASH=0) "
              "or its build failed",
              "nothing: plait runs its Python path; unset the variable or fix the toolchain "
              "(plait explain says why) for the native speed"),
        _code("PLAIT-C113", "compile", "an optional dependency is not installed",
              "a feature was asked for whose library is optional (the redis client for a "
              "redis:// cache)",
              "install what the message names (pip install redis), or do not ask for the "
              "feature"),
        _code("PLAIT-C110", "compile", "the Stax backend cannot compile the graph",
              "symbolic shapes or devices it does not take, or a node that would fall back to "
              "PyTorch under strict (fullgraph=True)",
              "compile with fullgraph=False (the node runs in PyTorch, recorded as a fallback) "
              "or backend='eager'"),
        _code("PLAIT-C111", "compile", "the C++ compiler rejected generated code",
              "a bug in plait's code generator (the compiler's log is attached)",
              "report it with the log and a repro (plait diagnose)"),
        _code("PLAIT-C120", "compile", "the backward graph could not be built",
              "an op with no derivative rule, or a graph autograd cannot differentiate",
              "compile with fullgraph=False (the backward runs in eager autograd, recorded)"),
        _code("PLAIT-C121", "compile", "the joint graph could not be partitioned",
              "the partitioner found no forward/backward split for what the backward reads",
              "options={'partitioner': ...} another partitioner, or fullgraph=False"),
        _code("PLAIT-C122", "compile", "a compiled backward was differentiated again",
              "double backward through a compiled program (create_graph=True)",
              "compute higher derivatives eagerly, or compile the function that does"),
        _code("PLAIT-C123", "compile", "a compiled backward's saved values were released",
              "a second backward through a CUDA-graphed step without retain_graph=True, or "
              "saved values of two forward calls given to one backward",
              "call backward with retain_graph=True to run it again"),
        _code("PLAIT-C130", "compile", "the program cannot be exported",
              "an opaque call, a write to inputs or state, or an argument that is not a tensor "
              "or plain scalar",
              "export the part without it; the message names what is refused"),
        _code("PLAIT-C140", "compile", "an artifact was refused",
              "plait.load or plait.verify refused a member of the artifact",
              "rebuild the artifact with plait.export; nothing from the file was executed"),
        _code("PLAIT-C141", "compile", "a malformed or malicious artifact",
              "not a zip archive, a member that climbs out or fails its hash, a tensor that "
              "disagrees with its declaration, a size past the limits, a program naming code",
              "do not use the file; export the program again from its source"),
        _code("PLAIT-C142", "compile", "an artifact of an unknown format version",
              "the artifact was written by a plait whose format this one does not read",
              "load it with a matching plait, or export it again"),
        _code("PLAIT-C143", "compile", "an artifact that is not the trusted one",
              "its digest differs from the one the load was told to trust",
              "check where the file came from; its native kernels are never loaded"),
        _code("PLAIT-C144", "compile", "a stored file is not in plait's format",
              "a manifest, repro directory, cache entry or prepacked weight blob that is "
              "malformed, truncated or of another schema",
              "delete the file (a cache entry is recompiled) or write it again with this plait"),
        _code("PLAIT-C145", "compile", "a program has no saved form",
              "it reads an object of this process only (a repr with an address, an unnamed "
              "value): it runs, but is not saved to the cache",
              "nothing for correctness; for warm starts, read module-level names or pass the "
              "value as an argument"),
        _code("PLAIT-C146", "compile", "a private directory is not private",
              "a directory plait keeps trusted files in (the cache, the kernel cache) is not "
              "owned by this user, is a symlink or is writable by others",
              "do what the message says (chmod 700 it, or point PLAIT_CACHE_DIR elsewhere)"),
        _code("PLAIT-C147", "compile", "a cache's index lock was held too long",
              "another process held the cache's index.lock past the bound (stopped with "
              "Ctrl-Z, paused in a debugger, or hung)",
              "end or resume that process; the compile meanwhile goes on without the cache"),
        _code("PLAIT-C150", "compile", "an op's type rule refused its operands",
              "a graph built by hand (or by a pass) with operand types or attributes the op "
              "does not take",
              "fix the operands or attributes the message names"),
        _code("PLAIT-C151", "compile", "an op attribute is missing, unknown or of a wrong kind",
              "a node built with attributes its op does not declare",
              "use the attributes the op declares (plait.ir.get_op(name).attrs)"),
        _code("PLAIT-C152", "compile", "IR text that does not parse",
              "a malformed graph text (a golden file, an export, a repro)",
              "fix the line the message names"),
        _code("PLAIT-C153", "compile", "the interpreter got inputs of other types",
              "inputs that do not match the graph's input types, or a node whose result "
              "disagrees with its declared type",
              "pass the graph's input types; a node disagreeing with its type is a plait bug"),
        _code("PLAIT-C154", "compile", "a symbolic size used where a number is needed",
              "a branch on, or a value of, a size that dynamic=True left symbolic, or a "
              "malformed dimension expression",
              "mark that dim static (dynamic={...} without it), or use torch ops on the size"),
        _code("PLAIT-C160", "compile", "a pinned call its specialization does not admit",
              "call_specialization with arguments the specialization's guards refuse",
              "use the specialization the call's guards select (specialize)"),
        _code("PLAIT-C170", "compile", "an invalid option or argument",
              "an option, argument or setting value a plait API does not take (options=, "
              "dynamic=, budgets, log channels, progress modes)",
              "use a value the message lists (docs/options.md lists the options)"),
        _code("PLAIT-C171", "compile", "an option or argument of a wrong type",
              "a plait API was passed a value of another type than it takes",
              "pass the type the message names"),
        _code("PLAIT-C172", "compile", "an unknown name or entry",
              "a pass, partitioner, log channel or stored result that is not registered or "
              "not there, or a module a warm start reads that is not loaded",
              "use a name the message lists; register or import what defines it first"),
        _code("PLAIT-C190", "compile", "an internal error of plait",
              "an internal invariant of the compiler broke outside the IR: a plait bug",
              "report it with the message and a repro (plait diagnose); compile with "
              "backend='eager' meanwhile"),
        _code("PLAIT-D200", "semantic-drift", "a pass broke the IR",
              "a pass produced a graph the verifier rejects (SSA, types, attributes)",
              "a compiler bug: plait diagnose names the pass and node and writes a repro; "
              "remove that pass from options={'passes': ...} meanwhile"),
        _code("PLAIT-D201", "semantic-drift", "a graph the verifier rejects",
              "a graph built or parsed outside the PassManager breaks an IR invariant",
              "fix the node the message names"),
        _code("PLAIT-N300", "numerics", "a diagnosis found values outside the contract",
              "plait.diagnose found the first pass or backend node whose values leave the "
              "numerical contract",
              "a compiler bug: keep the repro directory it wrote, report it, and compile "
              "without the pass (options={'passes': ...}) or with backend='eager' meanwhile"),
        _code("PLAIT-N301", "numerics", "the conformance gate failed",
              "plait.conformance.check judged outputs, state or gradients outside the contract",
              "run plait diagnose on the same program and inputs: it bisects to the pass and "
              "node and writes a repro"),
        _code("PLAIT-N302", "numerics", "the numerical contract file is invalid",
              "a contract that does not parse, or a tolerance widened without a changelog entry",
              "fix the contract file the message names"),
        _code("PLAIT-P400", "performance", "a declared budget was missed",
              "a compile stage, a run or memory use went past its budget",
              "raise the budget in options, or make it a warning; the message says by how much"),
    )
}  # fmt: skip

# NOTE: error types plait.errors cannot be a base of (the IR and the gate import nothing of it;
# others keep their own base), classified by their qualified name
_BY_NAME = {
    "plait.ir.ops.registry.TypeRuleError": "PLAIT-C150",
    "plait.ir.ops.registry.AttrError": "PLAIT-C151",
    "plait.ir.parser.IRParseError": "PLAIT-C152",
    "plait.ir.interpret.InterpretError": "PLAIT-C153",
    "plait.specialization.SpecializationMissError": "PLAIT-C160",
    "plait.symbolic.dims.DimParseError": "PLAIT-C154",
    "plait.symbolic.dims.SymbolicSizeError": "PLAIT-C154",
    "plait.symbolic.dims.SymbolicValueError": "PLAIT-C154",
    "plait.logs.LogChannelError": "PLAIT-C170",
    "plait.progress.ProgressModeError": "PLAIT-C170",
    "plait.ir.verify.VerificationError": "PLAIT-D201",
    "plait.ir.errors.IRValueError": "PLAIT-C170",
    "plait.ir.errors.IRTypeError": "PLAIT-C171",
    "plait.ir.errors.IRKeyError": "PLAIT-C172",
    "plait.ir.errors.StoredFileError": "PLAIT-C144",
    "plait.ir.errors.NotRegularFileError": "PLAIT-C144",
    "plait.ir.persist.GraphDocError": "PLAIT-C144",
    "plait.ir.private_files.UnsafeDirectoryError": "PLAIT-C146",
    "plait.cache.store.IndexLockTimeout": "PLAIT-C147",
    "plait.ir.ops.vjp.NoDerivativeError": "PLAIT-C120",
    "plait.conformance.report.ConformanceError": "PLAIT-N301",
    "plait.contract.model.ContractError": "PLAIT-N302",
}


def code_of(error: BaseException) -> ErrorCode | None:
    """The taxonomy's code for ``error`` (its ``error_code``, or its type's by name); None for an
    exception that is not a plait failure.

    Example:
        >>> code_of(SemanticDriftError("cse", "value %3 is defined twice")).category
        'semantic-drift'
        >>> code_of(KeyError("x")) is None
        True
    """
    for cls in type(error).__mro__:
        code = cls.__dict__.get("error_code") if issubclass(cls, PlaitError) else None
        if code:
            return CODES[code]
        name = _BY_NAME.get(f"{cls.__module__}.{cls.__qualname__}")
        if name is not None:
            return CODES[name]
    return None
