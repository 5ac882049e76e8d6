"""The default ignore patterns: noise removed from a text before it is fingerprinted.

Here, pure, so that the settings (:mod:`incremental_crawler.config`) name
their default without importing the fingerprints.
"""

from __future__ import annotations

__all__ = ["DEFAULT_IGNORE_PATTERNS"]

#: Noise that changes on every response and never is content: timestamps,
#: ISO 8601 / W3C and HTTP / RFC 822 ones. ASCII classes ([0-9], not \d):
#: several times faster on long text. Session ids in text can be added,
#: e.g. ``r"(?:jsessionid|phpsessid|sessionid|sid)=[0-9A-Za-z]{8,}"`` (it is
#: not a default: it costs more than both of these together).
DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = (
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?"
     r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?"),
    (r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct"
     r"|Nov|Dec) [0-9]{2,4} [0-9]{2}:[0-9]{2}(?::[0-9]{2})? (?:GMT|UTC|[+-][0-9]{4})"),
)
