"""Connection URIs in messages: never with their password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redacted"]


def redacted(uri: str) -> str:
    """*uri* without its password, for messages."""
    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<an unparsable URI>"
