"""Redis for the tests: db 9 of the shared server, one key prefix per test.

Tests never flush a database: each one writes under its own prefix and
deletes exactly that prefix's keys afterwards. A Redis that does not answer
fails the tests (``.ci/run`` starts one); nothing is skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The shared server; db 9 is the tests' own.
REDIS_URI = os.environ.get("INCREMENTAL_TEST_REDIS_URI", "redis://127.0.0.1:6379/9")
#: The cluster-mode tests' Redis (queue, coordination and state in one db).
CLUSTER_REDIS_URI = os.environ.get("INCREMENTAL_TEST_CLUSTER_REDIS_URI",
                                   "redis://127.0.0.1:6379/12")


def new_prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


def prefix_keys(prefix: str, uri: str = REDIS_URI) -> list[bytes]:
    """Every key under *prefix* (SCAN, bounded: at most 100,000 steps)."""
    client = redis.Redis.from_url(uri)
    try:
        pattern = f"{escape_glob(prefix)}:*"
        keys: list[bytes] = []
        cursor = 0
        for _ in range(100_000):
            cursor, batch = client.scan(cursor, match=pattern, count=1_000)
            keys.extend(batch)
            if cursor == 0:
                return keys
        raise AssertionError(f"SCAN of {pattern} did not finish")
    finally:
        client.close()


def delete_prefix(prefix: str, uri: str = REDIS_URI) -> None:
    keys = prefix_keys(prefix, uri)
    client = redis.Redis.from_url(uri)
    try:
        for start in range(0, len(keys), 1_000):
            client.delete(*keys[start:start + 1_000])
    finally:
        client.close()


def escape_glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class OwnRedis:
    """A throwaway ``redis-server`` on a Unix socket, for the tests that stop
    it or count its commands (never the shared server). Nothing persisted,
    unless *options* say otherwise (``"--appendonly", "yes"``): they come
    after the defaults, and win."""

    def __init__(self, *options: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-test-")
        self.socket = str(Path(self.dir) / "redis.sock")
        self.uri = f"unix://{self.socket}?db=0"
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.socket,
             "--save", "", "--appendonly", "no", "--dir", self.dir, *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # Bounded: 400 x 25 ms = 10 s for it to answer.
        for _ in range(400):
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                pass
            time.sleep(0.025)
        raise AssertionError("redis-server did not start")

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket, single_connection_client=True)

    def command_calls(self) -> dict[str, int]:
        """Calls per command so far (INFO commandstats)."""
        with self.client() as client:
            stats = client.info("commandstats")
        return {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}

    def shut_down(self) -> None:
        """Stop it gracefully (``SHUTDOWN``: its AOF, if on, is written out),
        as a restart by an operator or a service manager does."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # No retries: the server closing the connection is the answer (the
        # client's default retries would wait ~4 s of backoff for nothing).
        with contextlib.suppress(redis.ConnectionError), redis.Redis(
                unix_socket_path=self.socket, retry=Retry(NoBackoff(), 0)) as client:
            client.shutdown()
        proc.wait(timeout=30)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            Path(self.socket).unlink()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class CuttableProxy:
    """A loopback TCP proxy in front of Redis that can be cut, like a network
    partition: every connection is dropped and new ones are refused.

    It runs in threads of its own: the store opens (synchronously, on the
    reactor thread) through it as it would through a network.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 6379) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._cut = threading.Event()
        #: While set, Redis's replies are swallowed (a reply lost on the way).
        self.mute_replies = threading.Event()
        self._spawn(self._accept)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        self._listener.settimeout(0.02)
        # Bounded: checks for the cut every 20 ms, for at most ~30 minutes.
        for _ in range(100_000):
            if self._cut.is_set():
                return
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client, self.mute_replies)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket,
              mute: threading.Event | None = None) -> None:
        # Bounded by the connection's life (EOF or reset), and a hard cap.
        with contextlib.suppress(OSError):
            for _ in range(10_000_000):
                data = src.recv(65_536)
                if not data:
                    break
                if mute is None or not mute.is_set():
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        if self._cut.is_set():
            return
        self._cut.set()
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=10)
        for sock in sockets:
            sock.close()


#: The shared-budget tests' db (their keys: one prefix per test).
BUDGET_REDIS_URI = os.environ.get("INCREMENTAL_TEST_BUDGET_REDIS_URI",
                                  "redis://127.0.0.1:6379/10")


def delete_budget_prefix(name: str) -> None:
    client = redis.Redis.from_url(BUDGET_REDIS_URI)
    try:
        keys = list(client.scan_iter(match=f"{escape_glob(name)}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
