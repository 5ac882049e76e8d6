"""A real Redis Cluster on loopback for the tests: three ``redis-server
--cluster-enabled yes`` primaries on free ports, joined by ``redis-cli
--cluster create``, started once per test session (per xdist worker) and
shut down at its end.

Nothing is persisted (``--save "" --appendonly no``); the nodes' cluster
config files live in a temporary directory removed afterwards. Every wait
is bounded; a cluster that does not come up fails the tests that use it
(nothing is skipped).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Primaries of the test cluster (no replicas: three is the least
#: ``redis-cli --cluster create`` accepts).
NODES = 3
#: The cluster bus of a node listens on its port + 10000.
BUS_OFFSET = 10_000


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """*n* loopback ports that are free, and whose bus port (+10000) is too."""
    ports: list[int] = []
    # Bounded: at most 1,000 ports asked of the kernel.
    for _ in range(1_000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if (port + BUS_OFFSET <= 65_535 and port not in ports
                and _port_free(port + BUS_OFFSET)):
            ports.append(port)
            if len(ports) == n:
                return ports
    raise AssertionError(f"no {n} free loopback ports with free bus ports")


class LoopbackCluster:
    """Three primaries on loopback; :attr:`url` names one of them
    (``redis://127.0.0.1:P/0``), :attr:`seeds_url` all of them
    (``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/``)."""

    def __init__(self, *, aof: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="redis-cluster-test-"))
        self.ports: list[int] = []
        #: An append-only file written every second on each node (as the
        #: benchmarks' single servers write one): its CPU is the server's too.
        self.aof = aof

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    @property
    def seeds_url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/"

    def start(self) -> None:
        # Bounded: three tries with fresh ports (another process may take a
        # port between the look and the start).
        for attempt in range(3):
            self.ports = free_ports(NODES)
            try:
                self._start_nodes()
                self._create()
                self._until_ok()
                return
            except AssertionError:
                self.stop()
                if attempt == 2:
                    raise

    def _start_nodes(self) -> None:
        for port in self.ports:
            subprocess.run(
                ["redis-server", "--cluster-enabled", "yes", "--port", str(port),
                 "--bind", "127.0.0.1",
                 "--cluster-config-file", str(self.dir / f"nodes-{port}.conf"),
                 "--dir", str(self.dir), "--logfile", str(self.dir / f"redis-{port}.log"),
                 "--pidfile", str(self.dir / f"redis-{port}.pid"),
                 "--save", "", "--appendonly", "yes" if self.aof else "no",
                 "--appendfsync", "everysec", "--auto-aof-rewrite-percentage", "0",
                 "--appenddirname", f"aof-{port}", "--daemonize", "yes"],
                check=True, timeout=30, stdout=subprocess.DEVNULL)
        for port in self.ports:
            self._until(lambda port=port: self._ping(port), f"node {port} to answer")

    def _create(self) -> None:
        result = subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise AssertionError(f"redis-cli --cluster create failed:\n{result.stdout}"
                                 f"\n{result.stderr}")

    def _until_ok(self) -> None:
        def ok() -> bool:
            for port in self.ports:
                with contextlib.suppress(redis.RedisError), self.node(port) as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
                    continue
                return False
            return True

        self._until(ok, "cluster_state:ok on every node")

    @staticmethod
    def _until(condition, what: str, seconds: float = 30.0) -> None:
        # Bounded: polls every 50 ms for at most *seconds*.
        for _ in range(int(seconds / 0.05)):
            if condition():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def _ping(self, port: int) -> bool:
        try:
            with self.node(port) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    @staticmethod
    def node(port: int, retries: int | None = None) -> redis.Redis:
        """A client of one node; ``retries=0`` for a SHUTDOWN, whose closed
        connection is the answer (the default retries wait ~4 s of backoff)."""
        if retries is None:
            return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5,
                               socket_connect_timeout=5)
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5,
                           socket_connect_timeout=5, retry=Retry(NoBackoff(), retries))

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=5,
                            socket_connect_timeout=5)

    def keys(self, pattern: str) -> list[bytes]:
        """Every key matching *pattern* on every node (SCAN per node, bounded)."""
        found: list[bytes] = []
        for port in self.ports:
            with self.node(port) as client:
                cursor = 0
                for _ in range(100_000):
                    cursor, batch = client.scan(cursor, match=pattern, count=1_000)
                    found.extend(batch)
                    if cursor == 0:
                        break
                else:
                    raise AssertionError(f"SCAN of {pattern} on node {port} did not finish")
        return sorted(found)

    def delete(self, pattern: str) -> None:
        """Delete every key matching *pattern*, node by node (one key a DEL:
        keys of several slots may share a node)."""
        for port in self.ports:
            with self.node(port) as client:
                for key in client.scan_iter(match=pattern, count=1_000):
                    client.delete(key)

    def port_of(self, key: str) -> int:
        """The port of the node serving *key*'s slot."""
        with self.client() as client:
            node = client.get_node_from_key(key)
            return int(node.port)

    def shut_down_node(self, port: int) -> None:
        """Stop one node (no replica takes its slots over)."""
        with contextlib.suppress(redis.RedisError), self.node(port, retries=0) as client:
            client.shutdown(nosave=True)

    def stop(self) -> None:
        for port in self.ports:
            with contextlib.suppress(redis.RedisError), self.node(port, retries=0) as client:
                client.shutdown(nosave=True)
        # Bounded: the nodes' pid files go within 10 s of a shutdown.
        for port in self.ports:
            pidfile = self.dir / f"redis-{port}.pid"
            for _ in range(200):
                if not pidfile.exists():
                    break
                time.sleep(0.05)
            else:
                # Ours, and it did not stop: killed.
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
        for port in self.ports:
            for name in (f"nodes-{port}.conf", f"redis-{port}.pid"):
                (self.dir / name).unlink(missing_ok=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster():
    """A Redis Cluster of three loopback primaries for the session."""
    cluster = LoopbackCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(name="prefix")
def own_prefix(redis_cluster: LoopbackCluster) -> Iterator[str]:
    """``prefix``: a key prefix of the test's own on the session's cluster,
    its keys deleted after (a module imports ``own_prefix`` to use it)."""
    from tests.redis_util import new_prefix

    name = new_prefix()
    yield name
    redis_cluster.delete(f"{name}:*")


def _monitor_args(line: bytes) -> tuple[bytes, list[bytes]]:
    """A MONITOR line's client (``lua`` for a script's own commands) and
    its command's arguments, unquoted (MONITOR escapes \\\\, \\", \\n, \\r,
    \\t, \\a, \\b and \\xHH inside each argument's quotes)."""
    head, _, rest = line.partition(b"] ")
    client = head.partition(b"[")[2].partition(b" ")[2]
    named = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("a"): b"\a",
             ord("b"): b"\b"}
    args: list[bytes] = []
    at = 0
    while at < len(rest):
        if rest[at] != ord('"'):
            at += 1
            continue
        arg = bytearray()
        at += 1
        while rest[at] != ord('"'):
            if rest[at] == ord("\\"):
                code = rest[at + 1]
                if code == ord("x"):
                    arg.append(int(rest[at + 2:at + 4], 16))
                    at += 4
                    continue
                arg += named.get(code, bytes([code]))
                at += 2
                continue
            arg.append(rest[at])
            at += 1
        args.append(bytes(arg))
        at += 1
    return client, args


class CommandLog:
    """Every command the nodes of *cluster* run while it is open (a
    MONITOR connection to each), for :meth:`undeclared`."""

    def __init__(self, cluster: LoopbackCluster) -> None:
        self.cluster = cluster
        self.lines: dict[int, list[bytes]] = {}
        #: Every key a script's command named (filled by :meth:`undeclared`).
        self.touched: set[bytes] = set()
        self._socks: dict[int, socket.socket] = {}

    def __enter__(self) -> CommandLog:
        for port in self.cluster.ports:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"MONITOR\r\n")
            self._socks[port] = sock
            self.lines[port] = []
            self._read_until(port, b"+OK")
        return self

    def _read_until(self, port: int, last: bytes) -> None:
        # Bounded: the socket's 10 s timeout a read, at most 1 GB read.
        sock, buffer, lines = self._socks[port], b"", self.lines[port]
        for _ in range(1_000_000):
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise AssertionError(f"node {port} closed its MONITOR connection")
            buffer += chunk
            *whole, buffer = buffer.split(b"\r\n")
            lines.extend(whole)
            if any(last in line for line in whole):
                return
        raise AssertionError(f"no {last!r} from node {port}'s MONITOR")

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                # Every command run before the ECHO is logged before it.
                for port in self._socks:
                    end = f"monitor-end-{port}-{time.monotonic_ns()}".encode()
                    with self.cluster.node(port) as client:
                        client.echo(end)
                    self._read_until(port, end)
        finally:
            for sock in self._socks.values():
                sock.close()

    def scripts(self) -> int:
        """The scripts (EVAL/EVALSHA) the nodes ran."""
        return sum(1 for lines in self.lines.values() for line in lines
                   if _monitor_args(line)[1][:1] in ([b"eval"], [b"evalsha"],
                                                      [b"EVAL"], [b"EVALSHA"]))

    def undeclared(self) -> list[tuple[bytes, bytes]]:
        """(command, key) of every command a script ran on a key not in the
        KEYS it was called with (each command's keys as ``COMMAND GETKEYS``
        names them; MONITOR logs a script's call before its commands)."""
        found: list[tuple[bytes, bytes]] = []
        for port, lines in self.lines.items():
            with self.cluster.node(port) as client:
                declared: set[bytes] = set()
                for line in lines:
                    who, args = _monitor_args(line)
                    if not args:
                        continue
                    if who != b"lua":
                        if args[0].lower() in (b"eval", b"evalsha"):
                            declared = set(args[3:3 + int(args[2])])
                        continue
                    try:
                        named = client.command_getkeys(*args)
                    except redis.ResponseError:
                        continue  # no key (TIME)
                    # (redis-py answers them as str.)
                    keys = [k if isinstance(k, bytes) else k.encode("utf-8", "surrogateescape")
                            for k in named]
                    self.touched.update(keys)
                    found += [(args[0], key) for key in keys if key not in declared]
        return found
