"""Connection URIs in messages: never with their password."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["redacted"]


#: Query parameters whose value is a secret (``?password=``, ``&token=``...):
#: a client may take its password there as well as before the host.
_SECRET_PARAMETER = re.compile(r"pass|pwd|secret|token|auth|credential|api_?key", re.IGNORECASE)


def redacted(uri: str) -> str:
    """*uri* without its password, nor any secret its query holds, for messages."""
    try:
        parts = urlsplit(uri)
        # Replaced in place: urlunsplit would spell some URIs otherwise
        # (unix:///path as unix:/path).
        if parts.password is not None:
            uri = uri.replace(parts.netloc,
                              parts.netloc.replace(f":{parts.password}@", ":***@", 1), 1)
        if parts.query:
            query = "&".join(_redacted_parameter(pair) for pair in parts.query.split("&"))
            head, _, tail = uri.rpartition(f"?{parts.query}")
            uri = f"{head}?{query}{tail}"
        return uri
    except ValueError:
        return "<an unparsable URI>"


def _redacted_parameter(pair: str) -> str:
    name, equals, value = pair.partition("=")
    return f"{name}=***" if equals and value and _SECRET_PARAMETER.search(name) else pair
