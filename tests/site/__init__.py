"""The loopback test site: an HTTP server for tests and benchmarks.

``python -m tests.site`` serves one out of process (see :mod:`tests.site.server`).
"""

from tests.site.limits import TokenBucketLimiter
from tests.site.server import (
    BASE_EPOCH,
    CONTROL_PREFIX,
    KINDS,
    LASTMOD_MODES,
    LAYOUTS,
    PLAIN_KINDS,
    VALIDATED_KINDS,
    VERSION_STEP,
    LoopbackSite,
    Page,
    RequestRecord,
    etag_matches,
    http_date,
    main,
    parse_http_date,
    w3c_datetime,
)

__all__ = [
    "BASE_EPOCH",
    "CONTROL_PREFIX",
    "KINDS",
    "LASTMOD_MODES",
    "LAYOUTS",
    "PLAIN_KINDS",
    "VALIDATED_KINDS",
    "VERSION_STEP",
    "LoopbackSite",
    "Page",
    "RequestRecord",
    "TokenBucketLimiter",
    "etag_matches",
    "http_date",
    "main",
    "parse_http_date",
    "w3c_datetime",
]
