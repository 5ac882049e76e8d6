"""A loopback HTTP server whose answers a test writes byte for byte.

For what the test site (:mod:`tests.site`) cannot say: a body cut short, an
ETag of raw bytes 0x80-0xFF, a ``206`` to a request without ``Range``.
Twisted's server re-encodes header values given as text, and checks the
length of what it sends; this one sends exactly the bytes it is given.
One request per connection (``Connection: close``), served from a thread
while the crawl runs on the reactor.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

__all__ = ["NOT_FOUND", "ScriptedServer", "answer", "header"]


def answer(status: str, headers: list[tuple[bytes, bytes]], body: bytes = b"", *,
           length: int | None = None) -> bytes:
    """A whole HTTP/1.1 response: *status* (``"200 OK"``), *headers* as raw bytes.

    ``Content-Length`` is *length* if given (a body cut short), else the
    body's; a 304 gets none.
    """
    lines = [b"HTTP/1.1 " + status.encode("ascii")]
    lines += [name + b": " + value for name, value in headers]
    if not status.startswith("304"):
        lines.append(b"Content-Length: %d" % (len(body) if length is None else length))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


#: The answer to a path the script does not know (robots.txt too: allow all).
NOT_FOUND = answer("404 Not Found", [])


class ScriptedServer:
    """``with ScriptedServer(script) as server:`` serves ``script(head)`` to each request.

    *head* is the raw request head (request line and header fields, as
    bytes); :attr:`heads` keeps them all, in order.
    """

    def __init__(self, script: Callable[[bytes], bytes]) -> None:
        self.script = script
        self.heads: list[bytes] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}{path}"

    def heads_for(self, path: str) -> list[bytes]:
        """The heads of the requests for *path*."""
        start = b" " + path.encode() + b" "
        return [head for head in self.heads if start in head.split(b"\r\n", 1)[0]]

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        # Closing alone does not wake the thread's accept(): shutting the
        # listening socket down does.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                head = head.split(b"\r\n\r\n", 1)[0]
                self.heads.append(head)
                conn.sendall(self.script(head))


def header(head: bytes, name: bytes) -> bytes | None:
    """The raw value of the request header *name* in *head* (``None``: absent)."""
    for line in head.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == name.lower():
            return value.strip()
    return None
