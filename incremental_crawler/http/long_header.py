"""A response header line too long for Twisted's HTTP client, said as such.

Twisted's HTTP/1.1 client parser (``twisted.web._newclient.HTTPClientParser``,
a ``LineReceiver`` with ``MAX_LENGTH`` 16384) meets a longer status or
header line by closing the connection without a word
(``LineReceiver.lineLengthExceeded``): Scrapy then reports the page as
"Connection was closed cleanly", as if the server had hung up. Installed
by the add-on, the parser raises :class:`ResponseHeaderTooLong` instead;
Twisted's client gives the request up with it (the connection is closed
as before), so the failure recorded for the page, and the line Scrapy
logs, name the cause.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ResponseHeaderTooLong", "install"]


class ResponseHeaderTooLong(Exception):
    """A response's status or header line is longer than the client parses."""


def _line_too_long(self: Any, line: bytes) -> None:
    raise ResponseHeaderTooLong(
        f"response header line over {self.MAX_LENGTH} bytes (Twisted's HTTP client "
        "parses no longer line; the connection was closed)")


def install() -> None:
    """Have Twisted's HTTP client parser raise on a header line too long (idempotent)."""
    # Imported here: the add-on's settings are read before the reactor is
    # chosen, and this module must not install one.
    from twisted.web._newclient import HTTPClientParser  # noqa: PLC0415

    HTTPClientParser.lineLengthExceeded = _line_too_long  # type: ignore[method-assign]
