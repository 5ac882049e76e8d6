"""Every ``INCREMENTAL_*`` setting, its default, and reading them in one place.

Components never call ``settings.get(NAME, default)`` themselves: the
defaults live here, the add-on installs them, and :class:`IncrementalConfig`
reads and checks them once, naming the setting when a value is wrong. Its
parts are the settings of the components that are off unless switched on:
the throttle's (:class:`ThrottleSettings`), cluster mode's
(:class:`ClusterSettings`) and the live metrics' (:class:`MetricsSettings`),
each ``None`` when off (and then not checked); the report's are its fields
``report``, ``report_dir`` and ``report_keep``.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from incremental_crawler.exceptions import ClusterError
from incremental_crawler.ignore_patterns import DEFAULT_IGNORE_PATTERNS

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_SETTINGS", "ClusterSettings", "IncrementalConfig", "MetricsSettings", "SettingError",
    "ThrottleSettings", "port_range", "redis_retry_setting", "setting_or_default",
    "throttle_enabled", "unknown_settings",
]

DEFAULT_SETTINGS: dict[str, Any] = {
    "INCREMENTAL_ENABLED": True,
    # Cluster mode (several workers, one crawl): redis://host:port/db. Sets
    # scrapy-redis's scheduler, the Redis state store and the shared budget.
    "INCREMENTAL_CLUSTER_URL": None,
    "INCREMENTAL_CLUSTER_PREFIX": "incremental:cluster",
    # Seconds a crawl keeps reconnecting to a Redis that stopped answering
    # (its state store; in cluster mode, the cluster's Redis and the shared
    # budget's) before it stops, as a crawl that cannot go on.
    "INCREMENTAL_REDIS_RETRY_TIME": 30.0,
    # The Redis state store on a Redis Cluster (its cluster layout) is new:
    # opened only when this says so (see docs/capacity.md, "Redis Cluster").
    "INCREMENTAL_STATE_ON_REDIS_CLUSTER": True,
    # Seconds between a worker's heartbeats; a worker silent for the TTL is
    # taken for dead and its requests go back to the queue.
    "INCREMENTAL_CLUSTER_HEARTBEAT": 1.0,
    "INCREMENTAL_CLUSTER_WORKER_TTL": 30.0,
    # A worker out of work exits once the cluster was quiet this long.
    "INCREMENTAL_CLUSTER_IDLE_GRACE": 2.0,
    # None: sqlite under the project's data dir (.scrapy/incremental/state.db).
    "INCREMENTAL_STATE_URI": None,
    "INCREMENTAL_STATE_STORES": {
        "sqlite": "incremental_crawler.state.stores.sqlite.SQLiteStateStore",
        "redis": "incremental_crawler.state.stores.redis.RedisStateStore",
        "rediss": "incremental_crawler.state.stores.redis.RedisStateStore",
        "unix": "incremental_crawler.state.stores.redis.RedisStateStore",
        "redis+cluster": "incremental_crawler.state.stores.redis.RedisStateStore",
        "rediss+cluster": "incremental_crawler.state.stores.redis.RedisStateStore",
    },
    # Some servers' validators never change although the content does: after
    # this many seconds since the last full download, fetch without
    # conditions. 0 switches the forced refresh off.
    "INCREMENTAL_MAX_AGE": 30 * 24 * 3600,
    # Staged writes are committed when this many are pending, or every
    # INCREMENTAL_FLUSH_INTERVAL seconds, whichever comes first.
    "INCREMENTAL_BATCH_SIZE": 500,
    "INCREMENTAL_FLUSH_INTERVAL": 1.0,
    "INCREMENTAL_SQLITE_BUSY_TIMEOUT": 5.0,
    # Item fields that change on every visit and must not make an item look
    # changed; the fingerprint field itself is always excluded.
    "INCREMENTAL_VOLATILE_FIELDS": ["crawled_at", "scraped_at", "fetched_at"],
    "INCREMENTAL_FINGERPRINT_FIELD": "fingerprint",
    # Regexes removed from item text before fingerprinting, whitespace
    # folded: None = the documented defaults (timestamps); [] = none.
    "INCREMENTAL_FINGERPRINT_IGNORE": None,
    # The item field whose (canonical) value identifies an item across runs.
    "INCREMENTAL_ITEM_KEY_FIELD": "url",
    "INCREMENTAL_STORE_ITEMS": True,
    # The change feed: each emitted item says what it is (new, changed,
    # deleted) in this field ("" or None: no such field); a changed item
    # also carries the fingerprint it replaces, and (opt-in: a field name)
    # the top-level fields that changed.
    "INCREMENTAL_CHANGE_FIELD": "change",
    "INCREMENTAL_PREVIOUS_FINGERPRINT_FIELD": "previous_fingerprint",
    "INCREMENTAL_CHANGED_FIELDS_FIELD": None,
    # At-least-once delivery: the item versions a crawl stored but whose
    # feeds did not close cleanly (killed) are emitted again by the next
    # crawl, marked in this field.
    "INCREMENTAL_REDELIVER": True,
    "INCREMENTAL_REDELIVERED_FIELD": "redelivered",
    # A known page that is gone (410; 404 on two checks in a row; a 301/308
    # elsewhere) yields one tombstone item through the pipelines, and is then
    # checked again only this many seconds later (re-seeded then if nothing
    # names it).
    "INCREMENTAL_TOMBSTONES": True,
    "INCREMENTAL_GONE_RECHECK": 30 * 24 * 3600,
    # Versions kept per item (tombstones included), pruned as they are
    # written; 0 keeps every version.
    "INCREMENTAL_ITEM_HISTORY": 10,
    # Crawl summaries kept per scope (the state command and the reports).
    "INCREMENTAL_CRAWL_HISTORY": 100,
    "INCREMENTAL_REPORT": True,
    # A directory: each crawl writes report.html (charts, one self-contained
    # page) and report.json there, the latest under those names and each
    # crawl under a timestamped one too, the newest INCREMENTAL_REPORT_KEEP
    # kept. None: no files.
    "INCREMENTAL_REPORT_DIR": None,
    "INCREMENTAL_REPORT_KEEP": 20,
    # Adaptive revisits (pages without a trustworthy lastmod): a page that
    # is not due is not requested. Intervals in seconds.
    "INCREMENTAL_REVISIT_ENABLED": True,
    "INCREMENTAL_REVISIT_INITIAL": 24 * 3600,
    "INCREMENTAL_REVISIT_MIN": 3600,
    "INCREMENTAL_REVISIT_MAX": 30 * 24 * 3600,
    "INCREMENTAL_REVISIT_INC_RATE": 0.4,
    "INCREMENTAL_REVISIT_DEC_RATE": 0.2,
    # Due is judged per crawl: a page is due when its next visit is not
    # after the crawl's start plus this many seconds (a job run every day
    # may start this much earlier than the one before).
    "INCREMENTAL_DUE_TOLERANCE": 3600,
    # INCREMENTAL_MAX_AGE refreshes spread over this share of it (per URL),
    # so pages stored on one day do not all fall due on one day.
    "INCREMENTAL_MAX_AGE_JITTER": 0.25,
    # Every known page is due (requested conditionally), lastmods aside:
    # "check everything now" for any spider.
    "INCREMENTAL_RECHECK_ALL": False,
    # Once a crawl runs out of work, request the known pages whose revisit
    # is due (a 304 listing hid their links); per spider in custom_settings.
    "INCREMENTAL_RESEED_ENABLED": True,
    # Due pages re-seeded from the store per crawl, at most.
    "INCREMENTAL_RESEED_LIMIT": 10_000,
    # Replay on 304: the requests a page's callback yielded are stored with
    # the page and yielded again when it answers 304 (or is not due), so the
    # pages behind an unchanged page are still reached. A page yielding more
    # requests than this is fetched in full on every visit instead.
    "INCREMENTAL_REPLAY_ENABLED": True,
    "INCREMENTAL_REPLAY_MAX_REQUESTS": 50_000,
    "INCREMENTAL_REPLAY_SHORTCUTS": True,
    # Lying sitemap lastmods: after this many pages fetched because their
    # lastmod moved, a host is distrusted when more than this share of them
    # had not changed; the distrust lasts this many seconds.
    "INCREMENTAL_LASTMOD_MIN_SAMPLES": 10,
    "INCREMENTAL_LASTMOD_MAX_LIE_SHARE": 0.5,
    "INCREMENTAL_LASTMOD_DISTRUST_TTL": 7 * 24 * 3600,
    # Trusted lastmods are authoritative (a page whose lastmod did not move
    # is not requested, whatever its revisit schedule); each crawl checks
    # this share of those pages (at least one per list, or per host when
    # re-seeding; least recently checked first), and this many found
    # changed behind an unmoved lastmod distrust the host's lastmods.
    "INCREMENTAL_LASTMOD_RECHECK_SHARE": 0.01,
    "INCREMENTAL_LASTMOD_STALE_AFTER": 3,
    # Near-duplicate mode (opt-in): an item whose SimHash of this field is
    # within this many bits of the stored one counts as unchanged. It also
    # hides a tiny real change: see docs/guide.md, near-duplicate mode.
    "INCREMENTAL_NEAR_DUPLICATES": False,
    "INCREMENTAL_SIMHASH_FIELD": "text",
    "INCREMENTAL_SIMHASH_DISTANCE": 3,
    # Lying validators: each page goes without conditions on one visit in
    # every N (0 = never), so a change hidden behind an unchanged validator
    # is found within N visits of the page (see trust.py for the bound).
    # 1/N of the conditional requests cost a full body: 200 keeps a
    # re-crawl's bytes near the share of pages that changed.
    "INCREMENTAL_RECHECK_EVERY": 200,
    # A host caught lying gets no conditional requests until this many
    # changes in a row came with validators that moved with them (unchanged
    # pages are no evidence: a liar's look the same), or at most this many
    # seconds.
    "INCREMENTAL_VALIDATORS_RETRUST_AFTER": 100,
    "INCREMENTAL_VALIDATORS_DISTRUST_TTL": 7 * 24 * 3600,
    # Unstable validators: a page is flagged after this many full fetches in
    # a row whose validators changed while its content did not; a host once
    # more than this share of at least this many of its pages judged in a
    # crawl are flagged.
    "INCREMENTAL_UNSTABLE_AFTER": 2,
    "INCREMENTAL_UNSTABLE_HOST_SHARE": 0.5,
    "INCREMENTAL_UNSTABLE_HOST_MIN_PAGES": 10,
    # Politeness: per-domain AIMD windows (requests/s), Retry-After, robots
    # Crawl-delay. See incremental_crawler/politeness/window.py.
    "INCREMENTAL_THROTTLE_ENABLED": True,
    "INCREMENTAL_THROTTLE_START_RATE": 4.0,
    "INCREMENTAL_THROTTLE_MIN_RATE": 0.1,
    "INCREMENTAL_THROTTLE_MAX_RATE": 50.0,
    "INCREMENTAL_THROTTLE_TARGET_LATENCY": 2.0,
    "INCREMENTAL_THROTTLE_MAX_CONCURRENCY": 16,
    "INCREMENTAL_THROTTLE_DOMAINS": {},
    "INCREMENTAL_THROTTLE_HOST_GROUPS": {},
    "INCREMENTAL_THROTTLE_RETRY_AFTER_MAX": 300.0,
    "INCREMENTAL_THROTTLE_MAX_RETRIES": 10,
    "INCREMENTAL_THROTTLE_CRAWL_DELAY_MAX": 30.0,
    "INCREMENTAL_THROTTLE_WARN_ERROR_SHARE": 0.2,
    "INCREMENTAL_THROTTLE_DEBUG": False,
    # Seconds: a slot faster than one request per tick sends its requests in
    # groups, one group per tick, at the same rate (fewer wake-ups); 0: one
    # at a time always. See incremental_crawler/politeness/downloader.py.
    "INCREMENTAL_THROTTLE_TICK": 0.1,
    # Seconds a slot's rate at the end of a crawl is remembered: the next
    # crawl's window starts there (politeness/remembered.py). 0: never.
    "INCREMENTAL_THROTTLE_REMEMBER_FOR": 7 * 86400.0,
    # One budget per slot for all workers (redis://host:port/db): the window,
    # its pacing and Retry-After freezes shared. None: each process its own.
    "INCREMENTAL_THROTTLE_SHARED_URL": None,
    "INCREMENTAL_THROTTLE_SHARED_PREFIX": "incremental:budget",
    # Live metrics for Prometheus (docs/metrics.md): off unless a port, or a
    # range of ports to take the first free one of, is set.
    "INCREMENTAL_METRICS_PORT": None,
    "INCREMENTAL_METRICS_HOST": "127.0.0.1",
    # Download slots with a label of their own; the rest are summed as "other".
    "INCREMENTAL_METRICS_SLOTS": 20,
    # A directory for Prometheus file_sd target files (one per crawl), or None.
    "INCREMENTAL_METRICS_TARGETS_DIR": None,
}



class SettingError(ValueError):
    """An ``INCREMENTAL_*`` setting has a value that cannot be used.

    Not ``NotConfigured``: Scrapy would only log that a component is
    disabled and crawl on without it (no state kept, or no politeness).
    Raised while the crawl's components are built, it stops the crawl
    before its first request, naming the setting.
    """


def unknown_settings(settings: BaseSettings) -> list[tuple[str, str | None]]:
    """The ``INCREMENTAL_*`` names set in *settings* that are none of ours,
    each with the setting it most likely meant (or None).

    Scrapy takes any name silently, so a misspelt setting (say
    ``INCREMENTAL_REPORT_ENABLED`` for ``INCREMENTAL_REPORT``) would leave its
    default in force with nothing to tell the user why.
    """
    unknown = sorted(name for name in settings if isinstance(name, str)
                     and name.startswith("INCREMENTAL_") and name not in DEFAULT_SETTINGS)
    return [(name, _meant(name)) for name in unknown]


def _meant(name: str) -> str | None:
    # Switches are named INCREMENTAL_X_ENABLED only where X is no setting of
    # its own (INCREMENTAL_REPORT is the report's switch): that mistake first.
    switch = name.removesuffix("_ENABLED")
    if switch != name and switch in DEFAULT_SETTINGS:
        return switch
    return next(iter(difflib.get_close_matches(name, DEFAULT_SETTINGS, n=1, cutoff=0.7)), None)


def setting_or_default(settings: BaseSettings, name: str) -> Any:
    """*name*'s value, or its default here when the add-on did not install it."""
    value = settings.get(name)
    return DEFAULT_SETTINGS[name] if value is None else value


def throttle_enabled(settings: BaseSettings) -> bool:
    """Whether the politeness components (ours, not AutoThrottle) are on."""
    return bool(setting_or_default(settings, "INCREMENTAL_ENABLED")) and settings.getbool(
        "INCREMENTAL_THROTTLE_ENABLED", DEFAULT_SETTINGS["INCREMENTAL_THROTTLE_ENABLED"])


def redis_retry_setting(settings: BaseSettings | None) -> float:
    """INCREMENTAL_REDIS_RETRY_TIME from *settings* (its default without them):
    read by the state store, the shared budget and the cluster coordinator."""
    name = "INCREMENTAL_REDIS_RETRY_TIME"
    raw = None if settings is None else settings.get(name)
    if raw is None:
        return float(DEFAULT_SETTINGS[name])
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name}={raw!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise SettingError(f"{name}={raw!r} must be a number of seconds, at least 0")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ThrottleSettings:
    """The ``INCREMENTAL_THROTTLE_*`` settings, checked: the politeness
    components' part of :class:`IncrementalConfig` (``None`` there when
    :func:`throttle_enabled` says they are off)."""

    debug: bool
    #: The windows' bounds (WindowPolicy's fields of those names).
    start_rate: float
    min_rate: float
    max_rate: float
    target_latency: float
    max_concurrency: int
    #: Per-domain WindowPolicy overrides (INCREMENTAL_THROTTLE_DOMAINS).
    domains: Mapping[str, Mapping[str, Any]]
    #: Each host of a group, to its group (INCREMENTAL_THROTTLE_HOST_GROUPS).
    groups: Mapping[str, str]
    #: A Crawl-delay above this counts as this: robots.txt "1e9" must not
    #: stop a crawl for ever.
    crawl_delay_max: float
    retry_after_max: float
    warn_share: float
    tick: float
    remember_for: float
    max_retries: int
    #: The budget shared by every worker (None: each process its own).
    shared_url: str | None
    shared_prefix: str

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self | None:
        """``None`` when the throttle is off (:func:`throttle_enabled`)."""
        if not throttle_enabled(settings):
            return None

        def number(name: str) -> float:
            return float(setting_or_default(settings, f"INCREMENTAL_THROTTLE_{name}"))

        min_rate, start_rate, max_rate = number("MIN_RATE"), number("START_RATE"), number(
            "MAX_RATE")
        if not 0 < min_rate <= start_rate <= max_rate:
            # An error, not NotConfigured: that would crawl on without politeness.
            raise SettingError(
                "0 < INCREMENTAL_THROTTLE_MIN_RATE <= INCREMENTAL_THROTTLE_START_RATE <= "
                f"INCREMENTAL_THROTTLE_MAX_RATE must hold ({min_rate:g}, "
                f"{start_rate:g}, {max_rate:g})"
            )
        tick = number("TICK")
        if tick < 0:
            raise SettingError(f"INCREMENTAL_THROTTLE_TICK must be >= 0 ({tick:g})")
        remember_for = number("REMEMBER_FOR")
        if not remember_for >= 0:
            raise SettingError(
                f"INCREMENTAL_THROTTLE_REMEMBER_FOR={remember_for!r} must be 0 (off) or more")
        return cls(
            debug=settings.getbool("INCREMENTAL_THROTTLE_DEBUG"),
            start_rate=start_rate, min_rate=min_rate, max_rate=max_rate,
            target_latency=number("TARGET_LATENCY"),
            max_concurrency=int(number("MAX_CONCURRENCY")),
            domains=settings.getdict("INCREMENTAL_THROTTLE_DOMAINS"),
            groups={host: group
                    for group, hosts in settings.getdict("INCREMENTAL_THROTTLE_HOST_GROUPS").items()
                    for host in hosts},
            crawl_delay_max=number("CRAWL_DELAY_MAX"),
            retry_after_max=number("RETRY_AFTER_MAX"),
            warn_share=number("WARN_ERROR_SHARE"),
            tick=tick, remember_for=remember_for,
            max_retries=int(setting_or_default(settings, "INCREMENTAL_THROTTLE_MAX_RETRIES")),
            shared_url=str(url) if (url := settings.get("INCREMENTAL_THROTTLE_SHARED_URL"))
            else None,
            shared_prefix=str(setting_or_default(settings, "INCREMENTAL_THROTTLE_SHARED_PREFIX")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSettings:
    """The ``INCREMENTAL_CLUSTER_*`` settings, checked: cluster mode's part
    of :class:`IncrementalConfig` (``None`` there without
    ``INCREMENTAL_CLUSTER_URL``)."""

    url: str
    prefix: str
    #: Seconds between a worker's heartbeats; one silent for the TTL is dead.
    heartbeat: float
    worker_ttl: float
    #: A worker out of work exits once the cluster was quiet this long.
    idle_grace: float
    #: INCREMENTAL_REDIS_RETRY_TIME: how long a Redis that stopped answering is waited for.
    retry_time: float

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self | None:
        """``None`` when cluster mode is off (no URL)."""
        url = settings.get("INCREMENTAL_CLUSTER_URL")
        if not url:
            return None

        def seconds(name: str) -> float:
            return float(setting_or_default(settings, f"INCREMENTAL_CLUSTER_{name}"))

        heartbeat, worker_ttl = seconds("HEARTBEAT"), seconds("WORKER_TTL")
        if worker_ttl <= 2 * heartbeat:
            raise ClusterError(
                "INCREMENTAL_CLUSTER_WORKER_TTL must be more than twice "
                "INCREMENTAL_CLUSTER_HEARTBEAT, or live workers would be taken for dead"
            )
        return cls(url=str(url), prefix=str(setting_or_default(settings,
                                                                "INCREMENTAL_CLUSTER_PREFIX")),
                   heartbeat=heartbeat, worker_ttl=worker_ttl, idle_grace=seconds("IDLE_GRACE"),
                   retry_time=redis_retry_setting(settings))


def port_range(value: Any) -> tuple[int, int] | None:
    """``INCREMENTAL_METRICS_PORT`` as (first, last); ``None``: metrics off.

    A port (``9410``, ``"9410"``), or a range as Scrapy's
    ``TELNETCONSOLE_PORT`` takes it (``[9410, 9419]``, ``"9410,9419"``) or
    as people write it (``"9410-9419"``). ``0`` alone: a port the system
    picks.
    """
    name = "INCREMENTAL_METRICS_PORT"
    if value is None or (isinstance(value, str)
                         and value.strip().lower() in {"", "none", "false", "off"}):
        return None
    if isinstance(value, bool):
        raise SettingError(f"{name}={value!r}: give a port or a range of ports")
    parts: list[Any]
    if isinstance(value, int):
        parts = [value]
    elif isinstance(value, str):
        parts = re.split(r"\s*[-,]\s*", value.strip())
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise SettingError(f"{name}={value!r}: give a port or a range of ports")
    # Whole numbers only: int() would take 9410.7 as 9410, True as 1.
    if not all(isinstance(part, str) or (isinstance(part, int) and not isinstance(part, bool))
               for part in parts):
        raise SettingError(f"{name}={value!r}: not a port or a range of ports")
    try:
        ports = [int(part) for part in parts]
    except ValueError:
        raise SettingError(f"{name}={value!r}: not a port or a range of ports") from None
    if len(ports) not in (1, 2):
        raise SettingError(f"{name}={value!r}: a range is two ports, first and last")
    first, last = ports[0], ports[-1]
    if not 0 <= first <= last <= 65535:
        raise SettingError(f"{name}={value!r}: ports go from 0 to 65535, first <= last")
    if first == 0 and last != 0:
        raise SettingError(f"{name}={value!r}: 0 (any free port) stands alone")
    return first, last


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """The ``INCREMENTAL_METRICS_*`` settings, checked: the live metrics'
    part of :class:`IncrementalConfig` (``None`` there when off)."""

    ports: tuple[int, int]
    host: str
    slots: int
    targets_dir: Path | None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self | None:
        """``None`` when metrics are off (no port set)."""
        ports = port_range(settings.get("INCREMENTAL_METRICS_PORT"))
        if ports is None:
            return None
        raw = setting_or_default(settings, "INCREMENTAL_METRICS_SLOTS")
        try:
            slots = int(raw)
        except (TypeError, ValueError):
            raise SettingError(f"INCREMENTAL_METRICS_SLOTS={raw!r} is not a number") from None
        if slots < 0:
            raise SettingError(f"INCREMENTAL_METRICS_SLOTS={raw!r} must be at least 0")
        targets = settings.get("INCREMENTAL_METRICS_TARGETS_DIR")
        return cls(ports=ports,
                   host=str(setting_or_default(settings, "INCREMENTAL_METRICS_HOST")),
                   slots=slots, targets_dir=Path(targets) if targets else None)


@dataclass(frozen=True, slots=True)
class IncrementalConfig:
    """The ``INCREMENTAL_*`` settings, read and validated once."""

    enabled: bool
    state_uri: str | None
    max_age: float
    batch_size: int
    flush_interval: float
    volatile_fields: frozenset[str]
    fingerprint_field: str
    fingerprint_ignore: tuple[str, ...]
    item_key_field: str
    store_items: bool
    change_field: str | None
    previous_fingerprint_field: str | None
    changed_fields_field: str | None
    redeliver: bool
    redelivered_field: str
    tombstones: bool
    gone_recheck: float
    item_history: int
    crawl_history: int
    report: bool
    report_dir: str | None
    report_keep: int
    revisit_enabled: bool
    revisit_initial: float
    revisit_min: float
    revisit_max: float
    revisit_inc_rate: float
    revisit_dec_rate: float
    due_tolerance: float
    max_age_jitter: float
    recheck_all: bool
    reseed_enabled: bool
    reseed_limit: int
    replay_enabled: bool
    replay_max_requests: int
    replay_shortcuts: bool
    lastmod_min_samples: int
    lastmod_max_lie_share: float
    lastmod_distrust_ttl: float
    lastmod_recheck_share: float
    lastmod_stale_after: int
    recheck_every: int
    near_duplicates: bool
    simhash_field: str
    simhash_distance: int
    validators_distrust_ttl: float
    validators_retrust_after: int
    unstable_after: int
    unstable_host_share: float
    unstable_host_min_pages: int
    #: The parts (see the module docstring): ``None`` when off.
    throttle: ThrottleSettings | None
    cluster: ClusterSettings | None
    metrics: MetricsSettings | None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        def get(name: str) -> Any:
            value = settings.get(name)
            return DEFAULT_SETTINGS[name] if value is None else value

        def number(name: str, *, minimum: float, kind: type = float) -> Any:
            raw = get(name)
            try:
                value = kind(raw)
            except (TypeError, ValueError):
                raise SettingError(f"{name}={raw!r} is not a number") from None
            if not math.isfinite(value) or value < minimum:
                raise SettingError(f"{name}={raw!r} must be at least {minimum}")
            return value

        def share(name: str) -> float:
            value = number(name, minimum=0)
            if value > 1:
                raise SettingError(f"{name}={get(name)!r} is a share: between 0 and 1")
            return float(value)

        def boolean(name: str) -> bool:
            return settings.getbool(name, DEFAULT_SETTINGS[name])

        def required_field(name: str) -> str:
            value = settings.get(name, DEFAULT_SETTINGS[name])
            if not isinstance(value, str) or not value.isidentifier():
                raise SettingError(f"{name}={value!r} is not a field name")
            return value

        def field(name: str) -> str | None:
            # An item field name, or None (unset, "", "none", "false": no field).
            value = settings.get(name, DEFAULT_SETTINGS[name])
            if value is None or str(value).strip().lower() in {"", "none", "false", "0"}:
                return None
            if not isinstance(value, str) or not value.isidentifier():
                raise SettingError(f"{name}={value!r} is not a field name")
            return value

        def names(name: str) -> list[str]:
            return settings.getlist(name, DEFAULT_SETTINGS[name])

        def patterns(name: str) -> tuple[str, ...]:
            if settings.get(name) is None:
                return DEFAULT_IGNORE_PATTERNS
            value = tuple(settings.getlist(name))
            for pattern in value:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise SettingError(f"{name}: {pattern!r} is not a regex ({exc})") from None
            return value

        return cls(
            enabled=boolean("INCREMENTAL_ENABLED"),
            state_uri=settings.get("INCREMENTAL_STATE_URI") or None,
            max_age=number("INCREMENTAL_MAX_AGE", minimum=0),
            batch_size=number("INCREMENTAL_BATCH_SIZE", minimum=1, kind=int),
            flush_interval=number("INCREMENTAL_FLUSH_INTERVAL", minimum=0.01),
            volatile_fields=frozenset(names("INCREMENTAL_VOLATILE_FIELDS")),
            fingerprint_field=get("INCREMENTAL_FINGERPRINT_FIELD"),
            fingerprint_ignore=patterns("INCREMENTAL_FINGERPRINT_IGNORE"),
            item_key_field=get("INCREMENTAL_ITEM_KEY_FIELD"),
            store_items=boolean("INCREMENTAL_STORE_ITEMS"),
            change_field=field("INCREMENTAL_CHANGE_FIELD"),
            previous_fingerprint_field=field("INCREMENTAL_PREVIOUS_FINGERPRINT_FIELD"),
            changed_fields_field=field("INCREMENTAL_CHANGED_FIELDS_FIELD"),
            redeliver=boolean("INCREMENTAL_REDELIVER"),
            redelivered_field=required_field("INCREMENTAL_REDELIVERED_FIELD"),
            tombstones=boolean("INCREMENTAL_TOMBSTONES"),
            gone_recheck=number("INCREMENTAL_GONE_RECHECK", minimum=0),
            item_history=number("INCREMENTAL_ITEM_HISTORY", minimum=0, kind=int),
            crawl_history=number("INCREMENTAL_CRAWL_HISTORY", minimum=1, kind=int),
            report=boolean("INCREMENTAL_REPORT"),
            report_dir=str(settings.get("INCREMENTAL_REPORT_DIR") or "") or None,
            report_keep=number("INCREMENTAL_REPORT_KEEP", minimum=0, kind=int),
            revisit_enabled=boolean("INCREMENTAL_REVISIT_ENABLED"),
            revisit_initial=number("INCREMENTAL_REVISIT_INITIAL", minimum=0),
            revisit_min=number("INCREMENTAL_REVISIT_MIN", minimum=0),
            revisit_max=number("INCREMENTAL_REVISIT_MAX", minimum=0),
            revisit_inc_rate=number("INCREMENTAL_REVISIT_INC_RATE", minimum=0),
            revisit_dec_rate=number("INCREMENTAL_REVISIT_DEC_RATE", minimum=0),
            due_tolerance=number("INCREMENTAL_DUE_TOLERANCE", minimum=0),
            max_age_jitter=share("INCREMENTAL_MAX_AGE_JITTER"),
            recheck_all=boolean("INCREMENTAL_RECHECK_ALL"),
            reseed_enabled=boolean("INCREMENTAL_RESEED_ENABLED"),
            reseed_limit=number("INCREMENTAL_RESEED_LIMIT", minimum=0, kind=int),
            replay_enabled=boolean("INCREMENTAL_REPLAY_ENABLED"),
            replay_max_requests=number("INCREMENTAL_REPLAY_MAX_REQUESTS", minimum=1, kind=int),
            replay_shortcuts=boolean("INCREMENTAL_REPLAY_SHORTCUTS"),
            lastmod_min_samples=number("INCREMENTAL_LASTMOD_MIN_SAMPLES", minimum=1, kind=int),
            lastmod_max_lie_share=number("INCREMENTAL_LASTMOD_MAX_LIE_SHARE", minimum=0),
            lastmod_distrust_ttl=number("INCREMENTAL_LASTMOD_DISTRUST_TTL", minimum=0),
            lastmod_recheck_share=share("INCREMENTAL_LASTMOD_RECHECK_SHARE"),
            lastmod_stale_after=number("INCREMENTAL_LASTMOD_STALE_AFTER", minimum=1, kind=int),
            recheck_every=number("INCREMENTAL_RECHECK_EVERY", minimum=0, kind=int),
            near_duplicates=boolean("INCREMENTAL_NEAR_DUPLICATES"),
            simhash_field=get("INCREMENTAL_SIMHASH_FIELD"),
            simhash_distance=number("INCREMENTAL_SIMHASH_DISTANCE", minimum=0, kind=int),
            validators_distrust_ttl=number("INCREMENTAL_VALIDATORS_DISTRUST_TTL", minimum=0),
            validators_retrust_after=number(
                "INCREMENTAL_VALIDATORS_RETRUST_AFTER", minimum=1, kind=int),
            unstable_after=number("INCREMENTAL_UNSTABLE_AFTER", minimum=1, kind=int),
            unstable_host_share=number("INCREMENTAL_UNSTABLE_HOST_SHARE", minimum=0),
            unstable_host_min_pages=number(
                "INCREMENTAL_UNSTABLE_HOST_MIN_PAGES", minimum=1, kind=int),
            throttle=ThrottleSettings.from_settings(settings),
            cluster=ClusterSettings.from_settings(settings),
            metrics=MetricsSettings.from_settings(settings),
        )

    @property
    def reseeds(self) -> bool:
        """Whether due pages are re-seeded from the store (re-seeding and revisits on)."""
        return self.enabled and self.reseed_enabled and self.revisit_enabled

    def reseeds_for(self, spider: object) -> bool:
        """:attr:`reseeds`, for a spider that may opt out (``incremental_reseed = False``)."""
        return self.reseeds and bool(getattr(spider, "incremental_reseed", True))
