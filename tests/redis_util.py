"""Redis for the tests: db 9 of the shared server, one key prefix per test.

Tests never flush a database: each one writes under its own prefix and
deletes exactly that prefix's keys afterwards. A Redis that does not answer
fails the tests (``.ci/run`` starts one); nothing is skipped.
"""

from __future__ import annotations

import uuid

import redis

#: The shared server; db 9 is the tests' own.
REDIS_URI = "redis://127.0.0.1:6379/9"


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
