"""Triton kernels compiled in worker processes (:mod:`plait.triton_worker`), several at once.

Triton's front end holds the GIL while it walks a kernel's AST into MLIR, so the threads of
:func:`plait.codegen.triton_load.precompile` mostly take turns. Here the kernels that Triton's
on-disk cache does not hold yet are compiled by worker processes, side by side, into that cache;
the compiling process then loads each one from it, under the key it computes itself.

:class:`PooledCompiles` is a Triton ``AsyncCompileMode`` (what ``precompile`` already runs its
``warmup`` calls under). For each kernel Triton asks it to compile it sees the cache key and
(through Triton's ``jit_cache_hook``) the kernel's specialization data, and checks the cache:

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
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait import triton_worker

Target = tuple[str, int, int]  # NOTE: Triton's GPUTarget: backend, arch, warp size
MIN_POOLED = 2  # NOTE: fewer kernels to compile: this process's threads (no worker start)
MAX_WORKERS = 16
PRESTARTED = 8  # NOTE: before the kernel count is known; a dispatch grows to what it needs
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
    return {k: v for k, v in environ.items() if k.startswith(triton_worker.ENV_PREFIX)}


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
            if self.process.poll() is not None:
                self.close()
                self.process = self._start()
            try:
                assert self.process.stdin is not None and self.process.stdout is not None
                triton_worker.write_message(self.process.stdin, request)
                reply = triton_worker.read_message(self.process.stdout)
                if reply is None:
                    status = self.process.wait(timeout=10)
                    reply = {"error": f"the worker exited (status {status})"}
            except Exception as exc:  # NOTE: a broken pipe: this worker is gone
                reply = {"error": f"the worker failed: {type(exc).__name__}: {exc}"}
            # NOTE: the callback records its own failures; the thread serves on
            with contextlib.suppress(Exception):
                done(reply)

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
        for _ in self.workers:
            self.jobs.put(None)
        for w in self.workers:
            w.thread.join(timeout=10)
        self.workers = []


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def pool(target: Target) -> WorkerPool:
    """The process's pool, for Triton's current environment (a pool of another is closed);
    workers it starts warm up for ``target`` (backend, arch, warp size), which requests name."""
    global _POOL
    want = identity(os.environ)
    with _POOL_LOCK:
        if _POOL is not None and (_POOL.identity, _POOL.target) != (want, target):
            _POOL.close()
            _POOL = None
        if _POOL is None:
            _POOL = WorkerPool(want, target)
        return _POOL


@atexit.register
def _close_pool() -> None:
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()


def device_target(device: Any) -> Target | None:
    """``device``'s Triton target (backend, arch, warp size), or None where the workers do not
    serve it (not CUDA; a Triton without the hook they need)."""
    import torch
    from triton import knobs
    from triton.runtime import driver

    with torch.cuda.device(device):
        t = driver.active.get_current_target()
    if t.backend != "cuda" or not hasattr(knobs.runtime, "jit_cache_hook"):
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
        pool(target).grow(workers)


def _held(hash_hex: str) -> bool:
    """Whether Triton's cache holds the kernel of this key (a cache that is no local
    directory counts as holding it: such kernels compile in this process)."""
    from triton.runtime.cache import FileCacheManager, get_cache_manager

    manager = get_cache_manager(hash_hex)
    if not isinstance(manager, FileCacheManager):
        return True
    folder = Path(manager.cache_dir)
    return any(folder.glob("__grp__*.json"))


@dataclass
class _Waiting:
    key: str
    spec: dict[str, Any]
    compile_fn: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


def _mode_class() -> Any:
    """:class:`PooledCompiles` built on Triton's ``AsyncCompileMode``, or None without it."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode, FutureKernel
    except ImportError:
        return None

    class PooledCompiles(AsyncCompileMode):
        """Compiles held by the cache run at once; the others wait for :meth:`dispatch`."""

        def __init__(self, local: ThreadPoolExecutor, jobs: int, target: Target) -> None:
            super().__init__(local)
            self.jobs = jobs
            self.target = target
            self.spec: dict[str, Any] | None = None
            self.waiting: list[_Waiting] = []
            self.record: dict[str, Any] = {"pooled": 0, "workers": 0}
            self._errors: list[str] = []
            self._lock = threading.Lock()
            self._dispatched = 0.0

        def hook(self, **kwargs: Any) -> bool | None:
            """Triton's ``jit_cache_hook``: note the kernel about to be submitted here."""
            from triton.runtime._async_compile import active_mode

            if active_mode.get() is self:
                fn = kwargs["fn"].jit_function.fn
                module = sys.modules[fn.__module__]
                self.spec = {
                    "path": module.__file__,
                    "module": fn.__module__,
                    "symbol": fn.__name__,
                    "spec": kwargs["compile"]["specialization_data"],
                }
            return None

        def submit(self, key: str, compile_fn: Any, finalize_fn: Any) -> Any:
            import hashlib

            known = self.future_kernels.get(key)
            if known is not None:
                return known
            spec, self.spec = self.spec, None
            hash_hex = hashlib.sha256(key.encode("utf-8")).hexdigest()
            if spec is None or _held(hash_hex):
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
            """Compile the waiting kernels: on the workers when there are enough of them."""
            waiting, self.waiting = self.waiting, []
            if len(waiting) < MIN_POOLED or self.jobs < MIN_POOLED:
                for w in waiting:
                    self._finish(w, None)
                return
            self._dispatched = time.perf_counter()
            workers = pool(self.target)
            self.record["workers"] = workers.grow(min(self.jobs, len(waiting)))
            self.record["pooled"] = len(waiting)
            env = _request_env(os.environ)
            for w in waiting:
                request = {**w.spec, "target": self.target, "env": env}
                workers.submit(request, functools.partial(self._finish, w))

        def _finish(self, w: _Waiting, reply: dict[str, Any] | None) -> None:
            """Load (or, without a worker's kernel, compile) ``w`` in this process."""
            try:
                kernel = w.compile_fn()
            except BaseException as exc:
                w.future.set_exception(exc)
                return
            with self._lock:
                if reply is not None and reply.get("hash") != kernel.hash:
                    why = reply.get("error") or (
                        f"it compiled under key {reply.get('hash')}, this process under "
                        f"{kernel.hash}"
                    )
                    self._errors.append(f"{w.spec['symbol']}: {why}")
                if reply is not None:
                    r = self.record
                    for key in ("compile_s", "launcher_s"):
                        r[f"worker_{key}_max"] = max(r.get(f"worker_{key}_max", 0.0),
                                                     float(reply.get(key, 0.0)))  # fmt: skip
                    r["pool_wait_s"] = time.perf_counter() - self._dispatched
            w.future.set_result(kernel)

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


@contextmanager
def hooked(pooled: Any) -> Iterator[None]:
    """Triton's ``jit_cache_hook`` chained to ``pooled``'s while it is active (nothing for
    ``None``): the hook sees each kernel's specialization data before its compile is submitted."""
    if pooled is None:
        yield
        return
    from triton import knobs

    before = knobs.runtime.jit_cache_hook

    def chained(**kwargs: Any) -> bool | None:
        if before is not None and before(**kwargs):
            return True
        return pooled.hook(**kwargs)

    knobs.runtime.jit_cache_hook = chained
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = before
