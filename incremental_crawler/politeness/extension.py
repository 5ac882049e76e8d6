"""AdaptiveThrottle: Scrapy's AutoThrottle with AIMD windows, Retry-After
freezes, robots.txt Crawl-delay and a penalty box, per download slot.

AutoThrottle only stretches a delay from latencies; it ignores 429 and
Retry-After (Scrapy issues #4424, #3849) and Crawl-delay (#892). This
extension keeps a :class:`~incremental_crawler.politeness.window.DomainWindow` per
slot and applies it to the slot before each request is queued there:
delay, concurrency and, after a Retry-After or a backoff, a freeze (no
request of that slot leaves before it ends). The Retry-After handling of
responses is in :mod:`incremental_crawler.politeness.middlewares`.

With ``INCREMENTAL_THROTTLE_SHARED_URL`` the rate, the pacing and the
freezes of each slot are shared by every worker through Redis
(:mod:`incremental_crawler.politeness.budget`): the signals seen here are
reported there, the shared rate replaces the local one, and the slot's own
delay is the user's floor alone (``DOWNLOAD_DELAY``, a Crawl-delay), since a
token from the shared bucket paces each request
(:mod:`incremental_crawler.politeness.middlewares`).

The user's ``DOWNLOAD_DELAY`` (and ``DOWNLOAD_SLOTS`` delays) stay a floor
of each window's delay and ``CONCURRENT_REQUESTS_PER_DOMAIN`` (or
``CONCURRENT_REQUESTS_PER_IP``) a ceiling of its concurrency: they are a
promise to the sites crawled, and nothing tells the values ``scrapy
startproject`` writes (1 s, 1) from a choice. A warning at start-up names
them when they hold every window below what it may reach, and every figure
(the periodic line, the report, the per-slot stats) is the rate they let
through, not the window's own.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import CloseSpider, IgnoreRequest, NotConfigured
from scrapy.extensions.throttle import AutoThrottle
from scrapy.settings import default_settings
from scrapy.utils.defer import deferred_from_coro

from incremental_crawler.config import IncrementalConfig, redis_retry_setting, throttle_enabled
from incremental_crawler.fatal import SHARED_UNAVAILABLE
from incremental_crawler.hosts import host_of
from incremental_crawler.http.validators import parse_http_date
from incremental_crawler.politeness.downloader import PacedSlot
from incremental_crawler.politeness.errors import ErrorSignal, classify_error
from incremental_crawler.politeness.remembered import RateMemory, learned
from incremental_crawler.politeness.retry_after import parse_retry_after
from incremental_crawler.politeness.window import DomainWindow, WindowPolicy
from incremental_crawler.uris import redacted

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.core.downloader import Slot
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

    from incremental_crawler.politeness.budget import Grant, SharedBudget

__all__ = ["MAX_WAIT", "AdaptiveThrottle", "capping_settings", "effective_rate"]

logger = logging.getLogger(__name__)

_SEQ = "_throttle_seq"
#: Request meta: the longest wait (seconds) a 429 or 503 answer to it is
#: retried after. A longer one (a Retry-After, or the backoff) still freezes
#: the slot, but the answer is final (``dont_retry``): robots.txt (see
#: :mod:`incremental_crawler.politeness.robots`) must not hold a host for
#: minutes.
MAX_WAIT = "_incremental_max_wait"
#: The sequence number of the request's token in the shared budget.
SHARED_SEQ = "_throttle_shared_seq"
#: The host whose slot the request's download_slot is (unset: the spider's own slot).
_SLOT_HOST = "_throttle_slot_host"
#: The slot delay while the shared bucket paces: not 0, because Scrapy only
#: looks at a slot's clock (which holds a freeze, see _apply) when its delay
#: is not 0; 1 ms adds no pacing of its own at any rate we allow.
SHARED_SLOT_DELAY = 0.001


def effective_rate(window: DomainWindow) -> tuple[float, str | None]:
    """The requests per second *window* lets through, and what holds it
    below the window's own rate (``None``: nothing does).

    The delay floor (``DOWNLOAD_DELAY``, a ``DOWNLOAD_SLOTS`` delay, a
    Crawl-delay) allows 1/floor; the concurrency (at most the user's
    ``CONCURRENT_REQUESTS_PER_DOMAIN`` or ``CONCURRENT_REQUESTS_PER_IP``, one
    in the penalty box) allows concurrency/latency once a latency is known.
    Below the ceiling the window asks for more concurrency than its rate
    needs, so that bound only shows when the ceiling holds it.
    """
    rate: float = window.rate
    limit = None
    if window.delay_floor > 1.0 / window.rate:
        rate, limit = 1.0 / window.delay_floor, f"delay floor {window.delay_floor:g} s"
    if window.latencies:
        latency = statistics.median(window.latencies)
        if latency > 0 and window.concurrency / latency < rate:
            rate = window.concurrency / latency
            limit = f"concurrency {window.concurrency} at {1000 * latency:.0f} ms"
    return rate, limit


def _per_second(rate: float) -> str:
    """A rate for people: 12.0, 0.33."""
    return f"{rate:.1f}" if rate >= 0.1 else f"{rate:.2g}"


def _header_text(raw: bytes | None) -> str:
    """A header's value as text for the logs and the report (what the site
    sent: bytes as Latin-1, RFC 9110 §5.5; a long one cut)."""
    text = (raw or b"").decode("latin-1").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def capping_settings(settings: BaseSettings, policy: WindowPolicy,
                     overrides: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """What the start-up warning says of each of the user's settings that
    holds every window below its bounds; empty on Scrapy's defaults.

    ``DOWNLOAD_SLOTS`` entries are left out: they are written per site, on
    purpose (the figures still show what they let through).
    """
    overrides = overrides or {}
    fastest = max([policy.max_rate, *(float(o.get("max_rate", 0)) for o in overrides.values())])
    widest = max([policy.max_concurrency,
                  *(int(o.get("max_concurrency", 0)) for o in overrides.values())])
    found = []
    delay = settings.getfloat("DOWNLOAD_DELAY")
    if delay != default_settings.DOWNLOAD_DELAY and delay > 0 and 1 / delay < fastest:
        rate = 1 / delay
        found.append(
            f"DOWNLOAD_DELAY = {delay:g}: every domain at most {rate:.3g} "
            f"request{'' if rate == 1 else 's'}/s, where its window may reach {fastest:g}/s "
            "(remove it from settings.py, or set it to 0, to let the window decide)")
    # Scrapy's Downloader: a per-IP concurrency replaces the per-domain one.
    # Read without Settings.get, which warns that CONCURRENT_REQUESTS_PER_IP is
    # deprecated (Scrapy's Downloader has warned already).
    per_ip = int(settings["CONCURRENT_REQUESTS_PER_IP"] or 0)
    if per_ip:
        name, value, default, unit = "CONCURRENT_REQUESTS_PER_IP", per_ip, 0, "IP address"
    else:
        name, value, unit = "CONCURRENT_REQUESTS_PER_DOMAIN", settings.getint(
            "CONCURRENT_REQUESTS_PER_DOMAIN"), "domain"
        default = default_settings.CONCURRENT_REQUESTS_PER_DOMAIN
    if value != default and value < widest:
        found.append(
            f"{name} = {value}: every {unit} at most {value} "
            f"request{'' if value == 1 else 's'} at a time, hence at most {value}/s when "
            "answers take 1 s (remove it from settings.py to let the window decide, up to "
            f"INCREMENTAL_THROTTLE_MAX_CONCURRENCY = {widest})")
    return found


class AdaptiveThrottle(AutoThrottle):
    """See the module docstring; settings ``INCREMENTAL_THROTTLE_*``."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not throttle_enabled(settings):
            raise NotConfigured("INCREMENTAL_ENABLED or INCREMENTAL_THROTTLE_ENABLED is False")
        config = IncrementalConfig.from_settings(settings).throttle
        assert config is not None  # (throttle_enabled)
        #: The INCREMENTAL_THROTTLE_* settings, checked.
        self.config = config
        self.crawler = crawler
        self.debug = config.debug
        self.policy = replace(
            WindowPolicy(), start_rate=config.start_rate, min_rate=config.min_rate,
            max_rate=config.max_rate, target_latency=config.target_latency,
            max_concurrency=config.max_concurrency)
        self.overrides = WindowPolicy.checked_overrides(config.domains)
        # A Crawl-delay above this counts as this: robots.txt "1e9" must not
        # stop a crawl for ever.
        self.crawl_delay_max = config.crawl_delay_max
        self.retry_after_max = config.retry_after_max
        self.warn_share = config.warn_share
        self.tick = config.tick
        #: The rates this crawl's windows start from (filled when the spider
        #: opens; none with the shared budget, which keeps its own).
        self.memory = RateMemory(config.remember_for, crawler.stats)
        self.windows: dict[str, DomainWindow] = {}
        self.groups = config.groups
        self._warned: set[str] = set()
        #: Called as ``observer(slot, start, until, why)`` (monotonic times)
        #: on every freeze: the HTML report's recorder marks them.
        self.freeze_observers: list[Callable[[str, float, float, str], None]] = []
        self.shared: SharedBudget | None = None
        #: Why the shared budget asked for cannot be used: the crawl will not start.
        self.shared_error: str | None = None
        url = config.shared_url
        if url:
            try:
                if not str(url).startswith(("redis://", "rediss://", "unix://",
                                            "redis+cluster://", "rediss+cluster://")):
                    raise ValueError("use redis://host:port/db (or rediss://, unix://; "
                                     "a Redis Cluster: redis+cluster://host:port,host:port/)")
                # Imported here: a crawl without a shared budget does not
                # import Redis's client (a tenth of a second of its start).
                from incremental_crawler.politeness.budget import SharedBudget  # noqa: PLC0415

                self.shared = SharedBudget(
                    url, config.shared_prefix, stats=crawler.stats, on_reply=self._shared_reply,
                    on_failure=self._shared_failed,
                    retry_time=redis_retry_setting(settings))
            except ValueError as exc:
                # Not NotConfigured: that would crawl on without any
                # throttle, N workers N times too fast.
                self.shared_error = f"INCREMENTAL_THROTTLE_SHARED_URL={redacted(url)!r}: {exc}"
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self._response_downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(self.request_reached_downloader,
                                signal=signals.request_reached_downloader)
        crawler.signals.connect(self.robots_parsed, signal=signals.robots_parsed)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def spider_opened(self, spider: Spider) -> None:
        # AutoThrottle's delay bounds are not used: each window has its own.
        self.mindelay, self.maxdelay = 0.0, float("inf")
        if self.shared_error is not None:
            logger.error("%(error)s: closing the crawl", {"error": self.shared_error})
            raise CloseSpider(SHARED_UNAVAILABLE)
        if self.shared is not None:
            from redis.exceptions import RedisError  # noqa: PLC0415 (as SharedBudget above)

            try:
                await self.shared.open()
            except (RedisError, ValueError) as exc:
                # Crawling without it would make N workers N times too fast.
                logger.error("The shared budget at %(url)s cannot be used (%(exc)s): "
                             "closing the crawl", {"url": redacted(self.shared.url), "exc": exc})
                self.crawler.stats.set_value("incremental/throttle/shared/error", str(exc))
                raise CloseSpider(SHARED_UNAVAILABLE) from exc
        else:
            await self._remember()
        if caps := capping_settings(self.crawler.settings, self.policy, self.overrides):
            logger.warning(
                "Your settings cap every politeness window: %(caps)s. They stay honoured, as "
                "limits you chose for the sites you crawl; if they are only what "
                "'scrapy startproject' wrote, remove them to let each window find the "
                "site's pace. The figures reported are what they let through.",
                {"caps": "; ".join(caps)})
        self._watch_close()

    async def _remember(self) -> None:
        """Read the rates the last crawl's windows reached; have this crawl's
        kept when it ends (single process: the shared budget keeps its own)."""
        if self.memory.remember_for <= 0:
            return
        # Imported here: the ledger's module imports much of the project.
        from incremental_crawler.crawl.ledger import Ledger  # noqa: PLC0415
        from incremental_crawler.state.stores import StateStoreError  # noqa: PLC0415

        ledger = self.crawler.get_extension(Ledger)
        if ledger is None:
            return
        try:
            self.memory.load(await ledger.store.slot_rates(ledger.scope))
        except StateStoreError as exc:
            # The crawl goes on from the default rate; a store that fails
            # stops it at its next flush anyway.
            self.crawler.stats.inc_value("incremental/throttle/remembered_unreadable")
            logger.warning("%(error)s; every slot starts from the default rate",
                           {"error": exc})
        def stage_learned(_reason: str) -> None:
            windows = self.site_windows()
            ledger.store.stage_slot_rates(learned(
                ledger.scope, windows, {key: effective_rate(w)[0] for key, w in windows}))

        ledger.add_closing_writer(stage_learned)

    def _watch_close(self) -> None:
        """Call :meth:`_closing` as soon as the engine starts closing the spider.

        The engine waits for every request it handed the downloader before
        it sends spider_closed: requests held at the gate or in a frozen
        slot's queue would make it wait out the freeze (up to
        INCREMENTAL_THROTTLE_RETRY_AFTER_MAX) and then go out after the
        close was asked. There is no signal for the start of a close: the
        engine's close_spider_async (every close goes through it) is wrapped.
        """
        engine = self.crawler.engine
        close = engine.close_spider_async

        async def close_spider_async(*, reason: str = "cancelled") -> None:
            self._closing()
            await close(reason=reason)

        # Wrapped on purpose (see above): mypy forbids assigning to a method.
        engine.close_spider_async = close_spider_async  # type: ignore[method-assign]

    def _closing(self) -> None:
        """The crawl is closing: what waits for a token or a freeze does not go."""
        dropped = 0
        if self.shared is not None:
            dropped += self.shared.stop_waiting()
        now = time.monotonic()
        for key, window in self.windows.items():
            if window.frozen_until > now:
                dropped += self._drop_queued(key, f"the crawl is closing ({key} is frozen)")
        if dropped:
            self.crawler.stats.inc_value("incremental/throttle/dropped_at_close", dropped)

    # -- windows ---------------------------------------------------------------

    def window(self, key: str, slot: Slot | None = None) -> DomainWindow:
        window = self.windows.get(key)
        if window is None:
            policy = self.policy
            override = self.overrides.get(key)
            if override:
                policy = replace(policy, **override)
            window = self.windows[key] = DomainWindow(policy)
            if key:
                self.memory.start(key, window)
            # The user's delay of this slot is a floor from its first request
            # on: the shared budget is asked for tokens before Scrapy's slot
            # exists (a warm budget would grant a batch at once).
            settings = self.crawler.settings
            window.delay_floor = float(settings.getdict("DOWNLOAD_SLOTS").get(key, {}).get(
                "delay", settings.getfloat("DOWNLOAD_DELAY")))
        if slot is not None and not window.bounded:
            # The slot as Scrapy made it (DOWNLOAD_DELAY, CONCURRENT_REQUESTS_
            # PER_DOMAIN/_PER_IP, DOWNLOAD_SLOTS) bounds the window: the
            # user's delay is a floor, their concurrency a ceiling.
            window.bounded = True
            window.delay_floor = max(window.delay_floor, slot.delay)
            window.policy = replace(window.policy, max_concurrency=max(1, min(
                window.policy.max_concurrency, slot.concurrency)))
        return window

    def slot_key(self, request: Request) -> str:
        """The request's slot, host groups applied (also for robots.txt requests).

        A ``download_slot`` Scrapy (or a host group) gave a request of
        another host is dropped: a redirect copies its source's meta, and the
        target host would be paced by the source's window and budget (and its
        robots.txt Crawl-delay applied to the source). One the spider set
        itself stays.
        """
        meta = request.meta
        host = host_of(request.url)
        if "download_slot" in meta and meta.get(_SLOT_HOST, host) != host:
            del meta["download_slot"]
        if "download_slot" in meta:
            return meta["download_slot"]
        meta[_SLOT_HOST] = host
        if self.groups:
            group = self.groups.get(host)
            if group:
                return group
        return self.crawler.engine.downloader.get_slot_key(request)

    def _apply(self, key: str, window: DomainWindow, slot: Slot | None = None) -> None:
        slot = slot or self.crawler.engine.downloader.slots.get(key)
        if slot is None:
            return
        # With the shared budget its bucket paces: a second 1/rate here would
        # halve the rate. The delay floor (DOWNLOAD_DELAY, Crawl-delay) stays
        # the slot's: the bucket grants on the Redis server's clock, and a
        # grant's wait, converted to ours, may end a few milliseconds early;
        # the slot makes up only that difference (the grant is already at
        # least one floor after the one before it).
        slot.delay = (max(SHARED_SLOT_DELAY, window.delay_floor) if self.shared is not None
                      else window.delay)
        paced = isinstance(slot, PacedSlot)
        # The shared bucket grants one token per request: no groups there. A
        # group leaves at once: the window's concurrency (the slot's, and
        # every figure's) lets it.
        window.group = window.burst(self.tick) if paced and self.shared is None else 1
        slot.concurrency = window.concurrency
        if isinstance(slot, PacedSlot):
            slot.burst = window.group
        slot.jitter = 0.0  # our delay is exact: a jitter could break a freeze
        if window.frozen_until:
            # Scrapy lets the next request of a slot leave at lastseen +
            # delay: move lastseen so that this is the end of the freeze.
            slot.lastseen = max(slot.lastseen, window.frozen_until - slot.delay)

    def request_reached_downloader(self, request: Request, spider: Spider) -> None:
        key = self.slot_key(request)
        window = self.window(key, self.crawler.engine.downloader.slots.get(key))
        request.meta[_SEQ] = window.stamp()
        self._apply(key, window)

    def _response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        # AutoThrottle's hook, with the request (response.request is not set
        # yet when the downloader sends this signal).
        key, slot = self._get_slot(request, spider)
        latency = request.meta.get("download_latency")
        if key is None or latency is None:
            return
        window = self.window(key)
        status = response.status
        seq = request.meta.get(_SEQ, window.sent)
        rate = window.rate
        if status in (429, 503):
            reason = window.hard_error(seq)
            if status == 429:
                window.status_429 += 1
            else:
                window.status_5xx += 1
            self._share(key, window, request, hard=True)
            # Freeze now: Scrapy's downloader releases the slot's next request
            # as soon as this signal returns, before any middleware sees the
            # answer.
            self._stay_away(key, window, request, response)
        elif status >= 500:
            window.status_5xx += 1
            self._share(key, window, request, hard=window.consecutive_hard > 0)
            reason = window.soft_error(seq)
        else:
            reason = window.ok(latency)
            if self.shared is not None and latency <= window.policy.target_latency:
                self.shared.good(key)
        reason = self._shared_rate(window, rate, reason)
        self._changed(key, window, reason, f"{status} in {latency * 1000:.0f} ms")
        self._apply(key, window, slot)

    def _share(self, key: str, window: DomainWindow, request: Request, *, hard: bool) -> None:
        """Report a hard signal (or a soft error) to the shared budget, if any."""
        if self.shared is not None:
            # -1: a request that got no token (none should) counts as the latest.
            seq = request.meta.get(SHARED_SEQ, -1)
            self.shared.report(key, window.policy, hard_seq=seq if hard else 0,
                               soft=0 if hard else 1)

    def _shared_rate(self, window: DomainWindow, rate: float, reason: str | None) -> str | None:
        """With the shared budget the shared rate stands (the local counters still count)."""
        if self.shared is None:
            return reason
        window.rate = rate
        return None

    def _stay_away(self, key: str, window: DomainWindow, request: Request,
                   response: Response) -> None:
        raw = response.headers.get(b"Retry-After")
        server_now = parse_http_date(response.headers.get(b"Date"))
        wait = parse_retry_after(raw, now=server_now)
        if wait == 0:
            # "0", or a date already past (by the server's clock, or ours
            # without its Date: a few seconds of skew land here too) is a
            # valid answer meaning "retry now" (RFC 9110 §10.2.3): no freeze.
            # The retry still leaves no sooner than the slot's delay (1/rate,
            # just cut by this hard error), the least Scrapy's downloader
            # keeps between two requests of a slot, so "now" is no storm.
            self.crawler.stats.inc_value("incremental/throttle/retry_after_now")
            return
        invalid = raw is not None and wait is None
        if invalid:
            self.crawler.stats.inc_value("incremental/throttle/retry_after_invalid")
        most = request.meta.get(MAX_WAIT)
        if most is not None and wait is not None and wait > most:
            # The site asked for a longer wait than the request may take:
            # the answer is final (the slot is frozen all the same, below:
            # the site asked). Our own backoff is short and its waits few.
            request.meta["dont_retry"] = True
        if wait is None:
            # No Retry-After, or garbage.
            wait = window.backoff()
            self.crawler.stats.inc_value("incremental/throttle/backoffs")
            why = (f"{response.status}, Retry-After: {_header_text(raw)} (unreadable), "
                   f"backoff {wait:.1f} s" if invalid
                   else f"{response.status} without Retry-After, backoff {wait:.1f} s")
        else:
            why = f"{response.status}, Retry-After: {_header_text(raw)}"
        if wait > self.retry_after_max:
            self.park(key, f"Retry-After {wait:.0f} s is above "
                           f"INCREMENTAL_THROTTLE_RETRY_AFTER_MAX={self.retry_after_max:g}",
                      wait=wait)
            return
        self.freeze(key, wait, why)

    def on_exception(self, request: Request, exception: Exception) -> None:
        """A download error (called by the Retry-After middleware), weighed by its type."""
        key = request.meta.get("download_slot")
        if key is None:
            return
        window = self.window(key)
        seq = request.meta.get(_SEQ, window.sent)
        signal = classify_error(exception)
        rate = window.rate
        if signal is ErrorSignal.TIMEOUT:
            window.timeouts += 1
        if signal.is_hard:
            self._share(key, window, request, hard=True)
            reason = window.hard_error(seq)
        else:  # a reset, a DNS hiccup: one is soft, a run is hard
            self._share(key, window, request, hard=window.consecutive_hard > 0)
            reason = window.soft_error(seq)
        reason = self._shared_rate(window, rate, reason)
        self._changed(key, window, reason, f"{type(exception).__name__} ({signal.value})")
        self._apply(key, window)

    def freeze(self, key: str, seconds: float, why: str, *, report: bool = True,
               count: bool = True) -> float:
        """No request of *key* leaves for *seconds* (every worker's, when shared).

        *report*: tell the shared budget (not when it told us); *count*: a
        freeze of ours, not another worker's.
        """
        window = self.window(key)
        now = time.monotonic()
        until = window.freeze(now, seconds)
        for observe in self.freeze_observers:
            observe(key, now, until, why)
        if count:
            self.crawler.stats.inc_value("incremental/retry_after_waits")
        if report and self.shared is not None:
            self.shared.report(key, window.policy, freeze=seconds)
        self._changed(key, window, f"freeze {seconds:.1f} s", why)
        self._apply(key, window)
        return until

    def park(self, key: str, why: str, *, wait: float | None = None,
             share: bool = True) -> None:
        """Drop every request of *key* for the rest of the crawl (*wait*: what the site asked)."""
        window = self.window(key)
        if window.parked:
            return
        window.parked = True
        self.crawler.stats.inc_value("incremental/throttle/parked_domains")
        logger.warning("Parking %(slot)s for the rest of the crawl: %(why)s",
                       {"slot": key, "why": why})
        if share and self.shared is not None:
            # The other workers park it too, for as long as the site asked.
            self.shared.report(key, window.policy, park=wait or self.retry_after_max)
        # Nothing more leaves for it: not what waits in its queue either.
        self.freeze(key, self.retry_after_max, f"parked: {why}", report=False)
        self.crawler.stats.inc_value("incremental/throttle/parked_requests",
                                     self._drop_queued(key, f"{key} is parked"))

    def _drop_queued(self, key: str, why: str) -> int:
        """Drop the requests waiting in *key*'s Scrapy slot; how many."""
        slot = self.crawler.engine.downloader.slots.get(key)
        if slot is None:
            return 0
        queued = list(slot.queue)
        slot.queue.clear()
        for _request, deferred in queued:
            deferred.errback(IgnoreRequest(why))
        return len(queued)

    # -- the shared budget -------------------------------------------------------

    def _shared_reply(self, key: str, grant: Grant) -> None:
        """What the shared budget said: its rate, and freezes or parks by any worker."""
        window = self.window(key)
        window.rate = grant.rate
        if grant.parked:
            self.crawler.stats.inc_value("incremental/throttle/shared/parks_seen")
            self.park(key, "parked in the shared budget", share=False)
        elif (grant.frozen_for > 0
              and time.monotonic() + grant.frozen_for > window.frozen_until + 0.01):
            # Another worker's 429 (or backoff): queued requests wait too.
            self.crawler.stats.inc_value("incremental/throttle/shared/freezes_seen")
            self.freeze(key, grant.frozen_for, "shared budget", report=False, count=False)
        elif grant.change and self.debug:
            self._changed(key, window, f"shared {grant.change}", "shared budget")
        self._apply(key, window)

    def _shared_failed(self, exc: Exception) -> None:
        logger.error("The shared budget at %(url)s failed (%(exc)s): closing the crawl "
                     "rather than crawling without it",
                     {"url": redacted(self.shared.url) if self.shared else "?", "exc": exc})
        self.crawler.stats.set_value("incremental/throttle/shared/error", str(exc))
        engine = self.crawler.engine
        if engine is not None and engine.spider is not None:
            deferred_from_coro(engine.close_spider_async(reason=SHARED_UNAVAILABLE))

    def robots_parsed(self, robotparser: Any, request: Request) -> None:
        agent = self.crawler.settings.get("ROBOTSTXT_USER_AGENT") or request.headers.get(
            b"User-Agent", self.crawler.settings.get("USER_AGENT") or b"*")
        delay = robotparser.crawl_delay(agent)
        if delay is None or math.isnan(delay) or delay <= 0:  # absent, NaN, -1
            return
        capped = min(float(delay), self.crawl_delay_max)
        if capped < delay:
            self.crawler.stats.inc_value("incremental/throttle/crawl_delay_capped")
        key = self.slot_key(request)
        window = self.window(key)
        window.delay_floor = max(window.delay_floor, capped)
        self._changed(key, window, f"crawl-delay floor {capped:g} s", "robots.txt")
        self._apply(key, window)

    def _changed(self, key: str, window: DomainWindow, reason: str | None, why: str) -> None:
        if reason and self.debug:
            logger.info(
                "throttle %(slot)s: %(reason)s (%(why)s) -> window %(window).2f req/s, "
                "effective %(rate).2f req/s, concurrency %(conc)d, delay %(delay).3f s%(box)s",
                {"slot": key, "reason": reason, "why": why, "window": window.rate,
                 "rate": effective_rate(window)[0], "conc": window.concurrency,
                 "delay": window.delay, "box": ", penalty box" if window.penalty_box else ""},
            )
        errors = window.hard + window.soft
        if (window.responses >= 20 and errors > self.warn_share * window.responses
                and key not in self._warned):
            self._warned.add(key)
            logger.warning(
                "%(slot)s: %(errors)d of %(n)d answers were errors; slowing down "
                "(now %(rate).2f req/s)",
                {"slot": key, "errors": errors, "n": window.responses,
                 "rate": effective_rate(window)[0]},
            )

    def site_windows(self) -> list[tuple[str, DomainWindow]]:
        """The windows of slots with a site behind them, by slot.

        Requests without a host (the spider's local ``data:,reseed``) share
        the slot ``""``: no site to report a rate for.
        """
        return sorted(((key, window) for key, window in self.windows.items() if key),
                      key=lambda item: item[0])

    def summary(self) -> str:
        """Each slot's effective rate; what caps it and the window's own rate, if capped."""
        parts = []
        for key, window in self.site_windows():
            rate, limit = effective_rate(window)
            part = f"{key} {_per_second(rate)}/s"
            if limit is not None:
                part += f" ({limit}; window {_per_second(window.rate)}/s)"
            parts.append(part)
        return ", ".join(parts)

    async def spider_closed(self, spider: Spider) -> None:
        if self.shared is not None:
            await self.shared.close()
        stats = self.crawler.stats
        if unconfirmed := self.memory.unconfirmed():
            stats.set_value("incremental/throttle/remembered_unconfirmed", len(unconfirmed))
        for key, w in self.site_windows():
            prefix = f"incremental/throttle/{key}"
            # What the slot's requests could reach; the window's own rate
            # apart (above it when the user's delay or concurrency caps it).
            stats.set_value(f"{prefix}/window", round(effective_rate(w)[0], 3))
            stats.set_value(f"{prefix}/window_uncapped", round(w.rate, 3))
            stats.set_value(f"{prefix}/latency_p50_ms", round(1000 * w.percentile(0.5)))
            stats.set_value(f"{prefix}/latency_p95_ms", round(1000 * w.percentile(0.95)))
            if w.responses:
                stats.set_value(f"{prefix}/share_429", round(w.status_429 / w.responses, 4))
                stats.set_value(f"{prefix}/share_5xx", round(w.status_5xx / w.responses, 4))
                stats.set_value(f"{prefix}/share_timeout", round(w.timeouts / w.responses, 4))
            stats.set_value(f"{prefix}/frozen_seconds", round(w.frozen_seconds, 3))
            if w.parked:
                stats.set_value(f"{prefix}/parked", True)

