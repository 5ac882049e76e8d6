"""robots.txt read as RFC 9309 groups it, by Protego.

Protego, Scrapy's default parser, misreads two things that RFC 9309 and
Google's reference parser read alike:

* a ``User-agent:`` value with more than a product token (``ExampleBot
  Mozilla``, ``ExampleBot/2.0``) is matched as a whole, so it matches no
  crawler: RFC 9309 §2.2.1 matches the product token, the letters, ``_``
  and ``-`` it starts with;
* any line between two ``User-agent:`` lines (an unknown record, a
  ``Crawl-delay``) ends the first one's group, so its agents get no rules:
  §2.2.4 says other records never interfere with groups, and only a rule
  (``Allow``, ``Disallow``) ends the run of ``User-agent:`` lines (§2.2.1's
  grammar; blank lines and comments never do).

:class:`Rfc9309RobotParser` hands Protego the file rewritten so that it
reads it the RFC's way: each ``User-agent:`` value is its product token
(``*`` stays ``*``; a value with none keeps its line, matching nothing), and
the other lines met in a run of ``User-agent:`` lines are moved after the
run, ahead of its first rule. Nothing else changes: Protego's matching of
paths, its tolerance of misspellings (``Dissallow``, ``Useragent``),
``Crawl-delay`` and ``Sitemap`` stay as they are. ``bench/robots_parsers.py``
measures it against the other candidates on RFC 9309's rules and examples
(docs/politeness.md says the result).

The add-on makes it ``ROBOTSTXT_PARSER`` at its priority: a project's own
setting wins.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from protego import Protego
from scrapy.robotstxt import ProtegoRobotParser, decode_robotstxt

if TYPE_CHECKING:
    from scrapy import Spider

__all__ = ["RFC9309_PARSER", "Rfc9309RobotParser", "rfc9309_groups"]

#: The dotted path the add-on sets as ``ROBOTSTXT_PARSER``.
RFC9309_PARSER = "incremental_crawler.politeness.robots_parser.Rfc9309RobotParser"

# A record's field, before its colon (Protego also reads "User agent foo"
# without one: the user-agent spellings are matched on their own).
_USER_AGENT = re.compile(r"^(\s*user[- ]?agent(?=[\s:])\s*:?)(.*)$", re.IGNORECASE)
_FIELD = re.compile(r"^\s*([a-z][a-z -]*?)\s*:", re.IGNORECASE)
# The rules, in the spellings Protego reads as them: they end a run of
# user-agent lines.
_RULES = frozenset({"allow", "disallow", "dissallow", "dissalow", "disalow", "diasllow",
                    "disallaw"})
# RFC 9309 §2.2.1: product-token = identifier / "*"; identifier =
# 1*(%x2D / %x41-5A / %x5F / %x61-7A).
_TOKEN = re.compile(r"[A-Za-z_-]+")


def _product_token(value: str) -> str:
    value = value.split("#", 1)[0].strip()
    if value.startswith("*") and (len(value) == 1 or value[1].isspace()):
        return "*"  # as Google's parser: "* anything" is the global group
    match = _TOKEN.match(value)
    return match.group(0) if match else ""


def rfc9309_groups(text: str) -> str:
    """*text* rewritten so that Protego groups it as RFC 9309 does (module docstring).

    >>> rfc9309_groups("User-agent: a b\\nFoo: 1\\nUser-agent: c/2\\nDisallow: /\\n")
    'User-agent: a\\nUser-agent: c\\nFoo: 1\\nDisallow: /'
    """
    out: list[str] = []
    held: list[str] = []  # lines met in a run of user-agent lines
    in_run = False
    for line in text.splitlines():
        agent = _USER_AGENT.match(line)
        if agent is not None:
            out.append(f"{agent.group(1)} {_product_token(agent.group(2))}".rstrip())
            in_run = True
            continue
        if not in_run:
            out.append(line)
            continue
        field = _FIELD.match(line.split("#", 1)[0])
        if field is not None and field.group(1).replace(" ", "").lower() in _RULES:
            out += held
            held = []
            out.append(line)
            in_run = False
        else:
            held.append(line)
    return "\n".join(out + held)


class Rfc9309RobotParser(ProtegoRobotParser):
    """Scrapy's Protego parser, over the file as RFC 9309 groups it."""

    def __init__(self, robotstxt_body: bytes, spider: Spider | None) -> None:
        self.spider = spider
        self.rp = Protego.parse(rfc9309_groups(decode_robotstxt(robotstxt_body, spider)))
