"""Riding out a Redis that stops answering for a while: one rule for every user.

A Redis restarted (gracefully, AOF on), failed over or loading its data
does not answer for a moment. The state store, the cluster coordinator and
the shared budget keep asking it for up to ``INCREMENTAL_REDIS_RETRY_TIME``
seconds (30 by default), counted from when it last answered; each says so
once, with a WARNING, when it stops answering and once when it answers
again. A Redis that stays away longer is given up on: :class:`RedisSilent`,
which its user turns into one ERROR line and a crawl stopped (exit 1).

Only "no answer" is retried (a connection refused, reset or timed out,
Redis loading its data): an answer that is an error (a script's, out of
memory) is an answer, and fails at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["NO_ANSWER", "RedisSilent", "Silence"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: What a command that got no answer meets (BusyLoadingError, a Redis
#: loading its data after a restart, is a ConnectionError): tried again.
NO_ANSWER = (RedisConnectionError, RedisTimeoutError)
#: Waits between tries: doubling from the first to the longest.
FIRST_WAIT = 0.05
MAX_WAIT = 1.0
SETTING = "INCREMENTAL_REDIS_RETRY_TIME"


class RedisSilent(RedisError):
    """Redis has not answered for the whole bound: its user gives up.

    A :class:`~redis.exceptions.RedisError` (what every user of Redis here
    already handles as a failure), not a ConnectionError: it is not tried
    again. ``what`` is the sentence without the last error, ``cause`` that
    error.
    """

    def __init__(self, bound: float, cause: BaseException) -> None:
        self.what = f"Redis has not answered for {bound:g} s ({SETTING})"
        self.cause = cause
        super().__init__(f"{self.what}: {cause}")


class Silence:
    """Since when one Redis has not answered one user (*label* starts its log lines).

    :meth:`failed` on every command that got no answer, :meth:`answered`
    on every one that did; :meth:`again` and :meth:`again_blocking` do both
    around a command, trying it again until it answers or the bound passed.
    """

    def __init__(self, label: str, bound: float) -> None:
        self.label = label
        #: Seconds to keep trying (INCREMENTAL_REDIS_RETRY_TIME).
        self.bound = bound
        #: Since when (monotonic) Redis has not answered; None: it answered last time.
        self.since: float | None = None
        #: Whether a command got no answer since its user last cleared this
        #: (a reply lost on the way: the user may have to find out what ran).
        self.missed = False

    @property
    def silent(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> float:
        """A command got no answer (*exc*): the seconds left to try again, or
        :class:`RedisSilent` (from *exc*) once the bound passed."""
        now = time.monotonic()
        self.missed = True
        if self.since is None:
            self.since = now
            logger.warning(
                "%(label)s: Redis does not answer (%(error)s); trying again for up to "
                "%(bound)g s (INCREMENTAL_REDIS_RETRY_TIME)",
                {"label": self.label, "error": exc, "bound": self.bound})
        left = self.since + self.bound - now
        if left <= 0:
            raise RedisSilent(self.bound, exc) from exc
        return left

    def answered(self) -> bool:
        """A command got its answer; whether that ends a silence (said once)."""
        if self.since is None:
            return False
        logger.warning("%(label)s: Redis answers again after %(s).1f s",
                       {"label": self.label, "s": time.monotonic() - self.since})
        self.since = None
        return True

    async def again(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """``await attempt()``, again while Redis does not answer, within the bound.

        Only for commands that may run twice (a reply lost on the way means
        it ran): idempotent ones, or ones that know what ran (a token).
        """
        delay = FIRST_WAIT
        while True:
            try:
                result = await attempt()
            except NO_ANSWER as exc:
                left = self.failed(exc)
                await asyncio.sleep(min(delay, left))
                delay = min(2 * delay, MAX_WAIT)
                continue
            self.answered()
            return result

    def again_blocking(self, attempt: Callable[[], _T]) -> _T:
        """:meth:`again` for a synchronous client: the thread waits (the
        reactor's, for the few rare commands Scrapy's synchronous interfaces
        cannot wait for otherwise)."""
        delay = FIRST_WAIT
        while True:
            try:
                result = attempt()
            except NO_ANSWER as exc:
                left = self.failed(exc)
                time.sleep(min(delay, left))
                delay = min(2 * delay, MAX_WAIT)
                continue
            self.answered()
            return result
