"""robots.txt parsers against RFC 9309: how many of its rules and examples each reads right.

Each case is a robots.txt, the user agent a crawler sends (the string
Scrapy hands its ``RobotParser``: ``ROBOTSTXT_USER_AGENT``, else the
``User-Agent``), a URL and what RFC 9309 says: allowed or not. The cases are
the RFC's own examples (§2.2.1, §2.2.2, §2.2.3, §5.1, §5.2) and one per rule
it states in its text (section in each name). Every candidate is asked the
same questions through the interface Scrapy's middleware uses
(``allowed(url, user_agent)`` on a parser built from the body). The
parsers that are not Scrapy's match a product token, not a whole
``User-Agent``: they are given the crawler's (its leading letters, ``_``
and ``-``), as a wrapper of ours would.

Run: ``python bench/robots_parsers.py`` (``-v``: every disagreement). A
candidate that is not installed is reported as such; to measure them all::

    pip install protego robotspy gpyrobotstxt fast-robotstxt jwm-robotstxt \\
        robotexclusionrulesparser

The result and the choice it led to are in docs/politeness.md (robots.txt
parser).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Run from a checkout without installing it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: A parser as the measurement sees it: (body, user agent, URL) -> allowed.
Check = Callable[[str, str, str], bool]

SITE = "https://example.com"


@dataclass(frozen=True)
class Case:
    name: str
    body: str
    agent: str
    path: str
    allowed: bool


RFC_5_1 = """\
User-Agent: *
Disallow: *.gif$
Disallow: /example/
Allow: /publications/

User-Agent: foobot
Disallow:/
Allow:/example/page.html
Allow:/example/allowed.gif

User-Agent: barbot
User-Agent: bazbot
Disallow: /example/page.html

User-Agent: quxbot

EOF
"""

RFC_2_2_1_MERGE = """\
user-agent: ExampleBot
disallow: /foo
disallow: /bar

user-agent: ExampleBot
disallow: /baz
"""

CASES: list[Case] = [
    # §5.1, the simple example, as the RFC reads it.
    Case("5.1 foobot: /example/page.html allowed", RFC_5_1, "foobot", "/example/page.html", True),
    Case("5.1 foobot: /example/allowed.gif allowed", RFC_5_1, "foobot",
         "/example/allowed.gif", True),
    Case("5.1 foobot: everything else disallowed", RFC_5_1, "foobot", "/other", False),
    Case("5.1 barbot: /example/page.html disallowed", RFC_5_1, "barbot",
         "/example/page.html", False),
    Case("5.1 bazbot: /example/page.html disallowed", RFC_5_1, "bazbot",
         "/example/page.html", False),
    Case("5.1 barbot: not the * group (a .gif allowed)", RFC_5_1, "barbot", "/a.gif", True),
    Case("5.1 quxbot: an empty group allows everything", RFC_5_1, "quxbot", "/example/", True),
    Case("5.1 others: *.gif$ disallowed", RFC_5_1, "otherbot", "/x/y.gif", False),
    Case("5.1 others: .gif not at the end allowed", RFC_5_1, "otherbot", "/x/y.gifs", True),
    Case("5.1 others: /example/ disallowed", RFC_5_1, "otherbot", "/example/a", False),
    Case("5.1 others: /publications/ allowed", RFC_5_1, "otherbot", "/publications/a", True),
    # §5.2, longest match.
    Case("5.2 the longest match wins (disallow)",
         "User-Agent: foobot\nAllow: /example/page/\nDisallow: /example/page/disallowed.gif\n",
         "foobot", "/example/page/disallowed.gif", False),
    Case("5.2 the longest match wins (allow)",
         "User-Agent: foobot\nAllow: /example/page/\nDisallow: /example/page/disallowed.gif\n",
         "foobot", "/example/page/other", True),
    # §2.2.1: groups and user agents.
    Case("2.2.1 groups of one agent are merged (/foo)", RFC_2_2_1_MERGE, "ExampleBot",
         "/foo", False),
    Case("2.2.1 groups of one agent are merged (/baz)", RFC_2_2_1_MERGE, "ExampleBot",
         "/baz", False),
    Case("2.2.1 the product token is matched case-insensitively",
         "User-agent: examplebot\nDisallow: /\n", "ExampleBot/1.0", "/a", False),
    Case("2.2.1 the crawler's User-Agent is a product token and a version",
         "User-agent: ExampleBot\nDisallow: /\n", "ExampleBot/0.1", "/a", False),
    Case("2.2.1 a user-agent value with a space: its product token",
         "User-agent: ExampleBot Mozilla\nDisallow: /\n", "ExampleBot/1.0", "/a", False),
    Case("2.2.1 a user-agent value with a version: its product token",
         "User-agent: ExampleBot/2.0\nDisallow: /\n", "ExampleBot/1.0", "/a", False),
    Case("2.2.1 no matching group: the * group",
         "User-agent: other\nAllow: /\n\nUser-agent: *\nDisallow: /\n", "ExampleBot", "/a",
         False),
    Case("2.2.1 a matching group: not the * group",
         "User-agent: ExampleBot\nAllow: /\n\nUser-agent: *\nDisallow: /\n", "ExampleBot",
         "/a", True),
    Case("2.2.1 no matching group and no *: no rules apply",
         "User-agent: other\nDisallow: /\n", "ExampleBot", "/a", True),
    Case("2.2.1 a blank line between user-agent lines keeps one group",
         "User-agent: a\n\nUser-agent: ExampleBot\nDisallow: /\n", "a", "/x", False),
    Case("2.2.1 a comment line between user-agent lines keeps one group",
         "User-agent: a\n# note\nUser-agent: ExampleBot\nDisallow: /\n", "a", "/x", False),
    Case("2.2.1 a rule before any user-agent line is no rule",
         "Disallow: /\nUser-agent: ExampleBot\nAllow: /a\n", "ExampleBot", "/b", True),
    # §2.2.2: rules.
    Case("2.2.2 the most octets win",
         "User-agent: *\nDisallow: /a\nAllow: /a/b\n", "ExampleBot", "/a/b/c", True),
    Case("2.2.2 an allow equivalent to a disallow: allowed",
         "User-agent: *\nDisallow: /page\nAllow: /page\n", "ExampleBot", "/page", True),
    Case("2.2.2 no match in the group: allowed",
         "User-agent: *\nDisallow: /private\n", "ExampleBot", "/public", True),
    Case("2.2.2 a group without rules: allowed", "User-agent: *\n", "ExampleBot", "/a", True),
    Case("2.2.2 an empty disallow value: allowed", "User-agent: *\nDisallow:\n",
         "ExampleBot", "/a", True),
    Case("2.2.2 /robots.txt is implicitly allowed", "User-agent: *\nDisallow: /\n",
         "ExampleBot", "/robots.txt", True),
    Case("2.2.2 a rule and a URL percent-encoded alike",
         "User-agent: *\nDisallow: /foo/bar/%E3%83%84\n", "ExampleBot", "/foo/bar/%E3%83%84",
         False),
    Case("2.2.2 a UTF-8 rule matches its percent-encoded URL",
         "User-agent: *\nDisallow: /foo/bar/\u30c4\n", "ExampleBot", "/foo/bar/%E3%83%84",
         False),
    Case("2.2.2 an encoded unreserved octet matches its character",
         "User-agent: *\nDisallow: /foo/bar/%62%61%7A\n", "ExampleBot", "/foo/bar/baz", False),
    Case("2.2.2 matching is case-sensitive in the path",
         "User-agent: *\nDisallow: /Private\n", "ExampleBot", "/private", True),
    Case("2.2.2 record names are case-insensitive",
         "USER-AGENT: *\nDISALLOW: /a\n", "ExampleBot", "/a", False),
    Case("2.2.2 the query is part of the path",
         "User-agent: *\nDisallow: /foo/bar?baz=quz\n", "ExampleBot", "/foo/bar?baz=quz", False),
    # §2.2.3: special characters.
    Case("2.2.3 # starts a comment in a line",
         "User-agent: *\nDisallow: /a # not /a#\n", "ExampleBot", "/a/b", False),
    Case("2.2.3 $ ends the pattern (the path itself)",
         "User-agent: *\nDisallow: /\nAllow: /this/path/exactly$\n", "ExampleBot",
         "/this/path/exactly", True),
    Case("2.2.3 $ ends the pattern (a longer path)",
         "User-agent: *\nDisallow: /\nAllow: /this/path/exactly$\n", "ExampleBot",
         "/this/path/exactly/more", False),
    Case("2.2.3 * is any run of characters",
         "User-agent: *\nDisallow: /\nAllow: /this/*/exactly\n", "ExampleBot",
         "/this/a/b/exactly", True),
    Case("2.2.3 %2A in a rule is a literal *",
         "User-agent: *\nDisallow: /path/file-with-a-%2A.html\n", "ExampleBot",
         "/path/file-with-a-%2A.html", False),
    Case("2.2.3 %24 in a rule is a literal $",
         "User-agent: *\nDisallow: /path/foo-%24\n", "ExampleBot", "/path/foo-%24", False),
    # §2.2.4: other records never interfere with groups.
    Case("2.2.4 a Sitemap line does not end a group",
         "User-agent: a\nSitemap: https://example.com/s.xml\nUser-agent: ExampleBot\n"
         "Disallow: /\n", "a", "/x", False),
    Case("2.2.4 an unknown line does not end a group",
         "User-agent: a\nFoo: bar\nUser-agent: ExampleBot\nDisallow: /\n", "a", "/x", False),
    Case("2.2.4 an unknown line inside a group keeps its rules",
         "User-agent: ExampleBot\nDisallow: /a\nNoindex: /b\nDisallow: /c\n", "ExampleBot",
         "/c", False),
    Case("2.2.4 a Crawl-delay line does not end a group",
         "User-agent: a\nCrawl-delay: 5\nUser-agent: ExampleBot\nDisallow: /\n", "a", "/x",
         False),
]


def _product_token(agent: str) -> str:
    """What Google's parser matches: the leading letters, ``_`` and ``-``."""
    match = re.match(r"[A-Za-z_-]+", agent.strip())
    return match.group(0) if match else ""


def _scrapy(path: str) -> Check:
    """A Scrapy ``RobotParser`` class, as the middleware uses it."""
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)

    def check(body: str, agent: str, url: str) -> bool:
        return bool(cls(body.encode(), None).allowed(url, agent))

    return check


def _robotspy() -> Check:
    robots = importlib.import_module("robots")

    def check(body: str, agent: str, url: str) -> bool:
        return bool(robots.RobotsParser.from_string(body).can_fetch(_product_token(agent), url))

    return check


def _gpyrobotstxt() -> Check:
    matcher = importlib.import_module("gpyrobotstxt.robots_cc").RobotsMatcher

    def check(body: str, agent: str, url: str) -> bool:
        return bool(matcher().allowed_by_robots(body, [_product_token(agent)], url))

    return check


def _fast_robotstxt() -> Check:
    matcher = importlib.import_module("robotstxt").RobotsMatcher

    def check(body: str, agent: str, url: str) -> bool:
        return bool(matcher().is_allowed(body, _product_token(agent), url))

    return check


def _jwm_robotstxt() -> Check:
    matcher = importlib.import_module("jwm.robotstxt.googlebot").RobotsMatcher

    def check(body: str, agent: str, url: str) -> bool:
        return bool(matcher().OneAgentAllowedByRobots(body, _product_token(agent), url))

    return check


#: (name, what it is, how to build its check).
CANDIDATES: list[tuple[str, str, Callable[[], Check]]] = [
    ("protego", "Scrapy's default (ProtegoRobotParser)",
     lambda: _scrapy("scrapy.robotstxt.ProtegoRobotParser")),
    ("RFC 9309 Protego (ours)", "incremental_crawler.politeness.robots_parser",
     lambda: _scrapy("incremental_crawler.politeness.robots_parser.Rfc9309RobotParser")),
    ("urllib.robotparser", "Scrapy's PythonRobotParser",
     lambda: _scrapy("scrapy.robotstxt.PythonRobotParser")),
    ("robotexclusionrulesparser", "Scrapy's RerpRobotParser",
     lambda: _scrapy("scrapy.robotstxt.RerpRobotParser")),
    ("robotspy", "pure Python, RFC 9309", _robotspy),
    ("gpyrobotstxt", "pure-Python port of Google's parser", _gpyrobotstxt),
    ("fast-robotstxt", "ctypes bindings to Google's parser", _fast_robotstxt),
    ("jwm-robotstxt", "pybind11 bindings to Google's parser", _jwm_robotstxt),
]


def measure(check: Check) -> tuple[list[Case], float]:
    """The cases *check* gets wrong, and the seconds per question."""
    wrong = []
    start = time.perf_counter()
    for case in CASES:
        try:
            allowed = check(case.body, case.agent, SITE + case.path)
        except Exception:  # a parser that fails on a case gets it wrong
            allowed = not case.allowed
        if allowed is not case.allowed:
            wrong.append(case)
    return wrong, (time.perf_counter() - start) / len(CASES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="list every disagreement")
    args = parser.parse_args(argv)
    print(f"{len(CASES)} cases from RFC 9309 (its examples and its rules)\n")
    print(f"{'parser':28} {'agree':>7}  {'µs/case':>8}  what")
    for name, what, build in CANDIDATES:
        try:
            check = build()
        except ImportError as exc:
            print(f"{name:28} {'-':>7}  {'-':>8}  not installed ({exc.name})")
            continue
        wrong, seconds = measure(check)
        print(f"{name:28} {len(CASES) - len(wrong):>3}/{len(CASES):<3}  "
              f"{seconds * 1e6:8.0f}  {what}")
        if args.verbose:
            for case in wrong:
                print(f"    wrong: {case.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
