"""The conditional-request middleware against a misbehaving server."""

from __future__ import annotations

import pytest
import pytest_twisted

from incremental_crawler import clock
from tests.scripted_server import NOT_FOUND, ScriptedServer, answer, header
from tests.site.server import http_date
from tests.spiders import ListSpider

NO_RETRY = {"RETRY_ENABLED": False}


def records(site, path):
    return [r for r in site.log if r.path == path]


def stored(state_db, site, path):
    [row] = state_db(
        "SELECT etag, last_modified, fingerprint, last_status FROM pages WHERE url = ?",
        site.url(path),
    )
    return row


@pytest_twisted.ensureDeferred
async def test_only_a_2xx_updates_validators(site, crawl, state_db):
    errors = {"/a": 500, "/b": 404, "/c": 429, "/d": 503, "/e": 403}
    for path in errors:
        site.add_page(path, "strong", size=1500)
    urls = [site.url(p) for p in errors]
    await crawl(ListSpider, settings=NO_RETRY, urls=urls)
    before = {p: stored(state_db, site, p) for p in errors}
    assert all(row[0] and row[1] and row[2] and row[3] == 200 for row in before.values())

    for path, status in errors.items():
        site.change(path)  # new content the errors must not let us forget
        site.override(path, status=status)
    failing = await crawl(ListSpider, settings=NO_RETRY, urls=urls)
    assert failing.collected == []
    for path, status in errors.items():
        etag, last_modified, fingerprint, last_status = stored(state_db, site, path)
        assert (etag, last_modified, fingerprint) == before[path][:3]
        assert last_status == status
        assert failing.stats.get_value(f"incremental/status_kept/{status}") == 1

    for path in errors:
        site.clear_override(path)
    site.reset_log()
    healed = await crawl(ListSpider, settings=NO_RETRY, urls=urls)
    # The old validators were sent, the server saw new content: 200 and items.
    for path in errors:
        [record] = records(site, path)
        assert record.if_none_match == before[path][0]
        assert record.status == 200
    assert len(healed.collected) == len(errors)


@pytest_twisted.ensureDeferred
async def test_a_304_without_validators_keeps_the_stored_ones(site, crawl, state_db):
    site.add_page("/p", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    before = stored(state_db, site, "/p")
    site.override("/p", headers={"ETag": None, "Last-Modified": None})
    second = await crawl(ListSpider, urls=[site.url("/p")])
    assert records(site, "/p")[-1].status == 304
    assert second.stats.get_value("incremental/not_modified") == 1
    assert stored(state_db, site, "/p")[:3] == before[:3]


@pytest_twisted.ensureDeferred
async def test_a_304_naming_another_representation_is_refetched(site, crawl, state_db):
    site.add_page("/p", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    # The server answers 304 but names a tag we never stored (RFC 9111
    # §4.3.4): nothing is updated from it and the page is fetched in full.
    site.override("/p", headers={"ETag": '"someone-else"'})
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/p")])
    conditional, refetch = records(site, "/p")
    assert conditional.if_none_match is not None and conditional.status == 304
    assert refetch.if_none_match is None and refetch.if_modified_since is None
    assert refetch.status == 200
    assert second.stats.get_value("incremental/refetch/etag_mismatch_304") == 1
    # Same content: the item is recognised as unchanged; the tag is the new one.
    assert second.collected == []
    assert stored(state_db, site, "/p")[0] == '"someone-else"'


@pytest_twisted.ensureDeferred
async def test_stored_weak_tag_matches_the_same_strong_tag(site, crawl, state_db):
    site.add_page("/w", "weak", size=1500)
    await crawl(ListSpider, urls=[site.url("/w")])
    weak = stored(state_db, site, "/w")[0]
    assert weak.startswith('W/"')
    site.override("/w", headers={"ETag": weak[2:]})  # the same tag, now strong
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/w")])
    [record] = records(site, "/w")
    assert record.if_none_match == weak and record.status == 304
    assert second.stats.get_value("incremental/refetch/etag_mismatch_304") is None
    assert stored(state_db, site, "/w")[0] == weak


@pytest_twisted.ensureDeferred
async def test_invalid_validators_are_never_stored_nor_sent(site, crawl, state_db):
    bad = {
        "/half-quoted": {"ETag": '"abc', "Last-Modified": "0"},
        "/spaces": {"ETag": '"a b"', "Last-Modified": "-1"},
        "/huge": {"ETag": '"' + "x" * 9000 + '"',
                  "Last-Modified": "Sun, 32 Nov 1994 08:49:37 GMT"},
    }
    for path, headers in bad.items():
        site.add_page(path, "strong", size=1500)
        site.override(path, headers=headers)
    urls = [site.url(p) for p in bad]
    first = await crawl(ListSpider, urls=urls)
    assert first.stats.get_value("incremental/invalid_validator/etag") == 3
    assert first.stats.get_value("incremental/invalid_validator/last_modified") == 3
    for path in bad:
        assert stored(state_db, site, path)[:2] == (None, None)
    site.reset_log()
    second = await crawl(ListSpider, urls=urls)
    for path in bad:
        [record] = records(site, path)
        assert record.if_none_match is None and record.if_modified_since is None
    # Unchanged content, no validators: the fingerprint drops the items.
    assert second.collected == []
    assert second.stats.get_value("incremental/items_unchanged") == 3


@pytest_twisted.ensureDeferred
async def test_an_unquoted_etag_is_kept_sent_back_as_received_and_revalidates(
    site, crawl, state_db
):
    # ETag: foo (RFC 9110 wants "foo") is common on real servers; refusing it
    # meant never revalidating the page.
    site.add_document("/u", "<html><title>u</title><main>u</main></html>", "text/html",
                      etag="foo")
    first = await crawl(ListSpider, urls=[site.url("/u")])
    assert first.stats.get_value("incremental/invalid_validator/etag") is None
    assert stored(state_db, site, "/u")[0] == "foo"
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/u")])
    [record] = records(site, "/u")
    assert record.if_none_match == "foo" and record.status == 304
    assert second.stats.get_value("incremental/not_modified") == 1
    # The 304's own ETag, foo, named the tag we hold: no re-fetch.
    assert second.stats.get_value("incremental/refetch/etag_mismatch_304") is None
    assert second.collected == []


@pytest_twisted.ensureDeferred
async def test_redirect_state_lives_on_the_final_url(site, crawl, state_db):
    site.add_page("/new", "strong", size=1500)
    site.add_redirect("/old", "/new", 301)
    await crawl(ListSpider, urls=[site.url("/old")])
    [(redirect_to, etag)] = state_db(
        "SELECT redirect_to, etag FROM pages WHERE url = ?", site.url("/old"))
    assert redirect_to == site.url("/new") and etag is None
    assert stored(state_db, site, "/new")[0] == site.etag("/new")
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/old")])
    [moved] = records(site, "/old")
    [final] = records(site, "/new")
    assert moved.status == 301 and moved.if_none_match is None
    assert final.if_none_match == site.etag("/new") and final.status == 304
    assert second.collected == []


@pytest_twisted.ensureDeferred
async def test_a_redirect_does_not_carry_the_sources_conditions_or_lastmod(site, crawl, state_db):
    old = site.add_page("/old", "lastmod", size=1500)
    old.version = 5  # /old's Last-Modified is later than anything /new will have
    site.add_page("/new", "lastmod", size=1500)
    await crawl(ListSpider, urls=[site.url("/old"), site.url("/new")])
    site.add_redirect("/old", "/new")  # the site moves /old to /new...
    site.change("/new")                # ...and /new changes
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/old")],
                         meta={"incremental_lastmod": 1893456000.0})
    [new] = records(site, "/new")
    # /new is asked with its own (older) validator, not /old's later date,
    # so its change is seen: a 200.
    assert new.if_modified_since is not None
    assert new.if_modified_since != site.last_modified("/old")
    assert new.status == 200
    # (/old, known and moved for good, is gone: its tombstone, test_change_feed.py.)
    assert [item["url"] for item in second.collected if item["change"] != "deleted"] == [
        site.url("/new")]
    # /old's sitemap lastmod does not land on /new.
    assert state_db("SELECT lastmod FROM pages WHERE url = ?", site.url("/new")) == [(None,)]


@pytest_twisted.ensureDeferred
async def test_vary_star_means_a_304_is_not_trusted(site, crawl):
    site.add_page("/v", "strong", size=1500)
    site.override("/v", headers={"Vary": "*"})
    await crawl(ListSpider, urls=[site.url("/v")])
    second = await crawl(ListSpider, urls=[site.url("/v")])
    assert second.stats.get_value("incremental/not_modified") is None
    assert second.stats.get_value("incremental/refetch/vary_star_304") == 1


@pytest_twisted.ensureDeferred
async def test_a_last_modified_in_the_future_is_not_sent_back(site, crawl, state_db):
    site.add_page("/f", "lastmod", size=1500)
    site.override("/f", headers={"Last-Modified": "Fri, 01 Jan 2100 00:00:00 GMT"})
    first = await crawl(ListSpider, urls=[site.url("/f")])
    assert first.stats.get_value("incremental/invalid_validator/last_modified_future") == 1
    assert stored(state_db, site, "/f")[1] is None
    site.change("/f")
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/f")])
    [record] = records(site, "/f")
    assert record.if_modified_since is None and record.status == 200
    assert len(second.collected) == 1


@pytest_twisted.ensureDeferred
async def test_a_server_clock_a_year_fast_gives_no_validator(site, crawl, state_db):
    # The server's clock is a year fast: its Date and Last-Modified agree
    # with each other, a year ahead of ours.
    site.add_page("/y", "lastmod", size=1500)
    ahead = http_date(clock.now() + 365 * 86_400)
    site.override("/y", headers={"Date": ahead, "Last-Modified": ahead})
    first = await crawl(ListSpider, urls=[site.url("/y")])
    assert first.stats.get_value("incremental/invalid_validator/last_modified_future") == 1
    assert stored(state_db, site, "/y")[1] is None
    # Its clock put right, the page edited: a server answering 304 whenever
    # Last-Modified <= If-Modified-Since would hide the edit behind next
    # year's date; none is sent, the edit is seen.
    site.clear_override("/y")
    site.change("/y")
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/y")])
    [record] = records(site, "/y")
    assert record.if_modified_since is None and record.status == 200
    assert [item["url"] for item in second.collected] == [site.url("/y")]


@pytest_twisted.ensureDeferred
async def test_a_truncated_body_stores_no_validators(crawl, state_db):
    # A server that announces 4,000 bytes and sends 300: with
    # DOWNLOAD_FAIL_ON_DATALOSS off, Scrapy delivers it flagged "dataloss".
    body = b"<html><head><title>full</title></head><body><main>" + b"x" * 4000

    def script(head: bytes) -> bytes:
        if head.startswith(b"GET /robots.txt "):
            return NOT_FOUND
        return answer("200 OK", [(b"ETag", b'"e1"'), (b"Content-Type", b"text/html")],
                      body[:300], length=len(body))

    with ScriptedServer(script) as server:
        crawler = await crawl(ListSpider, urls=[server.url("/page")], settings={
            "DOWNLOAD_FAIL_ON_DATALOSS": False, "RETRY_ENABLED": False})
    assert server.heads_for("/page")
    assert crawler.stats.get_value("downloader/response_count") >= 1
    assert state_db("SELECT etag FROM pages WHERE etag IS NOT NULL") == []


@pytest_twisted.ensureDeferred
async def test_vary_star_in_a_list_means_a_304_is_not_trusted(site, crawl):
    # Vary = #( "*" / field-name ) (RFC 9110 §12.5.5): "*" may share the
    # field with names, as a proxy appending Accept-Encoding makes it.
    for path, vary in (("/va", "Accept-Encoding, *"), ("/vb", "*,Accept-Encoding")):
        site.add_page(path, "stuck", size=1500)
        site.override(path, headers={"Vary": vary})
    await crawl(ListSpider, urls=[site.url("/va"), site.url("/vb")])
    site.change("/va")  # behind ETag "stuck": only a full fetch shows it
    second = await crawl(ListSpider, urls=[site.url("/va"), site.url("/vb")])
    assert second.stats.get_value("incremental/not_modified") is None
    assert second.stats.get_value("incremental/refetch/vary_star_304") == 2
    assert [item["url"] for item in second.collected] == [site.url("/va")]


@pytest.mark.parametrize("state_uri", ["sqlite", "redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_an_etag_with_obs_text_is_sent_back_byte_for_byte(crawl):
    # RFC 9110 §8.8.3: etagc includes obs-text (0x80-0xFF). Header values are
    # bytes; re-encoded as UTF-8 the tag never matched, and the page was
    # downloaded in full on every visit. Through either store (kept as
    # Latin-1 characters, one per byte) the bytes come back as they were.
    etag = b'"caf\xe9-\xff"'
    html = b"<html><head><title>t</title></head><body><main>m</main></body></html>"

    def script(head: bytes) -> bytes:
        if head.startswith(b"GET /robots.txt "):
            return NOT_FOUND
        if header(head, b"If-None-Match") == etag:
            return answer("304 Not Modified", [(b"ETag", etag)])
        return answer("200 OK", [(b"ETag", etag), (b"Content-Type", b"text/html")], html)

    with ScriptedServer(script) as server:
        await crawl(ListSpider, urls=[server.url("/p")])
        second = await crawl(ListSpider, urls=[server.url("/p")])
    first_visit, second_visit = server.heads_for("/p")
    assert header(first_visit, b"If-None-Match") is None
    assert header(second_visit, b"If-None-Match") == etag
    assert second.stats.get_value("incremental/not_modified") == 1
    assert second.stats.get_value("downloader/response_status_count/200") is None


def later_date(site, path):
    """An HTTP-date an hour after the page's Last-Modified (still in the past)."""
    return http_date(site.page(path).modified_ts + 3600)


@pytest_twisted.ensureDeferred
async def test_a_304_validated_by_etag_takes_up_its_new_last_modified(site, crawl, state_db):
    # RFC 9111 §4.3.4: the 304 updates the stored validators. The old
    # If-Modified-Since went out on every visit after it.
    site.add_page("/p", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    etag = stored(state_db, site, "/p")[0]
    newer = later_date(site, "/p")
    site.override("/p", headers={"Last-Modified": newer})
    second = await crawl(ListSpider, urls=[site.url("/p")])
    assert records(site, "/p")[-1].status == 304
    assert second.stats.get_value("incremental/not_modified_validators_updated") == 1
    assert stored(state_db, site, "/p")[:2] == (etag, newer)
    site.reset_log()
    third = await crawl(ListSpider, urls=[site.url("/p")])
    [record] = records(site, "/p")
    assert (record.if_none_match, record.if_modified_since) == (etag, newer)
    assert record.status == 304
    assert third.stats.get_value("incremental/not_modified_validators_updated") is None


@pytest_twisted.ensureDeferred
async def test_a_304_validated_by_date_stores_the_etag_it_carries(site, crawl, state_db):
    site.add_page("/p", "lastmod", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    last_modified = stored(state_db, site, "/p")[1]
    assert stored(state_db, site, "/p")[0] is None
    # The server starts sending an ETag: its 304 to our date carries it.
    site.override("/p", headers={"ETag": '"v1"'})
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/p")])
    [record] = records(site, "/p")
    assert (record.if_none_match, record.status) == (None, 304)
    assert second.stats.get_value("incremental/not_modified_validators_updated") == 1
    assert stored(state_db, site, "/p")[:2] == ('"v1"', last_modified)
    site.reset_log()
    await crawl(ListSpider, urls=[site.url("/p")])
    # From now on the page is validated by it.
    [record] = records(site, "/p")
    assert (record.if_none_match, record.if_modified_since) == ('"v1"', last_modified)


@pytest_twisted.ensureDeferred
async def test_a_304_to_a_date_naming_a_later_date_is_refetched(site, crawl, state_db):
    # "Not modified since X" with "Last-Modified: X + 1 h": the answer
    # contradicts itself; the content decides.
    site.add_page("/p", "lastmod", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    newer = later_date(site, "/p")
    site.override("/p", headers={"Last-Modified": newer})
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/p")])
    conditional, refetch = records(site, "/p")
    assert conditional.if_modified_since is not None and conditional.status == 304
    assert refetch.if_modified_since is None and refetch.status == 200
    assert second.stats.get_value("incremental/refetch/last_modified_later_304") == 1
    assert second.stats.get_value("incremental/not_modified") is None
    # Same content: no item; the full answer's date is the one stored.
    assert second.collected == []
    assert stored(state_db, site, "/p")[1] == newer


@pytest_twisted.ensureDeferred
async def test_a_206_to_a_request_without_range_never_becomes_an_item(site, crawl, state_db):
    site.add_page("/p", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    before = stored(state_db, site, "/p")
    # Half a page, as a broken proxy serves it: an item of it was stored as
    # "changed", and the next full answer as "changed" back.
    site.override("/p", status=206, body=site.body("/p")[:700], headers={
        "Content-Type": "text/html", "Content-Range": "bytes 0-699/1500"})
    partial = await crawl(ListSpider, settings=NO_RETRY, urls=[site.url("/p")])
    assert records(site, "/p")[-1].status == 206
    assert partial.collected == []
    assert partial.stats.get_value("incremental/partial_unasked") == 1
    # Recorded as a failure: asked again next crawl, nothing else changed.
    assert stored(state_db, site, "/p") == (*before[:3], 206)
    site.clear_override("/p")
    healed = await crawl(ListSpider, urls=[site.url("/p")])
    assert healed.collected == []
    assert state_db("SELECT COUNT(*) FROM item_versions") == [(1,)]


@pytest_twisted.ensureDeferred
async def test_validators_of_a_no_store_page_are_kept_and_sent(site, crawl, state_db):
    # Cache-Control: no-store binds caches (RFC 9111 §5.2.2.5); a crawler's
    # state is none: it never answers a request with a stored response, and
    # keeps the page's items anyway (docs/guide.md says why).
    site.cache_control = "no-store"
    site.add_page("/p", "strong", size=1500)
    await crawl(ListSpider, urls=[site.url("/p")])
    assert stored(state_db, site, "/p")[0] == site.etag("/p")
    site.reset_log()
    second = await crawl(ListSpider, urls=[site.url("/p")])
    [record] = records(site, "/p")
    assert (record.if_none_match, record.status) == (site.etag("/p"), 304)
    assert second.stats.get_value("incremental/not_modified") == 1
