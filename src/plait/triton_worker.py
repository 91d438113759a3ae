"""A Triton compile worker: a process that compiles plait's printed Triton kernels into Triton's
on-disk cache, for :mod:`plait.codegen.triton_pool`.

Triton's front end (the kernel's Python AST walked into MLIR) holds the GIL, so kernels compiled
on threads of one process mostly take turns; in worker processes they compile side by side. A
worker compiles and writes the cache; the compiling process then loads each kernel from that
cache, under the key it computes itself (the pool compares the two).

The worker is started as ``python -m plait.triton_worker BACKEND ARCH WARP_SIZE`` (the target it
compiles for, warmed up at its start: a process's first compile costs about half a second
more), imports Triton and the standard library only, never initializes CUDA, and speaks over
its standard input and output: each request and each reply a pickled dict after its 8-byte
length. A request::

    {"path": module file, "module": module name, "symbol": kernel name,
     "signature", "constants", "attrs": the kernel's, as Triton's ASTSource takes them,
     "options": Triton's compile options, "env_vars": the compiling process's
     cache-affecting environment (its key has them), "target": [backend, arch, warp size],
     "env": {Triton's environment variables for this compile},
     "launcher": whether to build the kernel's launcher too (default true; it needs libcuda)}

is answered ``{"hash": key, "compile_s": s, "launcher_s": s}`` (Triton's cache key of the
kernel it compiled, the seconds of the compile and of the launcher's build; a launcher that
failed adds ``launcher_error``) or ``{"error": text}``. An empty request (length 0) ends the worker.

Example (the framing):
    >>> import io
    >>> buf = io.BytesIO()
    >>> write_message(buf, {"hash": "ab"})
    >>> _ = buf.seek(0)
    >>> read_message(buf)
    {'hash': 'ab'}
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import struct
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

_HEADER = struct.Struct("<Q")
ENV_PREFIX = "TRITON_"  # NOTE: every Triton knob reads a variable of this prefix


def write_message(stream: IO[bytes], message: dict[str, Any] | None) -> None:
    """``message`` pickled after its length (``None``: the empty message that ends a worker)."""
    data = b"" if message is None else pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next message, or ``None`` for the empty one (or a stream that ended, in a message
    or between two: the other side is gone)."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    data = stream.read(size) if size else b""
    if size == 0 or len(data) < size:
        return None
    return pickle.loads(data)


def _set_env(env: dict[str, str]) -> None:
    """This compile's Triton variables exactly: set those given, drop the others."""
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        if name not in env:
            del os.environ[name]
    os.environ.update(env)


def load_module(path: str, name: str, math: Any) -> ModuleType:
    """The kernel module file ``path`` imported as ``name``, its global ``M`` bound to ``math``
    (libdevice, or the interpreter's shim) before it runs; registered in ``sys.modules`` first:
    Triton's jit reads a function's module for its source."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.M = math  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _kernel(path: str, module_name: str, symbol: str) -> Any:
    """The kernel from its module file, the module bound to the name (and ``M``, libdevice) it
    has in the compiling process: Triton's key hashes the function's source and globals."""
    module = sys.modules.get(module_name)
    if module is None:
        from triton.language.extra.cuda import libdevice

        module = load_module(path, module_name, libdevice)
    return getattr(module, symbol)


class _TargetOnly:
    """Triton's driver as far as a compile from specialization data asks it: the device and its
    target, given, so the worker never touches the GPU."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


# NOTE: the launcher's build reads these of the kernel's metadata after building its module; a
# launcher built ahead of the compile is only for its module in the cache (Triton keys it by
# the C source, which depends on the signature alone): the real one is built after the compile
_LAUNCH_METADATA = {
    "tensordesc_meta": None,
    "num_ctas": 1,
    "global_scratch_size": 0,
    "global_scratch_align": 1,
    "profile_scratch_size": 0,
    "profile_scratch_align": 1,
    "launch_cooperative_grid": False,
    "launch_pdl": False,
}


def _launcher_ahead(fn: Any, signature: dict[str, Any]) -> threading.Thread:
    """Build the kernel's launcher module on a thread while the kernel compiles (the C compiler
    runs as a subprocess: the GIL is free meanwhile). Failing, it leaves the build to after the
    compile."""
    from types import SimpleNamespace

    from triton.backends.nvidia.driver import CudaLauncher

    def build() -> None:
        with contextlib.suppress(Exception):
            src = SimpleNamespace(constants={}, signature=signature, fn=fn)
            CudaLauncher(src, SimpleNamespace(**_LAUNCH_METADATA))

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    return thread


def compile_request(request: dict[str, Any]) -> dict[str, Any]:
    """Compile one kernel (see the module docstring); never raises."""
    try:
        _set_env(request["env"])  # NOTE: before Triton's first import: its jit reads them
        from triton.backends.nvidia.driver import CudaLauncher
        from triton.compiler import ASTSource, compile

        gpu = _use_target(request["target"])
        start = time.perf_counter()
        fn = _kernel(request["path"], request["module"], request["symbol"])
        signature = request["signature"]
        ahead = _launcher_ahead(fn, signature) if request.get("launcher", True) else None
        src = ASTSource(fn, signature, request["constants"], request["attrs"])
        # NOTE: the compiling process's options and cache-affecting environment, as its key has
        kernel = compile(src, target=gpu, options=request["options"],
                         _env_vars=request["env_vars"])  # fmt: skip
    except BaseException:  # NOTE: reported to the pool, which compiles in its own process then
        return {"error": traceback.format_exc(limit=8)[-4000:]}
    compiled = time.perf_counter()
    reply = {"hash": kernel.hash, "compile_s": compiled - start}
    if ahead is not None:
        ahead.join()
        try:
            CudaLauncher(kernel.src, kernel.metadata)  # NOTE: the cache's, where built ahead
        except BaseException:  # NOTE: the compiling process builds it then
            reply["launcher_error"] = traceback.format_exc(limit=4)[-2000:]
    reply["launcher_s"] = time.perf_counter() - compiled
    return reply


def _use_target(target: Sequence[Any]) -> Any:
    """Triton's driver answering with ``target`` (backend, arch, warp size); the target."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    backend, arch, warp_size = target
    gpu = GPUTarget(backend, arch, warp_size)
    driver.set_active(_TargetOnly(gpu))
    return gpu


_WARM_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def warm(b0, b1):
    i = tl.arange(0, 128)
    tl.store(b1 + i, M.div_rn(M.sqrt_rn(tl.load(b0 + i)), 3.0))
"""


def _warm_up(target: Sequence[Any]) -> None:
    """Pay a process's first-compile costs before the first request (about half a second:
    Triton's compiler state, libdevice, ``ptxas``'s version, the C compiler's first run) by
    compiling a small kernel and its launcher into a throwaway cache, in the environment the
    worker started in (its pool's: Triton's variables are the requests')."""
    import tempfile

    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler import ASTSource, compile

    gpu = _use_target(target)
    with tempfile.TemporaryDirectory(prefix="plait-triton-warm-") as folder:
        before = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = folder
        try:
            path = Path(folder) / "warm.py"
            path.write_text(_WARM_SOURCE)
            fn = _kernel(str(path), "plait_triton_worker_warm", "warm")
            src = ASTSource(fn, {"b0": "*fp32", "b1": "*fp32"}, {}, {})
            kernel = compile(src, target=gpu, options={"num_warps": 4})
            CudaLauncher(kernel.src, kernel.metadata)
        finally:
            if before is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = before
            sys.modules.pop("plait_triton_worker_warm", None)


def _die_with_parent() -> None:
    """On Linux, the worker is sent SIGTERM when the process that started it ends (a worker
    must not outlive its pool's process, holding its standard error open)."""
    if sys.platform != "linux":
        return
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # NOTE: PR_SET_PDEATHSIG


def main() -> int:
    """Serve requests on standard input until the empty one; replies on the original standard
    output (anything Triton prints goes to standard error)."""
    _die_with_parent()
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    target = sys.argv[1:4]
    # NOTE: a failure here fails each request, where it is reported
    with contextlib.suppress(Exception):
        _warm_up((target[0], int(target[1]), int(target[2])))
    requests = sys.stdin.buffer
    while True:
        request = read_message(requests)
        if request is None:
            return 0
        write_message(replies, compile_request(request))


if __name__ == "__main__":
    sys.exit(main())
