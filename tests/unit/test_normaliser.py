"""The fingerprint normaliser's shortcuts change nothing: the same text as
applying each pattern with ``re.sub`` and folding with split/join, over a
seeded corpus of texts full of timestamps, near-timestamps and every kind of
whitespace, and over the extracted main texts of the HTML corpus."""

from __future__ import annotations

import random
import re
import sys

from scrapy.http import HtmlResponse

from incremental_crawler.change.fingerprints import (
    _ANCHORS,
    DEFAULT_IGNORE_PATTERNS,
    OTHER_SPACES,
    Normaliser,
    _sub_anchored,
)
from incremental_crawler.spiders.main_text import DEFAULT_TEXT_SELECTORS, extract_main_text
from tests.html_corpus import corpus


def reference(value: str, patterns=DEFAULT_IGNORE_PATTERNS) -> str:
    for pattern in patterns:
        value = re.sub(pattern, " ", value)
    return " ".join(value.split())


FRAGMENTS = (
    "2024-05-01T10:00:00Z", "2024-05-01 10:00", "2024-05-01T10:00:00.123456789+02:00",
    "2024-05-01T10:00:00+0200", "2024-05-01T10:00:00-05", "12024-05-01T10:00:00Z",
    "2024-05-01T10:0", "2024-5-01T10:00", "2024-05-01X10:00", "-05-01T10:", "-05-01T10:00",
    "--05-01T10:00", "2024-05-01T10:00:00.", "2024-05-01T10:002024-05-01T10:00",
    "99-05-01T10:00", "2024-05-01T2024-05-01T10:00", "Mon, 01 Jan 2024 10:00:00 GMT",
    "Tue, 1 Feb 24 10:00 +0100", "Sun, 31 Dec 2023 23:59:59 UTC", "Mon, 01 Foo 2024 10:00 GMT",
    "Wed, 01 Jan 2024 10:00:00", "Sat, 5 May 2024 07:08 -0000", "Fri, 12 Nov 24 10:00:00 +0100",
    "Thu, 1", ", 1", ", ", ",", "Mon", "Mon,", "Mon, ", "MonTue", "Sun, Mon, 01 Jan 2024 10:00 GMT",
    "Mon, 01 Jan 2024 10:00 GMTMon, 02 Jan 2024 11:00 UTC", "Jan", "GMT", " +0100",
    "2024", "-", ":", "T", "0", "12", "10:00", "05-01",
    "word", "café", "日本語", "🐍", " ", "  ", "\t", "\n", "\r\n", "\xa0", "\u3000", "\u2009",
    "\x1c", "\x85", "\u2028", "\u200b", "\x0b\x0c",
)


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 30)))
            for _ in range(n)]


def test_other_spaces_are_every_whitespace_but_the_space() -> None:
    every = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
    assert every.replace(" ", "") == OTHER_SPACES


def test_same_text_as_plain_substitution_and_folding() -> None:
    normaliser = Normaliser()
    cases = texts(20_000, seed=7)
    differ = [t for t in cases if normaliser.text(t) != reference(t)]
    assert not differ, differ[:3]
    # The corpus is worth its name: timestamps were removed from many texts,
    # and many needed no change at all.
    removed = sum(1 for t in cases if reference(t) != " ".join(t.split()))
    folded = sum(1 for t in cases if t == " ".join(t.split()))
    assert removed > 5_000 and folded > 500, (removed, folded)


def test_custom_patterns_and_the_default_among_them() -> None:
    patterns = (r"session=[0-9a-f]+", DEFAULT_IGNORE_PATTERNS[0])
    normaliser = Normaliser(patterns)
    cases = [*texts(3_000, seed=8), "a session=abc1232024-05-01T10:00 b"]
    assert [normaliser.text(t) for t in cases] == [reference(t, patterns) for t in cases]


def test_same_text_on_extracted_page_texts() -> None:
    normaliser = Normaliser()
    for name, body in corpus():
        text = extract_main_text(HtmlResponse("http://127.0.0.1/", body=body, encoding="utf-8"),
                                 DEFAULT_TEXT_SELECTORS)
        assert normaliser.text(text) == reference(text), name


def test_every_whitespace_character_is_folded_wherever_it_stands() -> None:
    """The folded-text shortcut knows each whitespace character on its own:
    alone, leading, trailing, between words, doubled and beside a removed
    timestamp (the random corpus holds only some of them)."""
    normaliser = Normaliser()
    spaces = [c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()]
    others = ["\u200b", "\u180e", "\ufeff", "\x00", "\x1b", "\u00ad", "é", "日", "🐍", "\ud800"]
    cases = [t for c in [*spaces, *others]
             for t in (c, c + c, f"{c}a", f"a{c}", f"a{c}b", f"a {c}b", f"a{c}{c}b",
                       f"a{c}Mon, 01 Jan 2024 10:00 GMT{c}b", f"a{c}2024-05-01T10:00{c}b")]
    assert [normaliser.text(t) for t in cases] == [reference(t) for t in cases]


class _CountingPattern:
    """A compiled pattern that counts the positions it is tried at."""

    def __init__(self, pattern: str) -> None:
        self.pattern = re.compile(pattern)
        self.tries = 0

    def match(self, value: str, pos: int) -> re.Match[str] | None:
        self.tries += 1
        return self.pattern.match(value, pos)


def test_the_date_patterns_are_tried_only_where_a_date_can_start() -> None:
    """Each try at an anchor is a step in Python: text full of ", <digit>"
    (lists of numbers, tables, addresses) must not try the RFC 822 pattern
    at every comma, or it costs several times the plain substitution."""
    numbers = ", ".join(str(i % 100) for i in range(2000))
    table = " ".join(f"Item {i}, {i % 50} units, May {i % 28}, 2024" for i in range(300))
    # Every day's and every month's name, days of one and two digits.
    days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    months = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    dates = "; ".join(f"{days[i % 7]}, {i % 31 + 1} {months[i % 12]} 2024 10:00 GMT"
                      for i in range(84))
    isoish = " ".join(f"v1-{i % 90 + 10}-2{i % 9}T, 12-05-01 {i % 9}" for i in range(300))
    for pattern, text, most in (
        (DEFAULT_IGNORE_PATTERNS[1], numbers + table + isoish, 0),
        (DEFAULT_IGNORE_PATTERNS[1], f"{numbers}; {dates}; {table}", 84),
        (DEFAULT_IGNORE_PATTERNS[0], numbers + table + isoish, 0),
    ):
        counting = _CountingPattern(pattern)
        anchor, offset = _ANCHORS[pattern]
        replaced, n = _sub_anchored(counting, anchor, offset, text)  # type: ignore[arg-type]
        assert (replaced, n) == re.subn(pattern, " ", text)
        assert counting.tries <= most, (pattern[:20], counting.tries)
