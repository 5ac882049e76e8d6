"""User code that copies meta, swallows errors, rejects responses or
replaces items: page state must still never be committed ahead of its data.

Each scenario broke "state is never ahead of data" (or "an unchanged item
never reaches storage") in review; each test fails without
the guard it exercises.
"""

from __future__ import annotations

import pytest_twisted

from tests.spiders import (
    DiscoveryMetaSpider,
    ErrbackSpider,
    HalfSpider,
    ListSpider,
    MetaPassSpider,
    PlainObjectSpider,
)


@pytest_twisted.ensureDeferred
async def test_a_callback_error_swallowed_by_a_user_middleware_withholds_the_page(
    site, crawl, state_db
):
    site.add_page("/p", "strong", size=2000)
    HalfSpider.crash = True
    try:
        first = await crawl(HalfSpider, urls=[site.url("/p")],
                            settings={"SPIDER_MIDDLEWARES": {"tests.spiders.SwallowErrors": 543}})
    finally:
        HalfSpider.crash = False
    assert first.stats.get_value("incremental/state_withheld") == 1
    assert state_db("SELECT etag FROM pages WHERE etag IS NOT NULL") == []


@pytest_twisted.ensureDeferred
async def test_a_request_carrying_its_parents_meta_does_not_commit_the_parent(
    site, crawl, state_db,
):
    site.add_page("/parent", "strong", size=2000)
    crawler = await crawl(
        MetaPassSpider,
        settings={"ITEM_PIPELINES": {"tests.spiders.StateProbePipeline": 500}},
        parent=site.url("/parent"), child=site.url("/missing"),
    )
    # State never ahead of data: while the parent's item is in a pipeline, its
    # page state is not on disk
    assert all(row is None for _, row in crawler.state_probe)


@pytest_twisted.ensureDeferred
async def test_copied_meta_does_not_write_one_pages_validators_onto_another(site, crawl, state_db):
    site.add_page("/a", "lastmod", size=2000)
    listing = site.add_page("/listing", "lastmod", size=2000)
    listing.version = 5          # the listing changed more recently than /a
    kw = {"page": site.url("/a"), "listing": site.url("/listing")}
    await crawl(DiscoveryMetaSpider, **kw)
    site.change("/a")            # /a changes; its new LM is still older than the listing's
    site.reset_log()
    await crawl(DiscoveryMetaSpider, **kw)
    recs = [(r.path, r.status, r.if_modified_since) for r in site.log if r.path == "/a"]
    assert recs[0][1] == 200, "change of /a lost: answered 304"


@pytest_twisted.ensureDeferred
async def test_objects_a_pipeline_turns_into_items_are_waited_for(site, crawl):
    site.add_page("/p", "strong", size=2000)
    crawler = await crawl(PlainObjectSpider, url=site.url("/p"), settings={"ITEM_PIPELINES": {
        "tests.spiders.ArticleToDict": 10, "tests.spiders.SlowOnFlag": 400,
        "tests.spiders.StateProbePipeline": 500}})
    # the slow real item of /p must not see /p's validators on disk
    assert [row for url, row in crawler.state_probe if url.endswith("/p")] == [None]


@pytest_twisted.ensureDeferred
async def test_a_response_rejected_before_its_callback_is_not_committed(site, crawl, state_db):
    site.add_page("/p", "strong", size=2000)
    await crawl(ErrbackSpider, url=site.url("/p"),
                    settings={"SPIDER_MIDDLEWARES": {"tests.spiders.RejectInput": 543}})
    assert state_db("SELECT etag FROM pages WHERE etag IS NOT NULL") == []


@pytest_twisted.ensureDeferred
async def test_a_pipeline_returning_a_new_item_keeps_the_fingerprint_comparable(
    site, crawl, state_db,
):
    site.add_page("/n", "none", size=2000)   # no validators: the content hash decides
    settings = {"ITEM_PIPELINES": {"tests.spiders.NormalizeCopy": 300}}
    await crawl(ListSpider, settings=settings, urls=[site.url("/n")])
    second = await crawl(ListSpider, settings=settings, urls=[site.url("/n")])
    assert second.stats.get_value("incremental/items_unchanged") == 1
    assert state_db("SELECT COUNT(*) FROM item_versions") == [(1,)]
