"""Redirects and copied meta: what is recorded of the page that was asked.

- A callback passing ``response.meta`` on (a common idiom, which Scrapy
  only warns about) from a page reached through a redirect: the new request
  is not a hop of that redirect chain, and its fate never fails the chain's
  first page.
- A page that moved (301) to another site: the hop is dropped by the
  offsite check before the scheduler, with no signal; the move is decided
  by what the store knows of the target (recorded as a redirect, no
  tombstone for a target not known live).
- A meta refresh: the target's request is made from the refreshed page's
  request, and must not carry that page's transaction (it would make the
  request impossible to serialise for JOBDIR's queues).

The reproductions came from a review of the failure recording.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
import pytest_twisted
import scrapy
from scrapy import Request

from tests.redis_util import CLUSTER_REDIS_URI
from tests.test_failures import stored

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy.http import Response


class CopyMetaSpider(scrapy.Spider):
    """A page reached through a redirect passes response.meta on, or not."""

    name = "copymeta"

    def __init__(self, start: str = "", follow: str = "", copy: str = "yes", **kw: Any) -> None:
        super().__init__(**kw)
        self.start_url, self.follow_url, self.copy = start, follow, copy == "yes"

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url)

    def parse(self, response: Response) -> Any:
        yield {"url": response.url}
        if response.url.endswith("/new"):
            meta = dict(response.meta) if self.copy else {}
            yield Request(self.follow_url, callback=self.parse, meta=meta)


@pytest.mark.parametrize("copy", ["yes", "no"])
@pytest.mark.parametrize("follow", ["/missing", "/old"])
@pytest_twisted.ensureDeferred
async def test_copied_meta_never_fails_the_first_page_of_a_redirect(
        site, crawl, state_uri, caplog, follow, copy):
    site.add_page("/new", "strong", size=1500)
    site.add_redirect("/old", "/new", 302)
    with caplog.at_level(logging.INFO):
        await crawl(CopyMetaSpider, start=site.url("/old"), follow=site.url(follow), copy=copy)
    old = await stored(state_uri, site, "/old", scope="copymeta")
    # /old's chain ended in a 200: whatever /new's callback asked next (a
    # 404, or /old again, which the dupefilter drops) is not its failure.
    assert old is not None and old.failures == 0
    assert not [r for r in caplog.records if "Redirect loop" in r.getMessage()]


class MovingSpider(scrapy.Spider):
    name = "moving"
    allowed_domains = ("127.0.0.1",)

    def __init__(self, start: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.start_url = start

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url)

    def parse(self, response: Response) -> Any:
        yield {"url": response.url, "title": response.css("title::text").get()}


@pytest.mark.parametrize("where", ["offsite", "onsite-loop"])
@pytest_twisted.ensureDeferred
async def test_a_move_to_a_target_not_fetched_is_recorded(site, crawl, state_uri, where):
    site.add_page("/a", "strong", size=1500)
    await crawl(MovingSpider, start=site.url("/a"))
    target = "/b"
    url = site.url(target)
    if where == "offsite":
        url = url.replace("127.0.0.1", "localhost")
    else:
        site.add_redirect(target, "/c", 302)  # never answers 2xx this crawl...
        site.add_redirect("/c", target, 302)  # ...a loop: the target is not proved live
    site.add_redirect("/a", url, 301)
    second = await crawl(MovingSpider, start=site.url("/a"))
    after = await stored(state_uri, site, "/a", scope="moving")
    assert after is not None and after.last_status == 301
    if where == "offsite":
        # Not fetched: the store does not know it live. The 301 is recorded
        # where it points, not as a failure.
        assert after.redirect_to == url and after.failures == 0
    else:
        # Followed into a loop: a failure of the page asked, due next crawl.
        assert after.failures == 1
    # Either way no tombstone: the move is not proved.
    assert second.stats.get_value("incremental/items_deleted") is None


class RefreshSpider(scrapy.Spider):
    name = "refresh"

    def __init__(self, start: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.start_url = start

    async def start(self) -> AsyncIterator[Any]:
        yield Request(self.start_url)

    def parse(self, response: Response) -> Any:
        yield {"url": response.url}


@pytest.mark.parametrize("queue", ["memory", "jobdir", "cluster"])
@pytest_twisted.ensureDeferred
async def test_a_meta_refresh_target_is_fetched_and_queued(site, crawl, tmp_path,
                                                          cluster_prefix, queue):
    site.add_page("/target", "strong", size=1500)
    site.add_document("/refresh", '<html><head><meta http-equiv="refresh" '
                      'content="0;url=/target"></head><body>moved</body></html>',
                      "text/html", etag='"r1"')
    settings: dict[str, Any] = {}
    if queue == "jobdir":
        settings = {"JOBDIR": str(tmp_path / "job")}
    elif queue == "cluster":
        # scrapy-redis pickles the request into the shared queue.
        settings = {"INCREMENTAL_CLUSTER_URL": CLUSTER_REDIS_URI,
                    "INCREMENTAL_CLUSTER_PREFIX": cluster_prefix,
                    "INCREMENTAL_CLUSTER_HEARTBEAT": 0.2,
                    "INCREMENTAL_CLUSTER_IDLE_GRACE": 0.5}
    crawler = await crawl(RefreshSpider, settings=settings, start=site.url("/refresh"))
    assert [r.status for r in site.requests_for("/target")] == [200]
    # Serialisable: JOBDIR kept it in its disk queue, not in memory.
    assert crawler.stats.get_value("scheduler/unserializable") is None
