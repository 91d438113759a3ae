"""Triton kernels compiled in worker processes (:mod:`plait.triton_worker`), several at once.

Triton's front end holds the GIL while it walks a kernel's AST into MLIR, so the threads of
:func:`plait.codegen.triton_load.precompile` mostly take turns. Here the kernels that Triton's
on-disk cache does not hold yet are compiled by worker processes, side by side, into that cache;
the compiling process then loads each one from it, under the key it computes itself.

:class:`PooledCompiles` is a Triton ``AsyncCompileMode`` (what ``precompile`` already runs its
``warmup`` calls under). For each kernel Triton asks it to compile it sees the cache key and
the compile Triton submits (its source, options and cache-affecting environment), and checks
the cache:

- held: the compile runs at once, in this process (it loads the kernel from the cache);
- not held: it waits for :meth:`PooledCompiles.dispatch`, which sends it to the workers when
  at least :data:`MIN_POOLED` kernels wait (fewer compile on this process's threads: starting
  a worker costs more than one compile), then loads it from the cache.

Each worker reports the key it compiled under; a key this process computes differently (another
environment) is recorded and warned about, and the kernel is then compiled here as well. A
worker that fails or dies is recorded the same way: the kernel compiles in this process, where a
genuine compile error is raised as it always is. The workers start when a cold compile of a
CUDA program begins (:func:`prestart`, called before its passes) or at the first dispatch, warm
up for the GPU's target, and serve every later compile of the process while Triton's
environment (the variables of :func:`identity`) is unchanged; ``TRITON_CACHE_DIR`` travels with
each request.

Example:
    >>> sorted(identity({"TRITON_CACHE_DIR": "/c", "TRITON_PTXAS_PATH": "/p", "HOME": "/h"}))
    ['TRITON_PTXAS_PATH']
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pickle
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait import triton_worker

Target = tuple[str, int, int]  # NOTE: Triton's GPUTarget: backend, arch, warp size
MIN_POOLED = 2  # NOTE: fewer kernels to compile: this process's threads (no worker start)
MAX_WORKERS = 16
REQUEST_TIMEOUT_S = 600  # NOTE: a compile past it: the worker is killed, the kernel compiles here
PRESTARTED = 8  # NOTE: before the kernel count is known; a dispatch grows to what it needs
# NOTE: what a precompile's record says of the workers: counts summed over devices, seconds
# taken at their largest
SUMMED = ("pooled", "workers")
LARGEST = ("pool_wait_s", "worker_compile_s_max", "worker_launcher_s_max")
# NOTE: directories Triton reads at each use: sent with each request, not part of identity
_PER_REQUEST = ("TRITON_CACHE_DIR", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "TRITON_HOME")
# NOTE: read outside the TRITON_ prefix by Triton's NVIDIA back end (compiler, ptxas options)
_OTHER_KNOBS = ("CC", "PTXAS_OPTIONS", "DISABLE_PTXAS_OPT", "DISABLE_LLVM_OPT")


def identity(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker must share with this process to compile under the same keys:
    Triton's (``TRITON_*`` but its directories) and the few it reads under other names. Workers
    started under another identity are replaced."""
    return {
        k: v
        for k, v in environ.items()
        if (k.startswith(triton_worker.ENV_PREFIX) and k not in _PER_REQUEST) or k in _OTHER_KNOBS
    }


def _request_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Triton's variables for one request; its directories absolute (a worker's working
    directory is its own)."""
    env = {k: v for k, v in environ.items() if k.startswith(triton_worker.ENV_PREFIX)}
    return {k: os.path.abspath(v) if k in _PER_REQUEST else v for k, v in env.items()}


class _Worker:
    """One worker process and the thread that feeds it jobs from the pool's queue. Every job
    is answered: a worker that died is started again for the next one."""

    def __init__(self, jobs: queue.Queue[Any], env: dict[str, str], target: Target) -> None:
        self.env = env
        self.argv = [sys.executable, "-m", "plait.triton_worker", *map(str, target)]
        self.process = self._start()
        self.thread = threading.Thread(target=self._serve, args=(jobs,), daemon=True)
        self.thread.start()

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
        )

    def _serve(self, jobs: queue.Queue[Any]) -> None:
        while True:
            job = jobs.get()
            if job is None:
                self.close()
                return
            request, done = job
            try:
                reply = self._ask(request)
            except Exception as exc:  # NOTE: a broken pipe, a worker that cannot start
                reply = {"error": f"the worker failed: {type(exc).__name__}: {exc}"}
            # NOTE: the callback records its own failures; the thread serves on
            with contextlib.suppress(Exception):
                done(reply)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """The worker's reply (a dead worker started again first); a worker silent for
        :data:`REQUEST_TIMEOUT_S` is killed and the request answered with an error."""
        if self.process.poll() is not None:
            self.close()
            self.process = self._start()
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        triton_worker.write_message(stdin, request)
        ready, _, _ = select.select([stdout], [], [], REQUEST_TIMEOUT_S)
        if not ready:
            self.process.kill()
            self.close()
            return {"error": f"the worker did not answer within {REQUEST_TIMEOUT_S} s"}
        reply = triton_worker.read_message(stdout)
        if reply is None:
            status = self.process.wait(timeout=10)
            return {"error": f"the worker exited (status {status})"}
        return reply

    def alive(self) -> bool:
        return self.thread.is_alive()

    def close(self) -> None:
        """Ask the process to end (kill it after 5 s) and close its pipes."""
        p = self.process
        try:
            if p.poll() is None and p.stdin is not None:
                triton_worker.write_message(p.stdin, None)
        except OSError:  # NOTE: it is ending already
            pass
        for pipe in (p.stdin, p.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # NOTE: a write that cannot be flushed
                    pipe.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class WorkerPool:
    """Worker processes compiling Triton kernels (see the module docstring)."""

    def __init__(self, env_identity: dict[str, str], target: Target) -> None:
        self.identity = env_identity
        self.target = target
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.workers: list[_Worker] = []
        env = dict(os.environ)
        root = str(Path(triton_worker.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.env = env

    def submit(self, request: dict[str, Any], done: Callable[[dict[str, Any]], None]) -> None:
        self.jobs.put((request, done))

    def grow(self, workers: int) -> int:
        """At least ``workers`` live workers (at most :data:`MAX_WORKERS`); how many there are."""
        self.workers = [w for w in self.workers if w.alive()]
        while len(self.workers) < min(workers, MAX_WORKERS):
            self.workers.append(_Worker(self.jobs, self.env, self.target))
        return len(self.workers)

    def close(self) -> None:
        """End every worker: each finishes the jobs queued before this (first in, first out);
        one still busy after 10 s is killed."""
        for _ in self.workers:
            self.jobs.put(None)
        for w in self.workers:
            w.thread.join(timeout=10)
            if w.thread.is_alive():
                w.process.kill()
        self.workers = []


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def _pool(target: Target) -> WorkerPool:
    """The process's pool, for Triton's current environment (a pool of another is closed);
    workers it starts warm up for ``target`` (backend, arch, warp size). Holds: _POOL_LOCK."""
    global _POOL
    want = identity(os.environ)
    if _POOL is not None and (_POOL.identity, _POOL.target) != (want, target):
        _POOL.close()
        _POOL = None
    if _POOL is None:
        _POOL = WorkerPool(want, target)
    return _POOL


def pool(target: Target) -> WorkerPool:
    """The process's pool for ``target`` in Triton's current environment (see :func:`_pool`)."""
    with _POOL_LOCK:
        return _pool(target)


def submit_all(
    target: Target,
    requests: Sequence[tuple[dict[str, Any], Callable[[dict[str, Any]], None]]],
    jobs: int,
) -> int:
    """Send ``requests`` (each with its callback) to the process's pool for ``target``, grown
    to ``min(jobs, len(requests))`` workers; how many it has. One lock covers choosing the
    pool, growing it and queueing, so no other thread closes it in between."""
    with _POOL_LOCK:
        workers = _pool(target)
        count = workers.grow(min(jobs, len(requests)))
        for request, done in requests:
            workers.submit(request, done)
        return count


@atexit.register
def _close_pool() -> None:
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()


def device_target(device: Any) -> Target | None:
    """``device``'s Triton target (backend, arch, warp size), or None where the workers do not
    serve it (not CUDA)."""
    import torch
    from triton.runtime import driver

    with torch.cuda.device(device):
        t = driver.active.get_current_target()
    if t.backend != "cuda":
        return None
    return (t.backend, int(t.arch), int(t.warp_size))


def prestart(device: Any, jobs: int | None = None) -> None:
    """Start up to :data:`PRESTARTED` workers for ``device`` now (``jobs``: the compile's
    parallelism, default one per CPU), so they are ready when a cold compile's kernels are
    printed: called where a compile of a CUDA program begins. Starting returns at once (the
    workers import Triton and warm up on their own)."""
    workers = min(jobs or os.cpu_count() or 1, PRESTARTED)
    target = device_target(device) if workers >= MIN_POOLED else None
    if target is not None:
        with _POOL_LOCK:
            _pool(target).grow(workers)


def _held(hash_hex: str) -> bool:
    """Whether Triton's cache holds the kernel of this key (a cache that is no local
    directory counts as holding it: such kernels compile in this process)."""
    from triton.runtime.cache import FileCacheManager, get_cache_manager

    manager = get_cache_manager(hash_hex)
    if not isinstance(manager, FileCacheManager):
        return True
    folder = Path(manager.cache_dir)
    return any(folder.glob("__grp__*.json"))


def _spec_of(compile_fn: Any) -> dict[str, Any] | None:
    """What a worker needs to compile the kernel Triton's ``compile_fn`` compiles (its module
    file and name, the kernel's name, signature, constants, attributes, options, and the
    cache-affecting environment this process compiles under), read from the closure Triton's
    ``JITFunction._do_compile`` submits; None where it is not of that shape (another Triton):
    such a kernel compiles in this process."""
    try:
        cells = dict(
            zip(compile_fn.__code__.co_freevars, (c.cell_contents for c in compile_fn.__closure__))
        )
        src, options, env_vars = cells["src"], cells["options"], cells["env_vars"]
        fn = src.fn.fn  # NOTE: the JITFunction's Python function
        spec = {
            "path": sys.modules[fn.__module__].__file__,
            "module": fn.__module__,
            "symbol": fn.__name__,
            "signature": dict(src.signature),
            "constants": dict(src.constants),
            "attrs": dict(src.attrs),
            "options": dict(options.__dict__),
            "env_vars": dict(env_vars),
        }
        pickle.dumps(spec)  # NOTE: what cannot travel compiles here
    except Exception:  # NOTE: any other shape: compiled in this process, as before the workers
        return None
    return spec


def _instrumented() -> str | None:
    """Why kernels must compile in this process: settings of it that change the compiled code
    without entering Triton's key or its environment (instrumentation, a stage hook)."""
    from triton import knobs

    if getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None:
        return "Triton's add_stages_inspection_hook is set"
    if getattr(knobs.compilation, "instrumentation_mode", "") not in ("", None):
        return "Triton's instrumentation_mode is set"
    try:
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:
        return None
    if getattr(CUDABackend, "instrumentation", None) is not None:
        return "a Triton instrumentation (Proton) is active"
    return None


@dataclass
class _Waiting:
    key: str
    spec: dict[str, Any]
    compile_fn: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)
    claimed: bool = False  # NOTE: answered once, by whichever path gets to it first


def _mode_class() -> Any:
    """:class:`PooledCompiles` built on Triton's ``AsyncCompileMode``, or None without it."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode, FutureKernel, active_mode
    except ImportError:
        return None

    class PooledCompiles(AsyncCompileMode):
        """Compiles held by the cache run at once; the others wait for :meth:`dispatch`. Its
        exit answers every kernel whatever happened before (one not dispatched compiles here)
        and leaves no compile mode active."""

        def __init__(self, local: ThreadPoolExecutor, jobs: int, target: Target) -> None:
            super().__init__(local)
            self.jobs = jobs
            self.target = target
            self.waiting: list[_Waiting] = []
            self.record: dict[str, Any] = {"pooled": 0, "workers": 0}
            self._errors: list[str] = []
            self._lock = threading.Lock()
            self._dispatched = 0.0

        def submit(self, key: str, compile_fn: Any, finalize_fn: Any) -> Any:
            import hashlib

            known = self.future_kernels.get(key)
            if known is not None:
                return known
            hash_hex = hashlib.sha256(key.encode("utf-8")).hexdigest()
            spec = None if _held(hash_hex) else _spec_of(compile_fn)
            if spec is None:
                future = self.executor.submit(compile_fn)
            else:
                waiting = _Waiting(hash_hex, spec, compile_fn)
                self.waiting.append(waiting)
                future = waiting.future
            future._key = key
            self.raw_futures.append(future)
            kernel = self.future_kernels[key] = FutureKernel(finalize_fn, future)
            return kernel

        def dispatch(self) -> None:
            """Compile the waiting kernels: on the workers when there are enough of them (and
            nothing of this process changes what they would compile). Whatever fails here, each
            is answered (compiled in this process)."""
            waiting, self.waiting = self.waiting, []
            try:
                self._send(waiting)
            except Exception as exc:
                for w in waiting:
                    self._finish(w, {"error": f"not sent: {type(exc).__name__}: {exc}"})

        def _send(self, waiting: list[_Waiting]) -> None:
            why_here = _instrumented()
            if len(waiting) < MIN_POOLED or self.jobs < MIN_POOLED or why_here is not None:
                for w in waiting:
                    self._finish(w, None)
                return
            self._dispatched = time.perf_counter()
            env = _request_env(os.environ)
            requests = [({**w.spec, "target": self.target, "env": env},
                         functools.partial(self._finish, w)) for w in waiting]  # fmt: skip
            self.record["workers"] = submit_all(self.target, requests, self.jobs)
            self.record["pooled"] = len(waiting)

        def _finish(self, w: _Waiting, reply: dict[str, Any] | None) -> None:
            """Load (or, without a worker's kernel, compile) ``w`` in this process; the
            kernel's future is answered whatever happens, once."""
            with self._lock:
                if w.claimed:
                    return
                w.claimed = True
            try:
                if reply is not None and "hash" in reply and not _held(w.key):
                    # NOTE: both keys named: a worker that compiled under another key (another
                    # environment, another ptxas) is told apart from one whose file is missing
                    reply = {"error": "its kernel is not in this process's Triton cache (the "
                             f"worker compiled under key {reply['hash']}, this process looks "
                             f"under {w.key})"}  # fmt: skip
                kernel = w.compile_fn()
                with self._lock:
                    self._note(w, reply, kernel)
            except BaseException as exc:
                w.future.set_exception(exc)
                return
            w.future.set_result(kernel)

        def _note(self, w: _Waiting, reply: dict[str, Any] | None, kernel: Any) -> None:
            if reply is None:
                return
            if reply.get("hash") != kernel.hash:
                why = reply.get("error") or (
                    f"it compiled under key {reply.get('hash')}, this process under {kernel.hash}"
                )
                self._errors.append(f"{w.spec['symbol']}: {why}")
            r = self.record
            for key in ("compile_s", "launcher_s"):
                r[f"worker_{key}_max"] = max(r.get(f"worker_{key}_max", 0.0),
                                             float(reply.get(key, 0.0)))  # fmt: skip
            r["pool_wait_s"] = time.perf_counter() - self._dispatched

        def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
            try:
                if self.waiting:  # NOTE: an error before the dispatch: they compile here
                    waiting, self.waiting = self.waiting, []
                    for w in waiting:
                        self._finish(w, None)
                super().__exit__(exc_type, exc_value, traceback)
            finally:
                active_mode.set(None)

        def errors(self) -> list[str]:
            with self._lock:
                return list(self._errors)

    return PooledCompiles


def pooled_mode(local: ThreadPoolExecutor, jobs: int, device: Any) -> Any:
    """A :class:`PooledCompiles` for ``device`` (its CUDA target), or None where Triton lacks
    what it needs or the target is not CUDA (those compile on threads)."""
    cls = _mode_class()
    target = device_target(device) if cls is not None else None
    return None if target is None else cls(local, jobs, target)
