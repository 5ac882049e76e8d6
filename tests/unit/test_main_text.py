"""Main-text extraction read from the lxml tree gives exactly the text the
selector-based extraction gave, page by page, over a corpus of pages with
real pages' structure and hazards (:mod:`tests.html_corpus`)."""

from __future__ import annotations

from collections import Counter

import pytest
from scrapy.http import HtmlResponse

from incremental_crawler.spiders.main_text import (
    DEFAULT_TEXT_SELECTORS,
    extract_main_text,
)
from tests.html_corpus import corpus, reference_main_text

SELECTOR_LISTS = [
    DEFAULT_TEXT_SELECTORS,
    ("div.c1", *DEFAULT_TEXT_SELECTORS),
    ("#n7", *DEFAULT_TEXT_SELECTORS),
    ("section > p", "nav"),
    ("td, th", "li"),
    ("noscript",),
    ("script", "style"),
    ("title",),
    ("p::text",),
    ("a::attr(class)", "body"),
    ("[role=MAIN]", "Main"),
    ("no-such-element",),
]

PAGES = corpus()


def _response(body: bytes) -> HtmlResponse:
    return HtmlResponse("http://127.0.0.1/page", body=body, encoding="utf-8")


@pytest.mark.parametrize("selectors", SELECTOR_LISTS, ids="|".join)
def test_same_text_as_the_selector_based_extraction(selectors) -> None:
    differ = []
    for name, body in PAGES:
        expected = reference_main_text(_response(body), selectors)
        got = extract_main_text(_response(body), selectors)
        if got != expected:
            differ.append((name, expected[:200], got[:200]))
    assert not differ, f"{len(differ)} pages differ, first: {differ[0]}"


def test_the_corpus_exercises_every_case() -> None:
    """The corpus is worth its name: the default selectors land on each kind
    of main element, and exclusion matters on many pages."""
    chosen: Counter[str] = Counter()
    excluded_inside = excluded_above = nonempty = 0
    for _name, body in PAGES:
        response = _response(body)
        for css in DEFAULT_TEXT_SELECTORS:
            found = response.css(css)
            if found:
                chosen[css] += 1
                node = found[0]
                all_text = " ".join(node.xpath(".//text()").getall()).split()
                kept = reference_main_text(response, DEFAULT_TEXT_SELECTORS).split()
                if kept and kept != all_text:
                    excluded_inside += 1
                if all_text and not kept and node.xpath(
                        "ancestor::script or ancestor::style or ancestor::noscript").get() == "1":
                    excluded_above += 1
                nonempty += bool(kept)
                break
    assert all(chosen[css] >= 5 for css in DEFAULT_TEXT_SELECTORS), chosen
    assert excluded_inside >= 50, excluded_inside
    assert excluded_above >= 2, excluded_above
    assert nonempty >= 300, nonempty
