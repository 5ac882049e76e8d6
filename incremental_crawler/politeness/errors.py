"""What a download error says about a site's budget: a timeout, a hard or a soft signal.

Classified by type (``isinstance``), against the exceptions Scrapy's
``RETRY_EXCEPTIONS`` lists and the Twisted and built-in ones they wrap, not
by class name: a name says nothing reliable (``ConnectionLost`` contains
"Connect" and is no refusal, ``TCPTimedOutError`` does not contain
"Timeout" and is one).

* **timeout** (a hard signal): the server did not answer in time (the
  connection or the request), the way an overloaded server fails.
* **hard**: the server would not take the connection (refused, no route,
  any other failure to connect).
* **soft**: a lost or closed connection, a reset, a DNS hiccup, a TLS
  failure, a failure at our own end, a broken answer, a proxy's tunnel: one
  costs little, a run of them (after a hard signal) is hard, which
  :class:`~incremental_crawler.politeness.window.DomainWindow` decides.
  Anything not listed is soft too.

The first row of :func:`classes` an exception is an instance of wins: the
more specific classes come first (Twisted's ``TimeoutError`` and
``UnknownHostError`` are ``ConnectError`` subclasses; Python's
``TimeoutError`` and ``ConnectionRefusedError`` are ``OSError`` ones).
"""

from __future__ import annotations

import builtins
import enum
import functools

from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    ResponseDataLossError,
)
from twisted.internet import error as tx
from twisted.web.client import RequestTransmissionFailed, ResponseFailed

__all__ = ["CLASSES", "ErrorSignal", "classes", "classify_error"]  # noqa: F822 (CLASSES: __getattr__)


class ErrorSignal(enum.Enum):
    """What a download error weighs in a slot's window."""

    TIMEOUT = "timeout"
    HARD = "hard"
    SOFT = "soft"

    @property
    def is_hard(self) -> bool:
        return self is not ErrorSignal.SOFT


@functools.cache
def classes() -> tuple[tuple[tuple[type[BaseException], ...], ErrorSignal], ...]:
    """(exception classes, signal): the first row that matches wins."""
    # Imported when a download first fails, not with this module: the crawl
    # command imports this module while Scrapy looks for commands, and Scrapy's
    # HTTP/1.1 handler module, imported there, inspects the whole (deep) stack
    # of that import for its deprecated aliases: a tenth of a second of every
    # crawl's start (several under faketime). Scrapy imports it itself,
    # before any download.
    from scrapy.core.downloader.handlers.http11 import TunnelError  # noqa: PLC0415

    return (
        ((DownloadTimeoutError, tx.TimeoutError, tx.TCPTimedOutError, builtins.TimeoutError),
         ErrorSignal.TIMEOUT),
        # Failures to connect that are about names, TLS or our own end (a local
        # address or socket file), not about the server taking connections.
        ((tx.UnknownHostError, tx.ServiceNameUnknownError, tx.SSLError, tx.ConnectBindError,
          tx.BadFileError), ErrorSignal.SOFT),
        ((DownloadConnectionRefusedError, builtins.ConnectionRefusedError, tx.ConnectError),
         ErrorSignal.HARD),
        ((tx.ConnectionClosed, builtins.ConnectionError, tx.DNSLookupError, CannotResolveHostError,
          ResponseFailed, RequestTransmissionFailed, DownloadFailedError, ResponseDataLossError,
          TunnelError, OSError),
         ErrorSignal.SOFT),
    )


def __getattr__(name: str) -> object:
    # ``CLASSES`` was this module's table before it was built on first use:
    # importing it (the old name) still works, and builds it then.
    if name == "CLASSES":
        return classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def classify_error(exception: BaseException) -> ErrorSignal:
    """The signal *exception*, raised by a download, gives the slot's window."""
    for kinds, signal in classes():
        if isinstance(exception, kinds):
            return signal
    return ErrorSignal.SOFT
