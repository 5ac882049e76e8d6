"""Conditional requests: send stored validators, drop 304s.

RFC 9110 §13.1 and RFC 9111 §4.3. Runs between MetaRefreshMiddleware (580)
and HttpCompressionMiddleware (590): it sees bodies after decompression
(fingerprints are of the entity, not of its encoding), after
RedirectMiddleware (so state is kept for the final URL), and before
RetryMiddleware (a 304 is never retried; a 5xx is retried untouched).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.downloadermiddlewares.httpcompression import ACCEPTED_ENCODINGS
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached

from incremental_crawler.config import IncrementalConfig
from incremental_crawler.exceptions import NotDue, NotModified
from incremental_crawler.change.fingerprints import body_fingerprint
from incremental_crawler.meta import META_DISCOVERY, META_LASTMOD, META_REFRESH, META_SKIP
from incremental_crawler.state.keys import page_key
from incremental_crawler.state.ledger import TXN_META, Ledger
from incremental_crawler.change.revisit import RevisitSchedule
from incremental_crawler.state.records import PageFlags, PageKey, PageState
from incremental_crawler.state.stores import StateStoreError
from incremental_crawler.http.validators import (
    parse_etag,
    parse_http_date,
    parse_last_modified,
    weak_match,
)

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["ConditionalRequestMiddleware", "NotDue", "NotModified"]

logger = logging.getLogger(__name__)

_CTX = "_incremental_ctx"
# Set when the conditions on a request are ours (to strip them from copies).
_SENT = "_incremental_sent"


@dataclass(slots=True)
class _Context:
    """What process_request decided, for process_response."""

    key: PageKey
    prior: PageState | None
    conditional: bool
    reason: str


class ConditionalRequestMiddleware:
    """See the module docstring; settings in the README."""

    def __init__(self, crawler: Crawler, config: IncrementalConfig) -> None:
        if not config.enabled:
            raise NotConfigured(
                "INCREMENTAL_ENABLED is False; set it to True to send conditional requests"
            )
        self.crawler = crawler
        self.stats = crawler.stats
        self.max_age = config.max_age
        self.unstable_after = config.unstable_after
        self.default_encoding = _default_encoding(crawler)
        self.ledger = Ledger.for_component(crawler)
        self.schedule = (
            RevisitSchedule.from_config(config) if config.revisit_enabled else None
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, IncrementalConfig.from_settings(crawler.settings))

    def _applies(self, request: Request) -> bool:
        # Only GETs whose response goes to a spider callback: engine-level
        # downloads (robots.txt, NO_CALLBACK) have no items to wait for.
        return (
            request.method == "GET"
            and request.callback is not NO_CALLBACK
            and not request.meta.get(META_SKIP)
        )

    async def process_request(self, request: Request) -> None:
        try:
            await self._prepare(request)
        except StateStoreError as exc:
            # The store cannot be read: the crawl stops (Ledger.store_failed)
            # and this page is not fetched, so nothing about it is recorded.
            self.ledger.store_failed(exc)
            raise IgnoreRequest(f"State store unavailable: {request.url}") from exc

    async def _prepare(self, request: Request) -> None:
        # Meta copied from another request (``meta=response.meta``), a
        # redirect or a retry must not carry that request's context or the
        # conditions we added to it: they belong to another page.
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
        if not self._applies(request):
            return
        if self.default_encoding is not None:
            # The Accept-Encoding HttpCompressionMiddleware would add, set
            # here: the validators stored are those of the representation
            # this header selects, and the same header goes out every time
            # (RFC 9110 §8.8.3.3, §12.5.3). Another one is another variant.
            request.headers.setdefault(b"Accept-Encoding", self.default_encoding)
        key = page_key(request, self.ledger.scope, self.ledger.canonical,
                       default_encoding=self.default_encoding)
        found, prior = self.ledger.take_prefetched(key)
        if not found:
            prior = await self.ledger.store.get_page(key)
        if prior is not None and not self._due(request, prior):
            self.stats.inc_value("incremental/not_due")
            raise NotDue(f"Not due before {prior.next_visit:.0f}: {request.url}")
        conditional, reason = False, "new"
        if prior is not None and prior.has_validators:
            reason = "conditional"
            conditional = True
            if request.meta.get(META_REFRESH):
                conditional, reason = False, "refresh"
            elif self.max_age and time.time() - prior.last_fetched > self.max_age:
                # Some servers never change their validators while the
                # content does; a full fetch now and then catches it.
                conditional, reason = False, "max_age"
            # Loaded in any case: the response may prove the host's
            # validators wrong (see _validator_verdict).
            host = urlparse_cached(request).hostname or ""
            trust = await self.ledger.trust.load(host)
            if conditional and not self.ledger.trust.validators_trusted(trust, time.time()):
                # Its validators lied: every page in full, decided by fingerprint.
                conditional, reason = False, "host_lying"
            elif conditional and self.ledger.trust.sample_due(key.url, prior.checks + 1):
                # The sampled re-check, one visit in N per page: does the
                # content still match? (the bound is in trust.py)
                conditional, reason = False, "sample"
        elif prior is not None:
            reason = "no_validators"
        request.meta[_CTX] = _Context(key, prior, conditional, reason)
        self._count(request, f"requests/{reason}")
        if not conditional:
            return
        assert prior is not None
        headers = request.headers
        # RFC 9110 §13.1.2 and §13.1.3: send every stored validator; the
        # server must ignore If-Modified-Since when If-None-Match is
        # present. A condition the user set is left as it is.
        if b"If-None-Match" in headers or b"If-Modified-Since" in headers:
            return
        if prior.etag:
            headers[b"If-None-Match"] = prior.etag
        if prior.last_modified:
            headers[b"If-Modified-Since"] = prior.last_modified
        meta[_SENT] = True

    def _judge(self, request: Request, prior: PageState | None, etag: str | None,
               last_modified: str | None, changed: bool) -> tuple[int, bool]:
        verdict = self._validator_verdict(request, prior, etag, last_modified, changed)
        return self._churns(request, prior, verdict, etag, last_modified)

    def _validator_verdict(
        self, request: Request, prior: PageState | None, etag: str | None,
        last_modified: str | None, changed: bool,
    ) -> str | None:
        """What this full fetch says about the page's validators (reported per host).

        Also the evidence that re-trusts a lying host: a change of content
        whose validators changed with it (the only fetch on which a liar and
        an honest server differ).
        """
        if request.meta.get(META_DISCOVERY):
            return None  # sitemaps and feeds are not the site's pages
        host = urlparse_cached(request).hostname or ""
        book = self.ledger.trust
        if etag is None and last_modified is None:
            verdict = "absent"
        elif prior is None or not prior.has_validators:
            return None  # nothing to compare with yet
        elif (etag, last_modified) == (prior.etag, prior.last_modified):
            if changed:
                # The content moved behind the same validators: they lie.
                book.caught_lying(book.loaded(host), time.time(), request.url)
                return "lying"
            # Reliable, but no evidence for a host caught lying: a liar
            # sends unchanged validators with unchanged content too.
            verdict = "reliable"
        elif changed:
            verdict = "reliable"
            book.consistent(book.loaded(host))
        else:
            verdict = "unstable"
        book.verdict(host, verdict)
        return verdict

    def _churns(self, request: Request, prior: PageState | None, verdict: str | None,
                etag: str | None, last_modified: str | None) -> tuple[int, bool]:
        """``(churns, unstable)`` of the page after this full fetch."""
        if prior is None:
            return 0, False
        churns, unstable = prior.churns, bool(prior.flags & PageFlags.UNSTABLE_VALIDATORS)
        if verdict == "unstable":
            churns += 1
        elif verdict in ("reliable", "lying") and (etag, last_modified) == (
            prior.etag, prior.last_modified
        ):
            # The validators held still: the run of churns is over.
            churns, unstable = 0, False
        if verdict is None or verdict == "absent":
            return churns, unstable
        if churns >= self.unstable_after and not unstable:
            unstable = True
            self.stats.inc_value("incremental/validators/pages_unstable")
            logger.debug("Validators of %(url)s flagged unstable after %(n)d churns",
                         {"url": request.url, "n": churns})
        book = self.ledger.trust
        host = urlparse_cached(request).hostname or ""
        book.page_judged(book.loaded(host), unstable=unstable, now=time.time())
        return churns, unstable

    def _observe_lastmod(self, request: Request, prior: PageState, *, changed: bool) -> None:
        # A page fetched because its lastmod moved: did it really change?
        lastmod = request.meta.get(META_LASTMOD)
        if lastmod is None or prior.lastmod is None or lastmod <= prior.lastmod:
            return
        if prior.last_fetched >= lastmod:
            return  # our copy is newer than the announced change: no evidence
        host = urlparse_cached(request).hostname or ""
        self.ledger.trust.observe(host, lied=not changed, now=time.time())

    def _count(self, request: Request, event: str, count: int = 1) -> None:
        # Sitemaps and feeds are counted apart, so "pages" means content.
        prefix = "incremental/discovery/" if request.meta.get(META_DISCOVERY) else "incremental/"
        self.stats.inc_value(prefix + event, count)

    def _due(self, request: Request, prior: PageState) -> bool:
        """Whether the revisit schedule lets *request* go out now.

        A newer lastmod (sitemap, feed) or an explicit refresh overrides the
        schedule; so does the forced refresh after INCREMENTAL_MAX_AGE.
        """
        if not self.schedule or prior.fingerprint is None or prior.next_visit <= time.time():
            return True
        if request.meta.get(META_REFRESH) or request.meta.get(META_DISCOVERY):
            return True
        lastmod = request.meta.get(META_LASTMOD)
        if lastmod is not None and (prior.lastmod is None or lastmod > prior.lastmod):
            return True
        return bool(self.max_age and time.time() - prior.last_fetched > self.max_age)

    def _next_visit(
        self, prior: PageState | None, *, changed: bool, now: float
    ) -> tuple[float, float] | None:
        """``(interval, next_visit)`` after this visit, or ``None`` without revisits."""
        # Pages with a sitemap lastmod get the same schedule: it only matters
        # when their lastmod is not used (distrusted, switched off, or their
        # sitemap answered 304 and they are re-seeded when due).
        if self.schedule is None:
            return None
        return self.schedule.after_visit(prior.interval if prior else 0, changed=changed, now=now)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        ctx: _Context | None = request.meta.get(_CTX)
        if ctx is None:
            return response
        status = response.status
        if status == 304:
            return self._not_modified(request, response, ctx)
        # A partial (206) or truncated body is not the page: storing its
        # validators would make the next visit a 304 for content we lack.
        if 200 <= status < 300 and status != 206 and "dataloss" not in response.flags:
            self._fetched(request, response, ctx)
            return response
        if status >= 400 or status == 206 or "dataloss" in response.flags:
            self.ledger.note_failure()
        # 3xx (not followed), 4xx, 429, 5xx: counters only; validators and
        # fingerprints stay as they are (only a 2xx updates them).
        self.ledger.stage_check(ctx.key, status)
        self.stats.inc_value(f"incremental/status_kept/{status}")
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if request.meta.get(_CTX) is not None and not isinstance(exception, IgnoreRequest):
            self.ledger.note_failure()

    def _refetch(self, request: Request, reason: str) -> Request:
        self.stats.inc_value(f"incremental/refetch/{reason}")
        headers = request.headers.copy()
        headers.pop(b"If-None-Match", None)
        headers.pop(b"If-Modified-Since", None)
        meta = {**request.meta, META_REFRESH: True, "_incremental_refetch": True}
        meta.pop(_CTX, None)
        return request.replace(headers=headers, meta=meta, dont_filter=True)

    @staticmethod
    def _asked_with(request: Request, prior: PageState) -> bool:
        inm = request.headers.get(b"If-None-Match")
        ims = request.headers.get(b"If-Modified-Since")
        return (
            (inm or b"").decode("latin-1") == (prior.etag or "")
            and (ims or b"").decode("latin-1") == (prior.last_modified or "")
        )

    def _not_modified(self, request: Request, response: Response, ctx: _Context) -> Request:
        prior = ctx.prior
        if not ctx.conditional or prior is None:
            # A 304 we did not ask for (an intermediary, or our own
            # conditions were dropped): never an empty item; ask once more
            # without conditions, then give up loudly.
            if request.meta.get("_incremental_refetch"):
                self.stats.inc_value("incremental/unsolicited_304_dropped")
                logger.warning(
                    "Dropping %(request)s: 304 to an unconditional request, twice",
                    {"request": request},
                    extra={"spider": self.crawler.spider},
                )
                raise IgnoreRequest("304 to an unconditional request")
            return self._refetch(request, "unsolicited_304")
        if not self._asked_with(request, prior):
            # The conditions were not the stored validators (the user set
            # their own): the 304 does not vouch for what we hold.
            return self._refetch(request, "foreign_conditions_304")
        if prior.flags & PageFlags.VARY_STAR:
            # Vary: * (RFC 9110 §12.5.5): the response varies on things
            # outside the request, so a 304 is never trusted blindly.
            return self._refetch(request, "vary_star_304")
        lastmod = request.meta.get(META_LASTMOD)
        if lastmod is not None and prior.lastmod is not None and lastmod > prior.lastmod:
            # The sitemap says the page changed, the validators say not: one
            # of them is wrong, and only the content can tell which.
            return self._refetch(request, "lastmod_contradicts_304")
        new_etag = parse_etag(response.headers.get(b"ETag"))
        if new_etag and prior.etag and not weak_match(new_etag, prior.etag):
            # RFC 9111 §4.3.4: a 304 naming another representation selects
            # nothing we hold; update nothing and fetch it in full.
            return self._refetch(request, "etag_mismatch_304")
        # The data we hold is this version: its lastmod may be recorded.
        schedule = self._next_visit(prior, changed=False, now=time.time())
        self.ledger.stage_check(ctx.key, 304, lastmod=lastmod, schedule=schedule)
        self._observe_lastmod(request, prior, changed=False)
        self._count(request, "not_modified")
        self._count(request, "bytes_saved_estimate", prior.size)
        if not request.meta.get(META_DISCOVERY):
            book = self.ledger.trust
            host = urlparse_cached(request).hostname or ""
            book.verdict(host, "reliable")
            # Its validators held this time (the page's own flag waits for
            # its next full fetch: a 304 changes nothing stored but counters).
            book.page_judged(book.loaded(host), unstable=False, now=time.time())
        logger.debug("Not modified: %(request)s", {"request": request},
                     extra={"spider": self.crawler.spider})
        raise NotModified(f"Not modified: {request.url}")

    def _fetched(self, request: Request, response: Response, ctx: _Context) -> None:
        now = time.time()
        prior = ctx.prior
        raw_etag = response.headers.get(b"ETag")
        raw_lm = response.headers.get(b"Last-Modified")
        etag = parse_etag(raw_etag)
        last_modified = parse_last_modified(raw_lm)
        if raw_etag and etag is None:
            self.stats.inc_value("incremental/invalid_validator/etag")
            logger.debug("Not storing invalid ETag of %(url)s", {"url": response.url})
        if last_modified is not None and _in_the_future(last_modified, response, now):
            # A date ahead of the server's own clock would make every later
            # change answer 304; the content fingerprint decides instead.
            last_modified = None
            self.stats.inc_value("incremental/invalid_validator/last_modified_future")
        elif raw_lm and last_modified is None:
            self.stats.inc_value("incremental/invalid_validator/last_modified")
            logger.debug("Not storing invalid Last-Modified of %(url)s", {"url": response.url})
        # The raw body: normalising a whole page costs milliseconds per page.
        # A body that changed may be noise only (a timestamp, a token): what
        # turns on the *content* (the revisit schedule, the change counters,
        # the evidence about lastmods and validators) waits for the page's
        # items, once they left the pipelines (PageTransaction.judge); a
        # page without items is judged on its body.
        fingerprint = body_fingerprint(response.body)
        lastmod = request.meta.get(META_LASTMOD)
        changed = prior is None or prior.fingerprint != fingerprint
        deferred = changed and prior is not None and not request.meta.get(META_DISCOVERY)
        if deferred:
            assert prior is not None
            churns = prior.churns
            unstable = bool(prior.flags & PageFlags.UNSTABLE_VALIDATORS)
            schedule = None
        else:
            churns, unstable = self._judge(request, prior, etag, last_modified, changed)
            schedule = self._next_visit(prior, changed=changed, now=now)
            if prior is not None:
                self._observe_lastmod(request, prior, changed=changed)
        interval, next_visit = schedule or (0, 0.0)
        callback = _callback_name(request, self.crawler.spider)
        flags = 0
        # Vary = #( "*" / field-name ), over any number of field lines.
        if any(name.strip() == b"*" for line in response.headers.getlist(b"Vary")
               for name in line.split(b",")):
            flags |= PageFlags.VARY_STAR
        if prior is None:
            self._count(request, "pages_new")
            state = PageState(
                ctx.key, etag, last_modified, fingerprint, len(response.body), response.status,
                first_seen=now, last_checked=now, last_fetched=now, last_changed=now,
                checks=1, changes=0, flags=flags, lastmod=lastmod,
                interval=interval, next_visit=next_visit, callback=callback,
            )
        else:
            if not deferred:
                self._count(request, "pages_changed" if changed else "pages_unchanged")
            state = prior.copy(
                etag=etag, last_modified=last_modified, fingerprint=fingerprint,
                size=len(response.body), last_status=response.status,
                last_checked=now, last_fetched=now,
                last_changed=now if changed else prior.last_changed,
                checks=prior.checks + 1, changes=prior.changes + changed,
                flags=(prior.flags & ~(PageFlags.VARY_STAR | PageFlags.UNSTABLE_VALIDATORS))
                | flags | (PageFlags.UNSTABLE_VALIDATORS if unstable else 0),
                lastmod=prior.lastmod if lastmod is None else lastmod,
                interval=interval, next_visit=next_visit, callback=callback, churns=churns,
            )
        txn = self.ledger.begin(request.meta, state,
                                discovery=bool(request.meta.get(META_DISCOVERY)))
        if deferred:
            assert prior is not None

            def judge(content_changed: bool) -> None:
                self._count(request, "pages_changed" if content_changed else "pages_unchanged")
                state.changes = prior.changes + content_changed
                state.last_changed = now if content_changed else prior.last_changed
                schedule = self._next_visit(prior, changed=content_changed, now=now)
                state.interval, state.next_visit = schedule or (0, 0.0)
                self._observe_lastmod(request, prior, changed=content_changed)
                churns, unstable = self._judge(request, prior, etag, last_modified,
                                               content_changed)
                state.churns = churns
                state.flags = (state.flags & ~PageFlags.UNSTABLE_VALIDATORS) | (
                    PageFlags.UNSTABLE_VALIDATORS if unstable else 0)

            txn.judge = judge
        # Redirects followed on the way here: the original URLs remember
        # where they went, without touching their own validators.
        urls = request.meta.get("redirect_urls", ())
        reasons = request.meta.get("redirect_reasons", ())
        for url, reason in zip(urls, reasons, strict=False):
            original = ctx.key._replace(url=self.ledger.canonical(url))
            if original != ctx.key:
                status = reason if isinstance(reason, int) else 0
                self.ledger.stage_redirect(original, ctx.key.url, status)


_COMPRESSION = "scrapy.downloadermiddlewares.httpcompression.HttpCompressionMiddleware"


def _default_encoding(crawler: Crawler) -> bytes | None:
    """The Accept-Encoding a request without one goes out with (None: no header)."""
    settings = crawler.settings
    enabled = settings.getwithbase("DOWNLOADER_MIDDLEWARES").get(_COMPRESSION) is not None
    if not (enabled and settings.getbool("COMPRESSION_ENABLED")):
        return None
    return b", ".join(ACCEPTED_ENCODINGS)


def _callback_name(request: Request, spider: object) -> str | None:
    """The spider method parsing *request*, by name (to re-seed it later)."""
    callback = request.callback
    if callback is None:
        return "parse"
    name = getattr(callback, "__name__", None)
    if name and getattr(callback, "__self__", None) is spider:
        return name
    return None


#: Clock skew tolerated between a Last-Modified and the server's Date.
_CLOCK_SKEW = 60.0


def _in_the_future(last_modified: str, response: Response, now: float) -> bool:
    modified = parse_http_date(last_modified)
    server_now = parse_http_date(response.headers.get(b"Date")) or now
    return modified is not None and modified > server_now + _CLOCK_SKEW
