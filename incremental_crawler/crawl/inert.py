"""Whether what a not-due page leads to can matter this crawl, read from the store.

A page that is not due but has stored links is answered with a stand-in
response so that its links are yielded again (:mod:`.replay`): the pages
behind it may be due, or new. Each stand-in costs Scrapy's whole path of a
request (scheduler, downloader middlewares, scraper, spider middlewares),
so a re-crawl in which nothing is due would still cost one such trip per
known page with links.

:class:`StoredGraphWalk` answers first, from the store alone: starting at a
not-due page, it follows the stored links records (each request's recipe,
built again, keyed as the downloader middleware keys it) breadth first,
reading page states in batches, and gives up at the first page that is
due, unknown to the store (a new page), whose links are unknown or
incomplete, whose stored request cannot be built again, or that the
conditional middleware would not handle. If it never gives up, every page
it reached is *inert*: the full replay from them would only meet pages that
are not due (stand-ins, or requests the not-due filter drops) and offsite
requests (dropped by Scrapy's OffsiteMiddleware as the walk drops them),
so it could send nothing and emit nothing. Their requests are then dropped
as not due (:mod:`~incremental_crawler.crawl.due_filter`), without a
stand-in.

Sound because the walk reaches at least what the replay would: it ignores
the depth limit, the spider middlewares and the dupefilter, which only
ever drop requests, so a due or new page the replay could reach is one the
walk reaches too, and it gives up. (It assumes, as the replay does, that
the spider middlewares make the same request of a stored one each time.)
A robots.txt rule is not read: an unknown page that robots.txt forbids
still makes the walk give up, and the crawl replays as usual.

The walk runs from a crawl's start requests (the pages a re-crawl in which
nothing changed begins with), at most once per page per crawl; once a walk
gave up, none is tried again this crawl (the replay runs as usual; its
cost is then what the due pages make it). A walk that found everything
inert is remembered in the store (:mod:`.walk_memo`): a later crawl takes
its answer without reading the pages again while nothing was written to
the store's pages and links and none of the pages reached fell due. Off
with ``INCREMENTAL_REPLAY_SHORTCUTS = False``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy.http.request import NO_CALLBACK

from incremental_crawler.change.policy import NotDueBounds, links_unknown, not_due_bounds
from incremental_crawler.crawl.due import RULES_META
from incremental_crawler.crawl.walk_memo import Memo, WalkMemos
from incremental_crawler.hosts import host_of
from incremental_crawler.offsite import offsite_check, offsite_drops, offsite_url_drops
from incremental_crawler.recipes import (
    Unbuildable,
    build,
    plain_get_url,
    recipe_in,
    record_canary,
    unbuildable,
    unseen_entries,
)
from incremental_crawler.state.records import PageFlags, has_flag, is_gone

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from incremental_crawler.crawl.due import RequestRules
    from incremental_crawler.crawl.ledger import Ledger
    from incremental_crawler.state.records import PageKey, PageState

__all__ = ["StoredGraphWalk"]

logger = logging.getLogger(__name__)


class StoredGraphWalk:
    """See the module docstring. One per crawl (the not-due filter's)."""

    def __init__(self, crawler: Crawler, ledger: Ledger, rules: RequestRules,
                 spider: Spider, *, memos: bool = True) -> None:
        self.crawler = crawler
        self.ledger = ledger
        self.rules = rules
        self.spider = spider
        #: Pages whose stored links lead to nothing that can matter this crawl.
        self.inert: set[PageKey] = set()
        #: Why a walk gave up (then no walk is tried again this crawl).
        self.gave_up: str | None = None
        self._offsite: Callable[[Request], bool] | None = None
        #: Scrapy's own offsite check by URL, or ``None`` when a project's
        #: OffsiteMiddleware decides otherwise (then every request is built).
        self._url_offsite: Callable[[str], bool] | None = None
        #: Walks' answers kept in the store for later crawls (None: off).
        self.memos = WalkMemos(crawler, ledger, rules, spider) if memos else None

    def is_inert(self, key: PageKey) -> bool:
        return key in self.inert

    async def walk(self, key: PageKey, state: PageState) -> bool:
        """Whether the page *key* (not due, with links) and all it leads to are inert."""
        if key in self.inert:
            return True
        if self.gave_up is not None:
            return False
        stats = self.crawler.stats
        assert stats is not None
        hosts = {host_of(key.url)}
        generation = None
        memos = self.memos
        offsite = offsite_check(self.crawler) if memos is not None else None
        if memos is not None and offsite is not None:
            memo = await memos.read(key)
            if memo is not None:
                why_not = await memos.why_not_taken(memo, key, offsite)
                if why_not is None:
                    self.inert.add(key)
                    stats.inc_value("incremental/replay/walk/memo/taken")
                    return True
                stats.inc_value(f"incremental/replay/walk/memo/not_taken/{why_not}")
                hosts.update(memo.hosts)
            if memos.unstaged():
                # Before the walk: a write while it reads makes its memo stale.
                generation = await memos.generation(key.scope, hosts)
        reached = {key}
        states: dict[PageKey, PageState | None] = {key: state}
        self._url_offsite = offsite_url_drops(self.crawler)
        why = await self._walk(key, states, reached)
        stats.inc_value("incremental/replay/walk/pages_read", len(reached))
        if why is not None:
            self.gave_up = why
            stats.inc_value("incremental/replay/walk/gave_up")
            logger.debug("The stored links of %(url)s lead to %(why)s: replayed as usual",
                         {"url": key.url, "why": why}, extra={"spider": self.spider})
            return False
        self.inert |= reached
        stats.inc_value("incremental/replay/walk/inert_pages", len(reached))
        if memos is not None and offsite is not None and generation is not None \
                and memos.unstaged():
            await self._keep_memo(key, reached, states, hosts, generation, offsite)
        return True

    async def _keep_memo(self, key: PageKey, reached: set[PageKey],
                         states: dict[PageKey, PageState | None], hosts: set[str],
                         generation: str, offsite: str) -> None:
        """Keep the answer of a walk from *key* that found everything
        inert, for later crawls (:mod:`.walk_memo`): *generation* is the
        store's, of *hosts*, read before the walk began. Not when a page
        reached is due by the table's rows alone (one a stored decision
        kept from being requested: the memo's bounds cannot say how long)."""
        memos = self.memos
        assert memos is not None
        rules = self.ledger.due_rules()
        bounds = NotDueBounds()
        for page in reached:
            stored = states[page]
            found = None if stored is None else not_due_bounds(
                stored, rules, links_unknown=links_unknown(stored, replay=self.rules.replay))
            if found is None:
                return
            bounds = bounds.join(found)
        reached_hosts = {host_of(page.url) for page in reached}
        kept: str | None = generation
        if memos.per_host and not reached_hosts <= hosts:
            # Their writes were not counted before the walk: name them, so
            # that the next walk counts them.
            kept = None
        memo = Memo(memos.config(offsite), kept, sorted(hosts | reached_hosts), bounds)
        if await memos.keep(key, memo):
            stats = self.crawler.stats
            assert stats is not None
            stats.inc_value("incremental/replay/walk/memo/kept" if kept is not None
                            else "incremental/replay/walk/memo/hosts_named")

    async def _walk(self, start: PageKey, states: dict[PageKey, PageState | None],
                    reached: set[PageKey]) -> str | None:
        """Walk from *start*; ``None`` when everything reached is inert, else why not.

        Every distinct stored request is decided, not only the first one of
        a page: two requests for one page may differ in what makes a page
        due (``incremental_refresh``). Pages are read once.
        """
        frontier: list[PageKey] = [start]
        tokens: set[str] = set()
        while frontier:
            requests: list[tuple[PageKey, Request | str]] = []
            # A level's records in one read (one round trip on a remote store).
            records = await self.ledger.store.get_links_many(frontier)
            for page in frontier:
                why = self._requests_of(page, records.get(page), tokens, requests)
                if why is not None:
                    return why
            unread = list({key for key, _ in requests if key not in states})
            if unread:
                found = await self.ledger.store.get_pages(unread)
                states.update((key, found.get(key)) for key in unread)
            frontier = []
            for key, request in requests:
                target = states[key]
                why = self._decide(request, target)
                if why is not None:
                    return why
                if key not in reached:
                    reached.add(key)
                    if target is not None and self._has_replayed_links(request, target):
                        frontier.append(key)
        return None

    def _requests_of(self, page: PageKey, data: str | None, tokens: set[str],
                      requests: list[tuple[PageKey, Request | str]]) -> str | None:
        """Add *page*'s stored requests (its record *data*) not met yet (by
        entry token), keyed, to *requests*; why the walk must give up, if it
        must.

        A plain GET (no headers, no ``dont_filter``, none of the meta keys
        the rules read: :data:`~.due.RULES_META`) is added as its URL, not
        built: its key, its offsite check and its page's due decision read
        nothing else of it (building a ``Request`` was most of a walk's
        cost). Any other is built and asked as the replay would ask it.
        """
        # Only the entries whose token was not met yet: a page's links are
        # mostly those of the pages around it (navigation, index pages).
        entries = unseen_entries(data, tokens) if data is not None else None
        if entries is None or data is None:
            return f"a links record that cannot be read ({page.url})"
        if record_canary(data) not in (None, self.ledger.links_canary):
            return f"a links record of another request fingerprinter ({page.url})"
        url_offsite = self._url_offsite
        for _, entry in entries:
            recipe = recipe_in(entry)
            if not isinstance(recipe, dict):
                return f"a stored request that cannot be made again ({Unbuildable.MALFORMED})"
            url = plain_get_url(recipe, RULES_META) if url_offsite is not None else None
            if url is not None and url_offsite is not None and not self._no_callback(recipe):
                if (why := unbuildable(recipe, self.spider)) is not None:
                    return f"a stored request that cannot be made again ({why})"
                try:
                    offsite = url_offsite(url)
                except ValueError:
                    return f"a stored request that cannot be made again ({url})"
                if not offsite:
                    requests.append((self.rules.plain_key(url, self.ledger), url))
                continue
            built = build(recipe, self.spider)
            if isinstance(built, Unbuildable):
                return f"a stored request that cannot be made again ({built})"
            if not self.rules.applies(built):
                return f"a request the conditional middleware does not handle ({built})"
            if not self._is_offsite(built):
                requests.append((self.rules.key(built, self.ledger), built))
        return None

    def _no_callback(self, recipe: dict[str, Any]) -> bool:
        """Whether the recipe's callback is Scrapy's NO_CALLBACK (then its
        request is built, and the conditional middleware does not handle it)."""
        name = recipe.get("cb")
        return isinstance(name, str) and getattr(self.spider, name, None) is NO_CALLBACK

    def _decide(self, request: Request | str, state: PageState | None) -> str | None:
        """Why *request*'s page (a plain GET's URL, or a request) can matter
        this crawl (``None``: it cannot)."""
        url = request if isinstance(request, str) else request.url
        if state is None:
            return f"a page the store does not know ({url})"
        replay = self._replays(request) and not is_gone(state)
        unknown = links_unknown(state, replay=replay)
        if isinstance(request, str):
            due = self.rules.plain_due(state, links_unknown=unknown, ledger=self.ledger)
        else:
            due = self.rules.due(request, state, links_unknown=unknown, ledger=self.ledger)
        return f"a page due this crawl ({url})" if due else None

    def _replays(self, request: Request | str) -> bool:
        # A plain GET carries no META_DISCOVERY.
        return self.rules.replay if isinstance(request, str) else self.rules.replays(request)

    def _has_replayed_links(self, request: Request | str, state: PageState) -> bool:
        # As the not-due filter decides: a gone page's links are never replayed.
        return (self._replays(request) and has_flag(state.flags, PageFlags.HAS_LINKS)
                and not is_gone(state))

    def _is_offsite(self, request: Request) -> bool:
        """Whether Scrapy's OffsiteMiddleware (when enabled) drops *request*."""
        if self._offsite is None:
            self._offsite = offsite_drops(self.crawler)
        return self._offsite(request)
