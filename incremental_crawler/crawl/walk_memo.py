"""The stored-graph walk's answer, kept in the store for later crawls.

A re-crawl in which nothing is due walks the stored links from its start
page (:mod:`.inert`), reading every page's links record and state: about
50 µs a page, so the re-crawl of a site ten times larger costs about ten
times as much, though it sends nothing. When a walk finds every page it
reached inert, :class:`WalkMemos` keeps a memo under the start page's key:

- the store's write generation of the scope (``StateStore.write_generation``),
  read *before* the walk: any write of a page state or links record since
  (a flush of this crawl or of any other process, a repair) changes it;
- how long the pages reached stay not due
  (:class:`~incremental_crawler.change.policy.NotDueBounds`): a crawl at a
  later moment takes the memo only while those bounds hold for it (no next
  visit reached, no max age passed, no last check "in the future");
- a digest of everything else the walk's answer read: this package's code
  (every module: an upgrade or a checkout between two crawls), Scrapy's
  and w3lib's versions, the change policy's settings and the due
  tolerance, whether links are replayed and the Accept-Encoding requests
  go out with, the request fingerprinter's canary, the offsite check (the
  host pattern Scrapy's OffsiteMiddleware built from ``allowed_domains``),
  and the spider's shape as recipes are rebuilt against it (which of its
  attributes are methods, its CrawlSpider rules' callbacks);
- the hosts of the pages reached (a store may count writes per host).

A memo is kept only when this crawl had staged nothing in the store both
before the walk and after it (the walk reads staged pages: a memo taken
from them would outlive them if they were never flushed), and taken only
when it has staged nothing either. No memo is kept or taken when the
project's OffsiteMiddleware overrides ``should_follow`` (it may read
anything). A memo is an optimisation: when reading or writing one fails,
the crawl walks as it would without it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import scrapy
import w3lib

import incremental_crawler
from incremental_crawler.change.policy import NotDueBounds
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from collections.abc import Collection

    from scrapy import Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.crawl.due import RequestRules
    from incremental_crawler.crawl.ledger import Ledger
    from incremental_crawler.state.records import PageKey

__all__ = ["Memo", "WalkMemos"]

logger = logging.getLogger(__name__)

#: The memo's own format: a memo of another is not taken.
_FORMAT = 2


#: The files of the package whose bytes the code digest reads.
_CODE_SUFFIXES = (".py", ".lua")


@cache
def _code_digest() -> str:
    """Of every source file of this package, read through importlib's
    resources (a directory, or a zipped egg as scrapyd deploys one); once a
    process, as its first crawl starts. A package shipped without sources
    is known by its version alone."""
    digest = hashlib.sha256(incremental_crawler.__version__.encode())
    pending = [resources.files(incremental_crawler)]
    while pending:
        folder = pending.pop()
        for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
            if entry.is_dir():
                if entry.name != "__pycache__":
                    pending.append(entry)
            elif entry.name.endswith(_CODE_SUFFIXES):
                digest.update(entry.name.encode())
                digest.update(entry.read_bytes())
    return digest.hexdigest()


def _method_like(value: Any) -> bool:
    """Whether a class attribute, read statically, gives a method or
    another callable when read from an instance (any callable; a
    descriptor that is not a data descriptor: partialmethod, a cache
    decorator's wrapper)."""
    if isinstance(value, (classmethod, staticmethod)) or callable(value):
        return True
    kind = type(value)
    return hasattr(kind, "__get__") and not hasattr(kind, "__set__")


def _spider_shape(spider: Spider) -> list[Any]:
    """What rebuilding a recipe reads of *spider* besides its requests:
    which names give a method (callbacks and errbacks are stored by name;
    an instance attribute, ``-a name=value`` among them, shadows its
    class's), and the callback of each CrawlSpider rule (stored by index).
    Read without running descriptors (a property may have side effects)."""
    cls = type(spider)
    methods = {name for name in dir(cls)
               if not name.startswith("__")
               and _method_like(inspect.getattr_static(cls, name, None))}
    for name, value in vars(spider).items():
        if callable(value):
            methods.add(name)
        else:
            methods.discard(name)
    rules = [getattr(rule.callback, "__name__", "") for rule in getattr(spider, "_rules", ())]
    return [cls.__module__, cls.__qualname__, spider.name, sorted(methods), rules]


def _finite(value: float) -> float | None:
    # JSON has no infinities: None stands for one (the bounds' defaults).
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class Memo:
    """One walk's answer, as stored (JSON)."""

    #: The digest of what else the walk read (see the module docstring).
    config: str
    #: The write generation read before the walk; ``None``: a walk that
    #: reached hosts it had not read the generation of (the memo only
    #: names them, for the next walk).
    generation: str | None
    hosts: list[str]
    bounds: NotDueBounds

    def dumps(self) -> str:
        bounds = self.bounds
        return json.dumps({"v": _FORMAT, "config": self.config, "generation": self.generation,
                           "hosts": self.hosts, "due_before": _finite(bounds.due_before),
                           "started_before": _finite(bounds.started_before),
                           "checked_upto": _finite(bounds.checked_upto)})

    @classmethod
    def loads(cls, data: str) -> Memo | None:
        """The memo *data* holds; ``None`` when it is of another format or damaged."""
        try:
            raw = json.loads(data)
            if raw.get("v") != _FORMAT:
                return None

            def bound(name: str, infinite: float) -> float:
                value = raw[name]
                return infinite if value is None else float(value)

            bounds = NotDueBounds(bound("due_before", math.inf),
                                  bound("started_before", math.inf),
                                  bound("checked_upto", -math.inf))
            hosts = [str(host) for host in raw["hosts"]]
            generation = raw["generation"]
            return cls(str(raw["config"]), None if generation is None else str(generation),
                       hosts, bounds)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class WalkMemos:
    """The memos of one crawl's walks (see the module docstring)."""

    def __init__(self, crawler: Crawler, ledger: Ledger, rules: RequestRules,
                 spider: Spider) -> None:
        self.crawler = crawler
        self.ledger = ledger
        self.rules = rules
        self.spider = spider
        self._config: str | None = None
        # As the crawl starts: the code that runs, not a later deploy's.
        _code_digest()

    @staticmethod
    def name(key: PageKey) -> str:
        """The memo's name in its scope: the start page's key."""
        return f"{key.variant} {key.url}"

    @property
    def per_host(self) -> bool:
        """Whether the store's write generation depends on the hosts asked."""
        return self.ledger.store.write_generation_per_host

    def config(self, offsite: str) -> str:
        """The digest of what a walk's answer reads besides the store (see
        the module docstring); *offsite* says what the offsite check answers from."""
        if self._config is None:
            ledger, rules, spider = self.ledger, self.rules, self.spider
            parts = [_code_digest(), scrapy.__version__, w3lib.__version__, repr(rules.policy),
                     ledger.config.due_tolerance, rules.replay,
                     None if rules.encoding is None else rules.encoding.decode("latin-1"),
                     ledger.links_canary, offsite, _spider_shape(spider)]
            text = json.dumps(parts, sort_keys=True, default=repr)
            self._config = hashlib.sha256(text.encode()).hexdigest()
        return self._config

    def unstaged(self) -> bool:
        """Whether this crawl has staged nothing in the store (see the module docstring)."""
        return not self.ledger.store.pending

    async def generation(self, scope: str, hosts: Collection[str]) -> str | None:
        """The store's write generation of *scope* (for *hosts*); ``None``
        when it keeps none or cannot be read now."""
        try:
            return await self.ledger.store.write_generation(scope, sorted(hosts))
        except StateStoreError as exc:
            logger.debug("No walk memo: the write generation could not be read (%s)", exc)
            return None

    async def read(self, key: PageKey) -> Memo | None:
        try:
            data = await self.ledger.store.get_walk_memo(key.scope, self.name(key))
        except StateStoreError as exc:
            logger.debug("No walk memo: it could not be read (%s)", exc)
            return None
        return None if data is None else Memo.loads(data)

    async def why_not_taken(self, memo: Memo, key: PageKey, offsite: str) -> str | None:
        """Why *memo* (of the start page *key*) does not hold for this crawl
        (``None``: it does); the reason is a stats key's last part."""
        if memo.generation is None:
            return "hosts"
        if not self.unstaged():
            return "staged"
        if memo.config != self.config(offsite):
            return "settings"
        if not memo.bounds.hold(self.ledger.due_rules()):
            return "due"
        if await self.generation(key.scope, memo.hosts) != memo.generation:
            return "written"
        return None

    async def keep(self, key: PageKey, memo: Memo) -> bool:
        """Store *memo*; whether it was stored."""
        try:
            await self.ledger.store.put_walk_memo(key.scope, self.name(key), memo.dumps())
        except StateStoreError as exc:
            logger.debug("The walk memo could not be stored (%s)", exc)
            return False
        return True
