"""robots.txt rewritten so that Protego groups it as RFC 9309 does (pure)."""

from __future__ import annotations

import pytest

from incremental_crawler.politeness.robots_parser import Rfc9309RobotParser, rfc9309_groups

SITE = "https://example.com"


def allowed(robots_txt: str, agent: str, path: str) -> bool:
    return Rfc9309RobotParser(robots_txt.encode(), None).allowed(SITE + path, agent)


@pytest.mark.parametrize(("value", "token"), [
    ("ExampleBot", "ExampleBot"),
    ("ExampleBot/2.0", "ExampleBot"),
    ("ExampleBot Mozilla/5.0", "ExampleBot"),
    ("Example_Bot-2", "Example_Bot-"),
    ("*", "*"),
    ("* everyone", "*"),
    ("ExampleBot # a comment", "ExampleBot"),
    ("/no-token", ""),
])
def test_a_user_agent_value_becomes_its_product_token(value: str, token: str) -> None:
    assert rfc9309_groups(f"User-agent: {value}") == f"User-agent: {token}".rstrip()


def test_other_lines_in_a_run_of_agents_move_after_it_and_rules_stay() -> None:
    text = ("Sitemap: https://example.com/s.xml\nUser-agent: a\n# note\n\nCrawl-delay: 5\n"
            "User-agent: b\nDissallow: /x\nNoindex: /y\nAllow: /z\nUser-agent: c\n")
    assert rfc9309_groups(text).splitlines() == [
        "Sitemap: https://example.com/s.xml", "User-agent: a", "User-agent: b", "# note", "",
        "Crawl-delay: 5", "Dissallow: /x", "Noindex: /y", "Allow: /z", "User-agent: c"]


def test_the_agents_of_a_run_share_its_rules_and_crawl_delay() -> None:
    text = "User-agent: a\nCrawl-delay: 5\nUser-agent: b\nDisallow: /x\n"
    parser = Rfc9309RobotParser(text.encode(), None)
    assert [parser.allowed(SITE + "/x", agent) for agent in ("a", "b", "c")] == [
        False, False, True]
    assert parser.crawl_delay("a/1.0") == parser.crawl_delay("b") == 5.0


def test_a_crawler_agent_with_a_browser_prefix_still_matches_its_token() -> None:
    # As Protego does: a token found at a word boundary of the User-Agent.
    text = "User-agent: ExampleBot/1.0\nDisallow: /\n"
    assert not allowed(text, "Mozilla/5.0 (compatible; ExampleBot/1.0)", "/a")
    assert allowed(text, "Mozilla/5.0 (compatible; OtherBot/1.0)", "/a")


def test_a_value_without_a_token_matches_nothing_and_keeps_its_run() -> None:
    text = "User-agent: /x\nUser-agent: b\nDisallow: /\nUser-agent: *\nDisallow: /a\n"
    assert not allowed(text, "b", "/q")
    assert allowed(text, "c", "/q") and not allowed(text, "c", "/a")


def test_a_field_that_only_starts_like_user_agent_is_no_user_agent() -> None:
    text = "User-agent: a\nUser-agents-list: b\nDisallow: /\n"
    assert rfc9309_groups(text).splitlines()[1] == "User-agents-list: b"
