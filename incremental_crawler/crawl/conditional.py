"""Conditional requests: send stored validators, drop 304s.

RFC 9110 §13.1 and RFC 9111 §4.3. Runs between MetaRefreshMiddleware (580)
and HttpCompressionMiddleware (590): it sees bodies after decompression
(fingerprints are of the entity, not of its encoding), after
RedirectMiddleware (so state is kept for the final URL), and before
RetryMiddleware (a 304 is never retried; a 5xx is retried untouched).
What a failed page's final answer records (after every retry) is
:mod:`.outcomes`' business: this one sees every attempt.

It reads headers and request meta, asks :class:`~.policy.ChangePolicy` what
they mean, and applies the answer: stats, the host trust book, the ledger,
NotDue and NotModified.

Whether a page is due is judged per crawl (the ledger's ``crawl_started``
and ``due_at``), and next visits are counted from the crawl's start. A
request whose meta carries a why (``META_WHY``: our list spiders, the
re-seeder) was decided for this crawl already and is not held back; a
sampled one (``Why.SAMPLED``) whose content turns out changed is a
stale-lastmod finding against its host.

Replay on 304: a page whose callback yielded requests has them stored (the
ledger records them). When it answers 304, or is not due, those requests
are yielded again through a stand-in response
(:mod:`incremental_crawler.crawl.replay`) instead of NotModified or NotDue:
the pages behind an unchanged page are still reached. A page whose requests
are not all stored is fetched in full whatever its schedule
(``RequestReason.LINKS_UNKNOWN``).

A page flagged GONE (:mod:`.tombstones`) is requested only when its next
visit is due (named, or re-seeded then) or a list's newer date asks, as a
new page: without
conditions, its links never replayed, and a 2xx stores it afresh (the flag
cleared, its items new).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured

from incremental_crawler import clock
from incremental_crawler.change.accounting import (
    META_LASTMOD_MODIFIED,
    META_LISTING,
    PageOutcome,
    Why,
    counted_key,
    decided,
    mark,
)
from incremental_crawler.change.fingerprints import body_fingerprint
from incremental_crawler.change.policy import (
    HOST_CONSULTED,
    ChangePolicy,
    Fetch,
    Judgement,
    Refetch,
    RequestReason,
    final_outcome,
    future_last_modified,
    links_unknown,
)
from incremental_crawler.config import IncrementalConfig
from incremental_crawler.crawl.due import RequestRules
from incremental_crawler.crawl.ledger import TXN_META, Ledger
from incremental_crawler.crawl.replay import Replayer
from incremental_crawler.exceptions import NotDue, NotModified
from incremental_crawler.hosts import host_of
from incremental_crawler.http.validators import parse_etag, parse_last_modified
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD, META_REFRESH
from incremental_crawler.recipes import REFETCH_MARK, own_recipe, record_canary
from incremental_crawler.state.records import PageFlags, is_gone
from incremental_crawler.state.stores import StateStoreError

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Headers, Response

    from incremental_crawler.state.records import HostTrust, PageKey, PageState

__all__ = [
    "ConditionalRequestMiddleware", "NotDue", "NotModified", "callback_name", "page_context",
]

logger = logging.getLogger(__name__)

_CTX = "_incremental_ctx"
# Set when the conditions on a request are ours (to strip them from copies).
_SENT = "_incremental_sent"
# Set on the full re-fetch that follows a 304 we could not take (recipes
# leave out the incremental_refresh that goes with it).
_REFETCHED = REFETCH_MARK


@dataclass(slots=True)
class _Context:
    """What process_request decided, for process_response."""

    key: PageKey
    prior: PageState | None
    reason: RequestReason
    #: The page's links record, to replay on a 304 (None: nothing to replay).
    links: str | None = None

    @property
    def conditional(self) -> bool:
        return self.reason is RequestReason.CONDITIONAL


class ConditionalRequestMiddleware:
    """See the module docstring; settings in the README. Decisions: :class:`ChangePolicy`."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        if not config.enabled:
            raise NotConfigured(
                "INCREMENTAL_ENABLED is False; set it to True to send conditional requests"
            )
        self.crawler = crawler
        self.stats = crawler.stats
        self.ledger = Ledger.for_component(crawler)
        spider = self.ledger.spider_for_component()
        self.spider = spider
        #: Shared with the spider middleware dropping not-due requests early.
        self.rules = RequestRules.for_crawler(crawler, config, spider)
        self.policy: ChangePolicy = self.rules.policy
        self.default_encoding = self.rules.encoding
        self.counter = self.ledger.counter
        self.replayer = Replayer(crawler, spider, self.ledger.stage_flags,
                                 skip_seen=config.replay_shortcuts)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, IncrementalConfig.from_settings(crawler.settings))

    # -- requests ------------------------------------------------------------

    async def process_request(self, request: Request) -> Response | None:
        try:
            return await self._prepare(request)
        except StateStoreError as exc:
            # The store cannot be read: the crawl stops (Ledger.store_failed)
            # and this page is not fetched, so nothing about it is recorded.
            self.ledger.store_failed(exc)
            raise IgnoreRequest(f"State store unavailable: {request.url}") from exc

    async def _prepare(self, request: Request) -> Response | None:
        _forget_copied(request)
        if not self.rules.applies(request):
            return None
        if self.default_encoding is not None:
            # The Accept-Encoding HttpCompressionMiddleware would add, set
            # here: the validators stored are those of the representation
            # this header selects, and the same header goes out every time
            # (RFC 9110 §8.8.3.3, §12.5.3). Another one is another variant.
            request.headers.setdefault(b"Accept-Encoding", self.default_encoding)
        key = self.rules.key(request, self.ledger)
        prior = await self._stored(key)
        now = clock.now()
        # A gone page's links are not replayed: it is new if it answers.
        replay = self.rules.replays(request) and not is_gone(prior)
        unknown = links_unknown(prior, replay=replay)
        links = None
        if replay and not unknown and prior is not None and prior.flags & PageFlags.HAS_LINKS:
            # Read now: a 304 is handled in the synchronous process_response.
            links = await self.ledger.store.get_links(key)
            if links is None:
                # Flagged, but the store lost it: the page's callback must run.
                self.stats.inc_value("incremental/replay/record_missing")
                unknown = True
            elif record_canary(links) not in (None, self.ledger.links_canary):
                # Recorded under another request fingerprinter, which told its
                # requests apart otherwise (and kept one of each): the page's
                # callback must run, to record what it yields now.
                self.stats.inc_value("incremental/replay/record_other_fingerprinter")
                links, unknown = None, True
        # Counted here unless whoever made the request decided (and counted)
        # it; sitemaps and feeds are not pages.
        why = decided(request)
        if why is not None:
            mark(request, why)  # confirmed at this URL: a redirect from here keeps it
        counts = why is None and not request.meta.get(META_DISCOVERY)
        # Why the page is requested (or not), from the table every decider reads.
        page_why = Why.NEW if prior is None else self.rules.why(
            request, prior, links_unknown=unknown, ledger=self.ledger)
        if not page_why.requested:
            assert prior is not None
            # Not requested: those that reach this far (not dropped by
            # NotDueFilterMiddleware) are a page whose links are replayed,
            # or a request that did not leave a callback or start().
            self.stats.inc_value("incremental/not_due")
            if counts:
                self.counter.not_due(prior)
            if links is None or not self.replayer.first(key):
                raise NotDue(f"Not due before {prior.next_visit:.0f}: {request.url}")
            # Not requested, but the pages it leads to may be due: its links
            # are yielded as they were. Not a download: HttpCacheMiddleware
            # must not keep this response for the URL.
            request.meta["_dont_cache"] = True
            return self.replayer.response(request, key, links, always=True)
        if why is Why.SAMPLED:
            # Its response may prove the host's lastmods stale (_settle).
            await self.ledger.trust.load(host_of(request.url))
        reason = await self._reason(request, key, prior, now, links_unknown=unknown)
        if counts:
            self.counter.requested(page_why, host_of(request.url), key, prior)
            # Its retries, redirects and re-fetch are the same page: not
            # again, and their answers are this page's.
            mark(request, page_why, key)
        request.meta[_CTX] = _Context(key, prior, reason, links)
        self._count(request, f"requests/{reason}")
        if reason is RequestReason.CONDITIONAL:
            assert prior is not None
            _send_conditions(request, prior)
        return None

    async def _stored(self, key: PageKey) -> PageState | None:
        found, prior = self.ledger.take_prefetched(key)
        return prior if found else await self.ledger.store.get_page(key)

    async def _reason(self, request: Request, key: PageKey, prior: PageState | None,
                      now: float, *, links_unknown: bool) -> RequestReason:
        host: HostTrust | None = None
        if prior is not None and prior.has_validators:
            # Loaded in any case: the response may prove the host's
            # validators wrong (ChangePolicy.verdict).
            host = await self.ledger.trust.load(host_of(request.url))
        reason = self.policy.request_reason(
            prior, refresh=bool(request.meta.get(META_REFRESH)), links_unknown=links_unknown,
            host=host, url=key.url, now=now, started=self.ledger.crawl_started)
        if host is not None and reason in HOST_CONSULTED:
            self.ledger.trust.validators_trusted(host, now)
        return reason

    def _count(self, request: Request, event: str, count: int = 1) -> None:
        # Sitemaps and feeds are counted apart, so "pages" means content.
        if request.meta.get(META_DISCOVERY):
            self.stats.inc_value("incremental/discovery/" + event, count)
        else:
            self.stats.inc_value("incremental/" + event, count)
            self.counter.hosts.count(host_of(request.url), event, count)

    # -- responses -------------------------------------------------------------

    def process_response(self, request: Request, response: Response) -> Request | Response:
        ctx: _Context | None = request.meta.get(_CTX)
        if ctx is None:
            return response
        status = response.status
        if status == 304:
            return self._not_modified(request, response, ctx)
        # A partial (206) or truncated body is not the page: storing its
        # validators would make the next visit a 304 for content we lack.
        outcome = final_outcome(status, truncated="dataloss" in response.flags)
        if 200 <= status < 300 and outcome is None:
            self._fetched(request, response, ctx)
            return response
        # Validators and fingerprints stay as they are (only a 2xx updates
        # them). A 3xx not followed is a check; the final answer of a
        # failure, 404 or 410 is recorded by FinalOutcomeMiddleware (.outcomes)
        # once no retry follows it.
        if outcome is None:
            self.ledger.stage_check(ctx.key, status)
            if not request.meta.get(META_DISCOVERY):
                self.counter.outcome(PageOutcome.REDIRECTED, _counted(request, ctx.key))
        self.stats.inc_value(f"incremental/status_kept/{status}")
        return response

    def _not_modified(self, request: Request, response: Response,
                      ctx: _Context) -> Request | Response:
        # The validators the 304 carries: they may contradict it, or be
        # taken up (RFC 9111 §4.3.4).
        etag = self._etag(response)
        last_modified = self._last_modified(response, clock.now())
        refetch = self.policy.not_modified(
            ctx.prior, conditional=ctx.conditional, sent=_conditions(request.headers),
            lastmod=request.meta.get(META_LASTMOD), etag=etag, last_modified=last_modified,
        )
        if refetch is Refetch.UNSOLICITED and request.meta.get(_REFETCHED):
            # Asked once more without conditions, a 304 again: give up loudly.
            self.stats.inc_value("incremental/unsolicited_304_dropped")
            logger.warning(
                "Dropping %(request)s: 304 to an unconditional request, twice",
                {"request": request},
                extra={"spider": self.crawler.spider},
            )
            raise IgnoreRequest("304 to an unconditional request")
        if refetch is not None:
            return self._refetch(request, refetch)
        assert ctx.prior is not None
        validators = self.policy.revalidated(ctx.prior, etag=etag, last_modified=last_modified)
        self._take_304(request, ctx.key, ctx.prior, validators)
        logger.debug("Not modified: %(request)s", {"request": request},
                     extra={"spider": self.crawler.spider})
        if ctx.links is not None and self.replayer.first(ctx.key):
            # The page is what it was, so are its links: yield them again.
            standin = self.replayer.response(request, ctx.key, ctx.links, response.headers)
            if standin is not None:
                return standin
            # Nothing they yield is new: ended as its stand-in would end it
            # (neither callback nor errback; see Replayer.response).
            request.errback = None
        raise NotModified(f"Not modified: {request.url}")

    def _refetch(self, request: Request, reason: Refetch) -> Request:
        self.stats.inc_value(f"incremental/refetch/{reason}")
        headers = request.headers.copy()
        headers.pop(b"If-None-Match", None)
        headers.pop(b"If-Modified-Since", None)
        meta = {**request.meta, META_REFRESH: True, _REFETCHED: True}
        meta.pop(_CTX, None)
        return request.replace(headers=headers, meta=meta, dont_filter=True)

    def _take_304(self, request: Request, key: PageKey, prior: PageState,
                  validators: tuple[str | None, str | None] | None) -> None:
        # The data we hold is this version: its lastmod may be recorded, and
        # the validators the 304 brought (ChangePolicy.revalidated): a state
        # write without items, as the data it describes is what is stored
        # already. The page's own unstable flag waits for its next full
        # fetch.
        now = clock.now()
        lastmod = request.meta.get(META_LASTMOD)
        schedule = self.policy.next_visit(prior, changed=False,
                                          started=self.ledger.crawl_started)
        self.ledger.stage_check(key, 304, lastmod=lastmod, schedule=schedule,
                                validators=validators)
        if validators is not None:
            self._count(request, "not_modified_validators_updated")
        modified = int(PageFlags.LASTMOD_MODIFIED)
        if lastmod is not None and request.meta.get(META_LASTMOD_MODIFIED) and not (
                prior.flags & modified):
            # The lastmod just recorded is a modification date: it may vouch
            # for the page when it is re-seeded.
            self.ledger.stage_flags(key, modified)
        listing = request.meta.get(META_LISTING)
        if listing is not None and listing != prior.listing:
            # The list that gave the date just recorded (PageState.listing).
            self.ledger.stage_listing(key, listing)
        self._observe_lastmod(request, prior, changed=False, now=now)
        self._count(request, "not_modified")
        if not request.meta.get(META_DISCOVERY):
            self.counter.outcome(PageOutcome.NOT_MODIFIED, _counted(request, key))
        self._count(request, "bytes_saved_estimate", prior.size)
        discovery = bool(request.meta.get(META_DISCOVERY))
        self._judged(request, self.policy.held(discovery=discovery), now)

    def _fetched(self, request: Request, response: Response, ctx: _Context) -> None:
        now = clock.now()
        fetch = self._read(request, response, ctx.key, now)
        # A gone page that answers is a new page (GONE cleared, counters afresh).
        prior = None if is_gone(ctx.prior) else ctx.prior
        settle = partial(self._settle, request, prior, fetch, now)
        if self.policy.defers(prior, fetch):
            assert prior is not None
            # Until the page's items tell, its state is what its body says.
            pending = self.policy.after_fetch(prior, fetch, changed=True,
                                              judgement=self.policy.unjudged(prior), now=now,
                                              started=self.ledger.crawl_started)
            txn = self.ledger.begin(request.meta, pending, discovery=fetch.discovery,
                                    record_links=self.rules.replays(request), prior=prior,
                                    counted=_counted(request, ctx.key))

            def judge(changed: bool) -> PageState:
                state, txn.outcome = settle(changed)
                return state

            txn.judge = judge
        else:
            state, outcome = settle(self.policy.body_changed(prior, fetch))
            txn = self.ledger.begin(request.meta, state, discovery=fetch.discovery,
                                    record_links=self.rules.replays(request), prior=prior,
                                    counted=_counted(request, ctx.key))
            txn.outcome = outcome
        self._stage_redirects(request, ctx.key)

    def _settle(self, request: Request, prior: PageState | None, fetch: Fetch, now: float,
                changed: bool) -> tuple[PageState, PageOutcome]:
        """The page's state once it is known whether its content *changed*,
        and its column in the crawl's accounting (the ledger counts it once
        the page is stored, or counts it withheld).

        Right away for a body that did not change (or a new page, a sitemap);
        for one that did, when its items left the pipelines (the ledger calls
        it, as PageTransaction.judge).
        """
        outcome = _outcome(prior, fetch, changed=changed)
        self._count(request, "pages_new" if outcome is PageOutcome.NEW
                    else "pages_changed" if changed else "pages_unchanged")
        if outcome is PageOutcome.PAGE_CHANGED:
            # Never a sitemap or feed: their content is their body.
            self.stats.inc_value("incremental/pages_changed_items_unchanged")
        judgement = self.policy.judge(prior, fetch, changed=changed)
        self._judged(request, judgement, now)
        if prior is not None:
            self._observe_lastmod(request, prior, changed=changed, now=now)
            if changed and decided(request) is Why.SAMPLED:
                # Changed behind a trusted lastmod that did not move.
                self.ledger.trust.stale(host_of(request.url), now)
        return self.policy.after_fetch(prior, fetch, changed=changed, judgement=judgement,
                                       now=now, started=self.ledger.crawl_started), outcome

    def _judged(self, request: Request, judgement: Judgement, now: float) -> None:
        if judgement.flagged:
            self.stats.inc_value("incremental/validators/pages_unstable")
            logger.debug("Validators of %(url)s flagged unstable after %(n)d churns",
                         {"url": request.url, "n": judgement.churns})
        self.ledger.trust.validators_judged(host_of(request.url), judgement, now=now,
                                            url=request.url)

    def _observe_lastmod(self, request: Request, prior: PageState, *, changed: bool,
                         now: float) -> None:
        # A page fetched because its lastmod moved: did it really change?
        if self.policy.tests_lastmod(prior, request.meta.get(META_LASTMOD)):
            self.ledger.trust.observe(host_of(request.url), lied=not changed, now=now)

    def _read(self, request: Request, response: Response, key: PageKey, now: float) -> Fetch:
        """The facts of a full response the policy decides on."""
        # The raw body: normalising a whole page costs milliseconds per page
        # (the items say what the content is, see ChangePolicy.defers).
        return Fetch(
            key, self._etag(response), self._last_modified(response, now),
            body_fingerprint(response.body), len(response.body), response.status,
            vary_star=_vary_star(response.headers),
            lastmod=request.meta.get(META_LASTMOD),
            callback=callback_name(request, self.crawler.spider),
            discovery=bool(request.meta.get(META_DISCOVERY)),
            recipe=own_recipe(request, self.spider, self.ledger.recipe_rules),
            lastmod_modified=bool(request.meta.get(META_LASTMOD_MODIFIED)),
            listing=request.meta.get(META_LISTING),
        )

    def _etag(self, response: Response) -> str | None:
        raw = response.headers.get(b"ETag")
        etag = parse_etag(raw)
        if raw and etag is None:
            self.stats.inc_value("incremental/invalid_validator/etag")
            logger.debug("Not storing invalid ETag of %(url)s", {"url": response.url})
        return etag

    def _last_modified(self, response: Response, now: float) -> str | None:
        raw = response.headers.get(b"Last-Modified")
        last_modified = parse_last_modified(raw)
        if last_modified is not None and future_last_modified(
            last_modified, response.headers.get(b"Date"), now
        ):
            # A date ahead of the server's own clock would make every later
            # change answer 304; the content fingerprint decides instead.
            self.stats.inc_value("incremental/invalid_validator/last_modified_future")
            return None
        if raw and last_modified is None:
            self.stats.inc_value("incremental/invalid_validator/last_modified")
            logger.debug("Not storing invalid Last-Modified of %(url)s", {"url": response.url})
        return last_modified

    def _stage_redirects(self, request: Request, key: PageKey) -> None:
        # Redirects followed on the way here: the original URLs remember
        # where they went, without touching their own validators.
        urls = request.meta.get("redirect_urls", ())
        reasons = request.meta.get("redirect_reasons", ())
        for url, reason in zip(urls, reasons, strict=False):
            original = key._replace(url=self.ledger.canonical(url))
            if original != key:
                status = reason if isinstance(reason, int) else 0
                self.ledger.stage_redirect(original, key.url, status)


def _outcome(prior: PageState | None, fetch: Fetch, *, changed: bool) -> PageOutcome:
    """A full fetch's column: its content *changed* (the items say), or only its body."""
    if prior is None or prior.fingerprint is None:
        return PageOutcome.NEW
    if changed:
        return PageOutcome.CHANGED
    if prior.fingerprint != fetch.fingerprint:
        return PageOutcome.PAGE_CHANGED
    return PageOutcome.UNCHANGED


def _counted(request: Request, key: PageKey) -> PageKey:
    """The page whose column *request*'s answer decides: the one counted
    when it was decided (a redirect's origin), else its own *key*."""
    return counted_key(request) or key


def _forget_copied(request: Request) -> None:
    """Drop what another request left in this one's meta.

    Meta copied from another request (``meta=response.meta``), a redirect
    or a retry must not carry that request's context or the conditions we
    added to it: they belong to another page.
    """
    meta = request.meta
    meta.pop(_CTX, None)
    meta.pop(TXN_META, None)
    if meta.pop(_SENT, None):
        request.headers.pop(b"If-None-Match", None)
        request.headers.pop(b"If-Modified-Since", None)
    if meta.get("redirect_urls"):
        # The lastmod a sitemap gave the original URL says nothing
        # about where it redirects to.
        meta.pop(META_LASTMOD, None)


def _send_conditions(request: Request, prior: PageState) -> None:
    # RFC 9110 §13.1.2 and §13.1.3: send every stored validator; the
    # server must ignore If-Modified-Since when If-None-Match is
    # present. A condition the user set is left as it is.
    headers = request.headers
    if b"If-None-Match" in headers or b"If-Modified-Since" in headers:
        return
    # Sent as the bytes received: an ETag may hold obs-text (0x80-0xFF,
    # kept as Latin-1 characters), which Scrapy would encode as UTF-8, a tag
    # that never matches.
    if prior.etag:
        headers[b"If-None-Match"] = prior.etag.encode("latin-1")
    if prior.last_modified:
        headers[b"If-Modified-Since"] = prior.last_modified.encode("latin-1")
    request.meta[_SENT] = True


def _conditions(headers: Headers) -> tuple[str, str]:
    """The If-None-Match and If-Modified-Since a request went out with ("": none)."""
    inm = headers.get(b"If-None-Match") or b""
    ims = headers.get(b"If-Modified-Since") or b""
    return inm.decode("latin-1"), ims.decode("latin-1")




def _vary_star(headers: Headers) -> bool:
    # Vary = #( "*" / field-name ), over any number of field lines (RFC 9110 §12.5.5).
    return any(name.strip() == b"*" for line in headers.getlist(b"Vary")
               for name in line.split(b","))


def page_context(request: Request) -> tuple[PageKey, PageState | None] | None:
    """The page *request* fetches and its stored state, as this middleware read them.

    ``None`` for a request it does not apply to (see ``RequestRules.applies``), and for
    one it did not let out (not due, replayed).
    """
    ctx: _Context | None = request.meta.get(_CTX)
    return None if ctx is None else (ctx.key, ctx.prior)


def callback_name(request: Request, spider: object) -> str | None:
    """The spider method parsing *request*, by name (to re-seed it later)."""
    callback = request.callback
    if callback is None:
        return "parse"
    name = getattr(callback, "__name__", None)
    if name and getattr(callback, "__self__", None) is spider:
        return name
    return None
