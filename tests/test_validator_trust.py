"""When validators fail: noise, random ETags, validators that lie (issue 5)."""

from __future__ import annotations

import pytest_twisted

from incremental_crawler.change.trust import recheck_due
from incremental_crawler.spiders.sitemap import SitemapPagesSpider
from tests.spiders import HeadingSpider, ListSpider


def urls(site, paths):
    return [site.url(p) for p in paths]


def report_of(caplog) -> str:
    return next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Incremental report"))


@pytest_twisted.ensureDeferred
async def test_random_etags_flag_pages_after_two_churns_and_the_host_past_half(
    site, crawl, state_db, caplog
):
    paths = [f"/r/{i}" for i in range(12)]
    for path in paths:
        site.add_page(path, "random", size=1500)
    no_samples = {"INCREMENTAL_RECHECK_EVERY": 0}
    await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    second = await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    # One churn (new tags, same content): counted, not yet flagged.
    assert second.collected == []
    assert second.stats.get_value("incremental/validators/unstable") == 12
    assert second.stats.get_value("incremental/validators/pages_unstable") is None
    assert state_db("SELECT COUNT(*) FROM pages WHERE flags & 4") == [(0,)]
    assert state_db("SELECT COUNT(*) FROM hosts WHERE validators_unstable_since") == [(0,)]
    site.reset_log()
    caplog.clear()
    with caplog.at_level("INFO"):
        third = await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    # Validators still sent (a 304 would still be free)...
    assert all(r.if_none_match is not None for r in site.log if r.path.startswith("/r/"))
    # ...the second churn in a row flags each page, and more than half of
    # the host's (>= 10) pages flagged marks the host, in stored state.
    assert third.collected == []
    assert third.stats.get_value("incremental/items_unchanged") == 12
    assert third.stats.get_value("incremental/validators/pages_unstable") == 12
    assert third.stats.get_value("incremental/validators/hosts_unstable") == 1
    assert state_db("SELECT COUNT(*), MIN(churns) FROM pages WHERE flags & 4") == [(12, 2)]
    [(since,)] = state_db("SELECT validators_unstable_since FROM hosts")
    assert since > 0
    assert ("127.0.0.1: validators reliable 0 / unstable 12 / lying 0 / absent 0; "
            "host unstable (12 of 12 pages flagged)") in report_of(caplog)
    # The server is fixed: once its tags hold, the pages answer 304 and a
    # crawl that finds most pages stable clears the host.
    for path in paths:
        site.set_kind(path, "strong")
    await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    site.reset_log()
    fixed = await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    assert [r.status for r in site.log if r.path.startswith("/r/")] == [304] * 12
    assert fixed.stats.get_value("incremental/validators/hosts_unstable") is None
    assert state_db("SELECT validators_unstable_since FROM hosts") == [(0,)]


@pytest_twisted.ensureDeferred
async def test_every_page_is_rechecked_once_in_n_visits_so_a_hidden_change_is_found_within_n(
    site, crawl, state_db
):
    every = 3
    paths = [f"/lie/{i}" for i in range(8)]
    # The page whose turn comes last (its 4th visit) gets the hidden change,
    # and is requested last in each crawl.
    hidden = next(p for p in paths if recheck_due(p, 4, every))
    paths = [p for p in paths if p != hidden] + [hidden]
    for path in paths:
        site.add_page(path, "stuck", size=1500)
    settings = {"INCREMENTAL_RECHECK_EVERY": every, "CONCURRENT_REQUESTS": 1}
    await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    site.change(hidden)  # new content behind ETag "stuck"
    full_fetches: dict[str, int] = dict.fromkeys(paths, 0)
    found = []
    for visit in (2, 3, 4):
        site.reset_log()
        result = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
        unconditional = [r.path for r in site.log
                         if r.path.startswith("/lie/") and r.if_none_match is None]
        # The rotation is deterministic: exactly the pages whose turn it is.
        assert unconditional == [p for p in paths if recheck_due(p, visit, every)]
        for path in unconditional:
            full_fetches[path] += 1
        found.append([item["url"] for item in result.collected])
    # Every page fetched in full exactly once in its N = 3 conditional visits,
    # and the hidden change found on the last of them (not before: 304s).
    assert full_fetches == dict.fromkeys(paths, 1)
    assert found == [[], [], [site.url(hidden)]]
    assert result.stats.get_value("incremental/validators/hosts_distrusted") == 1


@pytest_twisted.ensureDeferred
async def test_a_lying_host_is_trusted_again_after_m_changes_with_moved_validators(
    site, crawl, state_db
):
    paths = [f"/t/{i:02d}" for i in range(12)]
    for path in paths:
        site.add_page(path, "stuck", size=1500)
    settings = {"INCREMENTAL_RECHECK_EVERY": 0, "INCREMENTAL_VALIDATORS_RETRUST_AFTER": 5,
                "CONCURRENT_REQUESTS": 1}
    await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    site.change("/t/00")
    caught = await crawl(ListSpider, settings=settings, urls=urls(site, ["/t/00"]),
                         meta={"incremental_refresh": True})
    assert caught.stats.get_value("incremental/validators/hosts_distrusted") == 1
    [(until, consistent)] = state_db(
        "SELECT validators_distrusted_until, validators_consistent FROM hosts")
    assert until > 0 and consistent == 0
    site.change("/t/02")  # one more lie, hidden behind "stuck"
    site.reset_log()
    third = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    records = [r for r in site.log if r.path.startswith("/t/")]
    # Distrusted: every page in full, the hidden change found; unchanged
    # pages are no evidence either way (a liar's look the same).
    assert [r.if_none_match is None for r in records] == [True] * 12
    assert [item["url"] for item in third.collected] == [site.url("/t/02")]
    assert third.stats.get_value("incremental/validators/lying") == 1
    assert third.stats.get_value("incremental/validators/hosts_retrusted") is None
    # The server is fixed: changes whose validators move with them are the
    # evidence. /t/03 counts 1, /t/04 lies (stuck still: back to 0), then
    # /t/05../t/09 make 5: trusted again.
    for path in paths:
        if path != "/t/04":
            site.set_kind(path, "strong")
    for path in paths[3:10]:
        site.change(path)
    fixed = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    assert len(fixed.collected) == 7
    assert fixed.stats.get_value("incremental/validators/lying") == 1
    assert fixed.stats.get_value("incremental/validators/hosts_retrusted") == 1
    assert state_db("SELECT validators_distrusted_until, validators_consistent FROM hosts") == [
        (0, 0)]
    # Trusted: conditional requests, answered 304 (the stuck page too).
    site.reset_log()
    await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    assert [r.status for r in site.log if r.path.startswith("/t/")] == [304] * 12


@pytest_twisted.ensureDeferred
async def test_gzip_and_identity_variants_keep_their_own_validators(site, crawl, state_db):
    site.add_page("/v", "strong", size=3000, gzip=True)
    url = site.url("/v")
    identity = {"Accept-Encoding": "identity"}
    for headers in (None, identity, None, identity):
        await crawl(ListSpider, urls=[url], headers=headers)
    records = site.requests_for("/v")
    default = records[0].headers["accept-encoding"]
    # The same Accept-Encoding for the URL every time; each variant was
    # stored with its own ETag, sent back with its own request, and answered
    # 304: neither overwrote the other's validators.
    assert [r.headers["accept-encoding"] for r in records] == [default, "identity"] * 2
    assert "gzip" in default
    gz, plain = site.etag("/v")[:-1] + '-gzip"', site.etag("/v")
    assert [(r.status, r.if_none_match) for r in records] == [
        (200, None), (200, None), (304, gz), (304, plain)]
    assert sorted(state_db("SELECT variant, etag FROM pages")) == [
        ("", gz), ("ae=identity", plain)]


@pytest_twisted.ensureDeferred
async def test_noise_outside_and_inside_the_main_content_makes_no_item(site, crawl):
    paths = [f"/n/{i}" for i in range(3)]
    for path in paths:
        site.add_page(path, "noisy", size=1500)
    site.add_page("/n/real", "noisy", size=1500)
    await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"))
    site.change("/n/real")
    site.reset_log()
    second = await crawl(SitemapPagesSpider, sitemap_url=site.url("/sitemap.xml"),
                         use_lastmod="false")
    # Every page was fetched in full (no validators)...
    assert len([r for r in site.log if r.path.startswith("/n/") and r.status == 200]) == 4
    # ...the per-response timestamps are ignored; the real change is not.
    assert [item["url"] for item in second.collected] == [site.url("/n/real")]
    assert second.stats.get_value("incremental/validators/absent") == 4


def article(words: list[str]) -> str:
    return ("<html><head><title>story</title></head><body><main><p>"
            + " ".join(words) + "</p></main></body></html>")


@pytest_twisted.ensureDeferred
async def test_a_one_word_change_is_an_item_by_default_and_suppressed_as_near_duplicate(
    site, crawl
):
    words = [f"word{i}" for i in range(400)]
    site.add_document("/story", article(words), "text/html")
    site.add_document("/s.xml", '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/'
                      f'schemas/sitemap/0.9"><url><loc>{site.url("/story")}</loc></url></urlset>',
                      "application/xml")
    near = {"INCREMENTAL_NEAR_DUPLICATES": True}
    await crawl(SitemapPagesSpider, settings=near, sitemap_url=site.url("/s.xml"))
    words[200] = "changed"
    site.add_document("/story", article(words), "text/html")
    # Near-duplicate mode: the one-word change is within the distance; it is
    # suppressed and counted (the trade-off docs/guide.md states).
    suppressed = await crawl(SitemapPagesSpider, settings=near, sitemap_url=site.url("/s.xml"))
    assert suppressed.collected == []
    assert suppressed.stats.get_value("incremental/items_near_duplicate") == 1
    # Default mode: every real change is an item.
    default = await crawl(SitemapPagesSpider, sitemap_url=site.url("/s.xml"))
    assert [item["url"] for item in default.collected] == [site.url("/story")]
    # A larger change passes the distance in near-duplicate mode too.
    words[:120] = [f"new{i}" for i in range(120)]
    site.add_document("/story", article(words), "text/html")
    rewritten = await crawl(SitemapPagesSpider, settings=near, sitemap_url=site.url("/s.xml"))
    assert len(rewritten.collected) == 1


@pytest_twisted.ensureDeferred
async def test_noise_behind_validators_that_hold_is_not_a_lie(site, crawl, state_db):
    # Last-Modified is the page's real last change; only a "generated at"
    # timestamp differs per response (Last-Modified is weak, RFC 9110
    # §8.8.2.2: that is allowed). Nothing changed, so nothing lied.
    paths = [f"/q/{i:02d}" for i in range(12)]
    for path in paths:
        site.add_page(path, "lastmod", size=1500, noise=True)
    settings = {"INCREMENTAL_RECHECK_EVERY": 2}
    await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    second = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    # The sampled half was fetched in full: no item, no lie, host trusted.
    assert second.collected == []
    sampled = sum(recheck_due(p, 2, 2) for p in paths)
    assert 0 < sampled < 12
    assert second.stats.get_value("incremental/requests/sample") == sampled
    assert second.stats.get_value("incremental/validators/lying") is None
    assert second.stats.get_value("incremental/validators/hosts_distrusted") is None
    assert state_db("SELECT validators_distrusted_until FROM hosts") in ([], [(0,)])
    site.reset_log()
    third = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    # Still trusted: only the sampled half costs a full body, the rest 304.
    statuses = [r.status for r in site.log if r.path.startswith("/q/")]
    assert statuses.count(304) == 12 - sum(recheck_due(p, 3, 2) for p in paths)
    assert third.collected == []
    # A real change behind the same noisy page is still a lie, and an item.
    site.set_kind("/q/00", "stuck")
    await crawl(ListSpider, settings=settings, urls=urls(site, ["/q/00"]),
                meta={"incremental_refresh": True})
    site.change("/q/00")
    caught = await crawl(ListSpider, settings=settings, urls=urls(site, ["/q/00"]),
                         meta={"incremental_refresh": True})
    assert [item["url"] for item in caught.collected] == [site.url("/q/00")]
    assert caught.stats.get_value("incremental/validators/lying") == 1
    assert caught.stats.get_value("incremental/validators/hosts_distrusted") == 1


@pytest_twisted.ensureDeferred
async def test_random_etags_on_noisy_pages_are_reliable_the_bytes_did_change(
    site, crawl, state_db, caplog
):
    # A new ETag per response on a page whose every response differs (a
    # "generated at" timestamp): the validators say the bytes changed, and
    # they did. Validator trust is judged on the response: nothing is
    # unstable. The items (noise left out) did not change: no item, and the
    # report says so.
    paths = [f"/rn/{i:02d}" for i in range(12)]
    for path in paths:
        site.add_page(path, "random", size=1500, noise=True)
    no_samples = {"INCREMENTAL_RECHECK_EVERY": 0}
    for _ in range(2):
        await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    caplog.clear()
    with caplog.at_level("INFO"):
        result = await crawl(ListSpider, settings=no_samples, urls=urls(site, paths))
    assert result.collected == []
    assert result.stats.get_value("incremental/validators/reliable") == 12
    assert result.stats.get_value("incremental/validators/unstable") is None
    assert result.stats.get_value("incremental/validators/pages_unstable") is None
    assert state_db("SELECT COUNT(*) FROM pages WHERE flags & 4") == [(0,)]
    report = report_of(caplog)
    assert "12 page changed, items unchanged, 0 unchanged in full" in report
    assert "127.0.0.1: validators reliable 12 / unstable 0 / lying 0 / absent 0" in report


@pytest_twisted.ensureDeferred
async def test_an_edit_outside_the_items_behind_a_new_etag_is_a_page_change_not_a_churn(
    site, crawl, state_db, caplog
):
    # The pages' text changes and their strong ETags (hashes of the body)
    # with it; the spider's items keep the heading only, which did not.
    # The server is right: its validators are reliable, and the report says
    # the pages changed while their items did not.
    paths = [f"/e/{i:02d}" for i in range(12)]
    for path in paths:
        site.add_page(path, "strong", size=1500)
    no_samples = {"INCREMENTAL_RECHECK_EVERY": 0}
    for crawl_number in range(3):
        if crawl_number:
            for path in paths:
                site.change(path)
        caplog.clear()
        with caplog.at_level("INFO"):
            result = await crawl(HeadingSpider, settings=no_samples, urls=urls(site, paths))
    assert [r.status for r in site.log if r.path.startswith("/e/")][-12:] == [200] * 12
    assert result.collected == []
    assert result.stats.get_value("incremental/items_unchanged") == 12
    assert result.stats.get_value("incremental/validators/reliable") == 12
    assert result.stats.get_value("incremental/validators/unstable") is None
    assert result.stats.get_value("incremental/pages_changed_items_unchanged") == 12
    # Two such crawls in a row flag nothing: no churn.
    assert state_db("SELECT COUNT(*), MAX(churns) FROM pages WHERE url LIKE '%/e/%' "
                    "AND flags & 4") == [(0, None)]
    report = report_of(caplog)
    assert ("12 pages checked, 0 not modified (304), 0 new, 0 changed, "
            "12 page changed, items unchanged, 0 unchanged in full;") in report
    assert "127.0.0.1: validators reliable 12 / unstable 0 / lying 0 / absent 0" in report


@pytest_twisted.ensureDeferred
async def test_unchanged_pages_of_a_lying_host_do_not_earn_it_trust(site, crawl, state_db):
    # A server that still lies cannot show it on pages that did not change:
    # unchanged content behind unchanged validators is what a liar sends
    # too. Only changes whose validators moved with them are evidence.
    paths = [f"/u/{i:02d}" for i in range(12)]
    for path in paths:
        site.add_page(path, "stuck", size=1500)
    settings = {"INCREMENTAL_RECHECK_EVERY": 0, "INCREMENTAL_VALIDATORS_RETRUST_AFTER": 5,
                "CONCURRENT_REQUESTS": 1}
    await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    site.change("/u/00")
    await crawl(ListSpider, settings=settings, urls=urls(site, ["/u/00"]),
                meta={"incremental_refresh": True})
    quiet = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    assert quiet.stats.get_value("incremental/validators/hosts_retrusted") is None
    # Still distrusted, so the next hidden change is found on its next visit.
    site.change("/u/11")
    site.reset_log()
    found = await crawl(ListSpider, settings=settings, urls=urls(site, paths))
    assert all(r.if_none_match is None for r in site.log if r.path.startswith("/u/"))
    assert [item["url"] for item in found.collected] == [site.url("/u/11")]
