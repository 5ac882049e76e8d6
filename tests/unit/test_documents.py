"""parse_listing and gunzip (incremental_crawler/lists/documents.py), without a crawl.

The corpus (tests/corpus/sitemaps) crawls documents end to end; these pin
what a crawl cannot show: dates kept or dropped across a fault, the entry
limit, a cut-off gzip stream told from a complete one.
"""

from __future__ import annotations

import gzip
import zlib

from incremental_crawler.lists.documents import gunzip, parse_listing

URL = "http://h/sitemap.xml"


def urlset(*rows: str, close: bool = True) -> bytes:
    return ('<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(rows) + ("</urlset>" if close else "")).encode()


def url(path: str, lastmod: str = "2024-03-01") -> str:
    return f"<url><loc>http://h{path}</loc><lastmod>{lastmod}</lastmod></url>"


def test_entries_closed_before_a_fault_keep_their_dates_the_recovered_ones_lose_them():
    body = urlset(url("/a", "2024-01-01"), url("/b", "2024-01-02"),
                  "<url><loc>http://h/c</loc><changefreq>&weekly;</changefreq>"
                  "<lastmod>2024-01-03</lastmod></url>",
                  url("/d", "2024-01-04"), close=False)
    listing = parse_listing(body, URL)
    assert listing is not None and listing.recovered
    assert [(e["loc"], e["lastmod"]) for e in listing.entries] == [
        ("http://h/a", "2024-01-01"), ("http://h/b", "2024-01-02"),
        ("http://h/c", None), ("http://h/d", None)]


def test_a_bare_ampersand_is_kept_as_written_and_the_later_escapes_decoded():
    rows = [url(f"/p{i}?a=1&amp;b=2") for i in range(50)]
    rows[1] = url("/p1?a=1&b=2")
    listing = parse_listing(urlset(*rows), URL)
    assert listing is not None and not listing.recovered and listing.bare_ampersands == 1
    assert [e["loc"] for e in listing.entries] == [f"http://h/p{i}?a=1&b=2" for i in range(50)]
    # Their dates too: the document is read strictly once escaped.
    assert {e["lastmod"] for e in listing.entries} == {"2024-03-01"}


def test_an_ampersand_in_a_comment_cdata_or_processing_instruction_is_left_alone():
    body = urlset("<!-- a & b --><?pi a & b?>",
                  "<url><loc><![CDATA[http://h/c?a=1&b=2]]></loc></url>", url("/x?a&b"))
    listing = parse_listing(body, URL)
    assert listing is not None and listing.bare_ampersands == 1
    assert [e["loc"] for e in listing.entries] == ["http://h/c?a=1&b=2", "http://h/x?a&b"]


def test_entries_past_the_limit_are_counted_not_kept():
    text = "".join(f"http://h/{i}\n" for i in range(10)).encode()
    listing = parse_listing(text, URL, limit=3)
    assert listing is not None
    assert [e["loc"] for e in listing.entries] == ["http://h/0", "http://h/1", "http://h/2"]
    assert listing.over_limit == 7
    xml = parse_listing(urlset(*(url(f"/{i}") for i in range(10))), URL, limit=4)
    assert xml is not None and len(xml.entries) == 4 and xml.over_limit == 6


def test_a_truncated_text_sitemap_drops_its_last_line_only_when_it_may_be_cut():
    body = b"http://h/a\nhttp://h/b\nhttp://h/page_"
    cut = parse_listing(body, URL, truncated=True)
    assert cut is not None
    assert [e["loc"] for e in cut.entries] == ["http://h/a", "http://h/b"]
    assert cut.ignored_lines == 1
    whole = parse_listing(body, URL)  # no final newline, but not cut off
    assert whole is not None and len(whole.entries) == 3 and whole.ignored_lines == 0
    # Cut off right after a line end: every line is whole.
    ended = parse_listing(b"http://h/a\nhttp://h/b\n", URL, truncated=True)
    assert ended is not None and len(ended.entries) == 2 and ended.ignored_lines == 0


def test_gunzip_tells_a_cut_off_stream_from_a_complete_one():
    data = b"".join(b"http://h/page_%d\n" % i for i in range(20))
    whole = gzip.compress(data)
    assert gunzip(whole, 10_000) == (data, True)
    assert gunzip(whole + gzip.compress(b"more\n"), 10_000) == (data + b"more\n", True)
    assert gunzip(whole + b"\x00" * 8, 10_000) == (data, True)
    partial, complete = gunzip(whole[:-12], 10_000) or (b"", True)
    assert not complete and data.startswith(partial) and partial != data
    assert gunzip(whole, len(data) - 1) is None  # over the size limit
    assert gunzip(b"\x1f\x8b\x08 not gzip", 10_000) is None
    stream = zlib.compressobj(wbits=31)
    flushed = stream.compress(data) + stream.flush(zlib.Z_SYNC_FLUSH)
    assert gunzip(flushed, 10_000) == (data, False)


def test_wide_encodings_are_read_as_xml():
    doc = ('<?xml version="1.0" encoding="UTF-16"?><urlset><url><loc>http://h/é</loc>'
           "</url></urlset>")
    for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32"):
        listing = parse_listing(doc.encode(codec), URL)
        assert listing is not None, codec
        assert [e["loc"] for e in listing.entries] == ["http://h/é"], codec


def test_an_rss_item_link_is_its_own_not_another_namespace_s():
    body = (b'<rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom"><channel><item>'
            b'<atom:link rel="related" href="http://h/related"/><link></link>'
            b"<link>http://h/real</link><guid>http://h/guid</guid></item></channel></rss>")
    listing = parse_listing(body, URL)
    assert listing is not None and [e["loc"] for e in listing.entries] == ["http://h/real"]


def test_a_url_from_an_entity_in_an_attribute_is_unproven():
    body = (b'<!DOCTYPE feed [<!ENTITY e "http://h/from-entity">]>'
            b'<feed xmlns="http://www.w3.org/2005/Atom">'
            b'<entry><link href="&e;"/></entry><entry><link href="http://h/plain"/></entry>'
            b"</feed>")
    listing = parse_listing(body, URL)
    assert listing is not None and listing.unproven == 1
    assert [e["loc"] for e in listing.entries] == ["http://h/plain"]


def test_a_garbled_xml_base_proves_nothing_an_absolute_link_does_not_need_it():
    body = (b'<feed xmlns="http://www.w3.org/2005/Atom" xml:base="http://h/a&nbsp;b/">'
            b'<entry><link href="post"/></entry><entry><link href="http://h/abs"/></entry>'
            b"</feed>")
    listing = parse_listing(body, URL)
    assert listing is not None and listing.recovered and listing.unproven == 1
    assert [e["loc"] for e in listing.entries] == ["http://h/abs"]
