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
  of the walk and the rules, Scrapy's version, the change policy's
  settings and the due tolerance, whether links are replayed and the
  Accept-Encoding requests go out with, the request fingerprinter's canary,
  the offsite check in use and the spider's ``allowed_domains``, and the
  spider's shape as recipes are rebuilt against it (its methods' names,
  its CrawlSpider rules' callbacks);
- the hosts of the pages reached (a store may count writes per host).

A later walk from that page takes the memo when all of these hold and
this crawl has staged nothing in the store yet (a page written by this
crawl but not flushed is not counted in the generation): the page is then
inert at the cost of two reads, whatever the size of the site.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import sys
import types
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import scrapy

from incremental_crawler.change.policy import NotDueBounds

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
_FORMAT = 1
#: The modules whose code decides a walk's answer: a memo taken by other
#: code is not taken (an upgrade, or a checkout between two crawls).
_CODE = ("incremental_crawler.crawl.inert", "incremental_crawler.crawl.due",
         "incremental_crawler.crawl.walk_memo", "incremental_crawler.change.policy",
         "incremental_crawler.recipes", "incremental_crawler.offsite",
         "incremental_crawler.state.keys", "incremental_crawler.state.records")


#: What a method is, read statically off a class.
_CALLABLE = (types.FunctionType, types.BuiltinFunctionType, functools.partial)


@cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for name in _CODE:
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        path = inspect.getsourcefile(module)
        digest.update(name.encode())
        if path is not None:
            digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def _spider_shape(spider: Spider) -> list[Any]:
    """What rebuilding a recipe reads of *spider* besides its requests:
    which names are its methods (callbacks and errbacks are stored by
    name), and the callback of each CrawlSpider rule (stored by index)."""
    # Read without running descriptors (a property may have side effects).
    cls = type(spider)
    methods = sorted(
        {name for name in dir(cls) if not name.startswith("__")
         and isinstance(inspect.getattr_static(cls, name, None),
                        (classmethod, staticmethod, *_CALLABLE))}
        | {name for name, value in vars(spider).items() if callable(value)})
    rules = [getattr(rule.callback, "__name__", "") for rule in getattr(spider, "_rules", ())]
    return [type(spider).__module__, type(spider).__qualname__, spider.name, methods, rules]


class Memo:
    """One walk's answer, as stored (JSON)."""

    __slots__ = ("bounds", "config", "generation", "hosts")

    def __init__(self, config: str, generation: str | None, hosts: list[str],
                 bounds: NotDueBounds) -> None:
        #: ``None``: a walk that reached hosts it had not read the
        #: generation of; the memo only names them, for the next walk.
        self.config = config
        self.generation = generation
        self.hosts = hosts
        self.bounds = bounds

    def dumps(self) -> str:
        bounds = self.bounds
        return json.dumps({"v": _FORMAT, "config": self.config, "generation": self.generation,
                           "hosts": self.hosts, "due_before": bounds.due_before,
                           "started_before": bounds.started_before,
                           "checked_upto": bounds.checked_upto})

    @classmethod
    def loads(cls, data: str) -> Memo | None:
        """The memo *data* holds; ``None`` when it is of another format or damaged."""
        try:
            raw = json.loads(data)
            if raw.get("v") != _FORMAT:
                return None
            bounds = NotDueBounds(float(raw["due_before"]), float(raw["started_before"]),
                                  float(raw["checked_upto"]))
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

    @staticmethod
    def name(key: PageKey) -> str:
        """The memo's name in its scope: the start page's key."""
        return f"{key.variant} {key.url}"

    def config(self, offsite: str) -> str:
        """The digest of what a walk's answer reads besides the store (see
        the module docstring); *offsite* names the offsite check in use."""
        if self._config is None:
            ledger, rules, spider = self.ledger, self.rules, self.spider
            config = ledger.config
            parts = [_code_digest(), scrapy.__version__, repr(rules.policy),
                     config.due_tolerance, rules.replay,
                     None if rules.encoding is None else rules.encoding.decode("latin-1"),
                     ledger.links_canary, offsite,
                     sorted(getattr(spider, "allowed_domains", None) or []),
                     _spider_shape(spider)]
            text = json.dumps(parts, sort_keys=True, default=repr)
            self._config = hashlib.sha256(text.encode()).hexdigest()
        return self._config

    async def generation(self, scope: str, hosts: Collection[str]) -> str | None:
        return await self.ledger.store.write_generation(scope, sorted(hosts))

    async def read(self, key: PageKey) -> Memo | None:
        data = await self.ledger.store.get_walk_memo(key.scope, self.name(key))
        return None if data is None else Memo.loads(data)

    async def why_not_taken(self, memo: Memo, key: PageKey, offsite: str) -> str | None:
        """Why *memo* (of the start page *key*) does not hold for this crawl
        (``None``: it does); the reason is a stats key's last part."""
        if memo.generation is None:
            return "hosts"
        if self.ledger.store.pending:
            return "staged"
        if memo.config != self.config(offsite):
            return "settings"
        if not memo.bounds.hold(self.ledger.due_rules()):
            return "due"
        if await self.generation(key.scope, memo.hosts) != memo.generation:
            return "written"
        return None

    async def keep(self, key: PageKey, memo: Memo) -> None:
        await self.ledger.store.put_walk_memo(key.scope, self.name(key), memo.dumps())
