"""Download errors are weighed by their type: timeouts and refusals are hard, losses soft.

The rows are what Scrapy's download handlers raise (its own exceptions,
wrapping Twisted's) and the Twisted and built-in exceptions its
``RETRY_EXCEPTIONS`` lists, raw, as other handlers and middlewares raise them.
"""

from __future__ import annotations

import pytest
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadCancelledError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    ResponseDataLossError,
)
from twisted.internet import error as tx
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from incremental_crawler.politeness.errors import ErrorSignal, classify_error

TIMEOUT, HARD, SOFT = ErrorSignal.TIMEOUT, ErrorSignal.HARD, ErrorSignal.SOFT

ROWS = [
    # Timeouts: the server did not answer in time.
    (DownloadTimeoutError("Getting x took longer than 180 seconds."), TIMEOUT),
    (tx.TimeoutError(), TIMEOUT),  # a ConnectError subclass: must not read as "hard"
    (tx.TCPTimedOutError(), TIMEOUT),  # no "Timeout" in its name
    (TimeoutError(), TIMEOUT),  # an OSError subclass: must not read as "soft"
    # Refused, or no connection at all.
    (DownloadConnectionRefusedError("Connection was refused by other side"), HARD),
    (tx.ConnectionRefusedError(), HARD),
    (ConnectionRefusedError(), HARD),  # an OSError (and ConnectionError) subclass
    (tx.NoRouteError(), HARD),
    (tx.ConnectError(), HARD),
    # Lost or closed connections, resets: soft ("Connect" in the name or not).
    (tx.ConnectionLost(), SOFT),
    (tx.ConnectionDone(), SOFT),
    (tx.ConnectionAborted(), SOFT),
    (ConnectionResetError(), SOFT),
    (BrokenPipeError(), SOFT),
    (ResponseNeverReceived([Failure(tx.ConnectionLost())]), SOFT),
    (ResponseFailed([Failure(tx.ConnectionDone())]), SOFT),
    (DownloadFailedError("[<twisted.python.failure.Failure ConnectionLost>]"), SOFT),
    (ResponseDataLossError(), SOFT),
    # DNS hiccups: ConnectError subclasses among them, still soft.
    (CannotResolveHostError("DNS lookup failed"), SOFT),
    (tx.DNSLookupError(), SOFT),
    (tx.UnknownHostError(), SOFT),
    (tx.ServiceNameUnknownError(), SOFT),
    # TLS, our own end, a proxy's tunnel, an empty compressed body (OSError): soft.
    (tx.SSLError(), SOFT),
    (tx.ConnectBindError(), SOFT),
    (tx.BadFileError(), SOFT),
    (TunnelError("Could not open CONNECT tunnel"), SOFT),
    (OSError("Not a gzipped file"), SOFT),
    # Anything else: soft, as a reset.
    (DownloadCancelledError(), SOFT),
    (tx.ConnectingCancelledError(None), SOFT),
    (ValueError("a middleware's bug"), SOFT),
]


@pytest.mark.parametrize(("exception", "expected"), ROWS,
                         ids=[type(e).__name__ for e, _ in ROWS])
def test_download_errors_are_classified_by_type(exception, expected):
    assert classify_error(exception) is expected
    assert classify_error(exception).is_hard == (expected is not SOFT)


def test_a_subclass_is_weighed_as_its_parent():
    class ProxyRefused(DownloadConnectionRefusedError):
        pass

    class PeerReset(tx.ConnectionLost):
        pass

    assert classify_error(ProxyRefused()) is HARD
    assert classify_error(PeerReset()) is SOFT


def test_the_table_keeps_its_old_import_name():
    """``CLASSES``, the table's name before it was built on first use, still
    imports (user code weighing its own errors the same way), as that table."""
    from incremental_crawler.politeness.errors import CLASSES, classes

    assert CLASSES is classes()
    assert [signal for _, signal in CLASSES] == [TIMEOUT, SOFT, HARD, SOFT]
    assert TunnelError in CLASSES[-1][0]
