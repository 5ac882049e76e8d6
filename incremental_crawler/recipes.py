"""Requests as JSON recipes, and recipes back as requests.

A *recipe* holds what it takes to make a request again for the same spider,
omitting every default: the URL (``u``), the *names* of its callback and
errback (``cb``, ``eb``: methods of the spider), the method (``m``), headers
(``h``), cookies (``ck``), meta (``meta``), ``cb_kwargs`` (``kw``),
priority (``p``), ``dont_filter`` (``df``), flags (``fl``) and encoding
(``enc``). A page's *links record* holds the recipes of the requests its
callback yielded, once each (see :class:`LinkRecorder`), each beside the
request's fingerprint, so that a replay can leave out, unread, the requests
the scheduler's dupefilter already saw this crawl.

A request whose recipe would not make the same request again is not
recorded, and :func:`recipe_of` says why (:class:`Unrecordable`): another
Request class (a ``FormRequest``, a plugin's request: their attributes are
not all known here), a body, a callback or errback that is not a method of
the spider, credentials in its headers (never written to the store), or
meta, ``cb_kwargs`` or cookies that are not plain JSON values (``str``,
``int``, ``float``, ``bool``, ``None``, lists, dicts with ``str`` keys: a
tuple or an item would come back as something else).

Meta keys that Scrapy, its middlewares or this package set on a request on
its way are not the spider's choice and are not recorded (:data:`MANAGED_META`,
and every key starting with ``_``): the replayed request gets them again,
from the same middlewares. The ``Referer`` header is RefererMiddleware's and
is set again the same way. The priority DepthMiddleware took off for the
depth (``DEPTH_PRIORITY``) is added back, since it takes it off again.

Nothing here touches the store, the stats or the reactor.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.spiders import CrawlSpider

from incremental_crawler.hosts import host_of
from incremental_crawler.meta import (
    META_DISCOVERY,
    META_LASTMOD,
    META_REFRESH,
    META_SKIP,
    META_VARIANT,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler

__all__ = [
    "ADVICE",
    "CANARY",
    "DEFAULT_RULES",
    "MANAGED_META",
    "MAX_RECORD_BYTES",
    "NO_FINGERPRINT",
    "REFETCH_MARK",
    "LinkRecorder",
    "RecipeRules",
    "Unbuildable",
    "Unrecordable",
    "build",
    "dumps",
    "entry_fingerprint",
    "fingerprint_canary",
    "load_links",
    "own_recipe",
    "page_request",
    "plain_get_url",
    "plain_json",
    "read_record",
    "recipe_in",
    "recipe_of",
    "record_byte_cap",
    "record_canary",
    "unbuildable",
    "unseen_entries",
    "user_meta",
]

#: The version of the links record's format: a first line
#: ``{"v":3,"f":"<canary>"}``, a second line of the requests' entry tokens
#: separated by spaces (see :func:`entry_fingerprint`), then one line per
#: request, its recipe's JSON, in the tokens' order. A token is the hex of
#: the crawl's request fingerprinter's fingerprint (Scrapy's dupefilter
#: key), ``-`` for a ``dont_filter`` request (never left out: the
#: dupefilter lets it through). The tokens come first, together, so that a
#: reader leaving out the requests it met already (the stored-graph walk:
#: most of a page's links are its neighbours' too) tests them as one set,
#: not line by line. The canary is that fingerprinter's fingerprint of
#: :data:`CANARY`: a record made under another fingerprinter
#: (``REQUEST_FINGERPRINTER_CLASS`` changed: one that keeps fragments, say)
#: tells requests apart otherwise, and is not taken for this crawl's
#: (:func:`record_canary`). Records of version 2 (one line per request,
#: ``<token> <recipe JSON>``) and 1 (``{"v":1,"r":[recipe, ...]}``, no
#: tokens) are still read.
FORMAT = 3
# With the comma: a version 30 is not version 3.
_HEADER_V3 = '{"v":3,'
_HEADER_V2 = '{"v":2,'
_HEADERS = (_HEADER_V3, _HEADER_V2)
#: A request whose fingerprint tells fingerprinters apart: a fragment, a
#: query, a header (a fingerprinter keeping fragments, sorting or not the
#: query, including headers fingerprints it otherwise).
CANARY = Request("http://canary.invalid/a?b=2&a=1#f", headers={"Accept-Language": "x"})
#: A ``dont_filter`` request's place of a fingerprint.
NO_FINGERPRINT = "-"

#: A links record holds at most this many bytes per request it may hold
#: (INCREMENTAL_REPLAY_MAX_REQUESTS), on average, and never less than
#: MAX_RECORD_BYTES: a page yielding more is not recorded (``over_limit``).
#: A request's line is ~100-300 bytes; the cap stops requests carrying large
#: meta, not hub pages.
BYTES_PER_REQUEST = 512
MAX_RECORD_BYTES = 1 << 20

#: Set by the change-detection middleware on its own full re-fetch after a
#: 304 it could not take, together with ``incremental_refresh``: that
#: refresh is ours, not the spider's, and is not recorded.
REFETCH_MARK = "_incremental_refetch"

#: Meta keys Scrapy's components set on a request on its way (downloader,
#: redirects, retries, the HTTP cache, depth, start requests): copied from
#: ``response.meta`` they are not the spider's choice, and the replayed
#: request gets its own. Keys starting with ``_`` (internals: Scrapy's
#: ``_dont_cache``, ``_auth_proxy``, ours ``_incremental_*`` and
#: ``_throttle_*``) are never recorded either.
MANAGED_META = frozenset({
    "cache_timestamp",
    "cached_response",
    "depth",
    "download_latency",
    "is_start_request",
    "redirect_reasons",
    "redirect_times",
    "redirect_ttl",
    "redirect_urls",
    "retry_times",
})

#: Headers carrying credentials: a request with one is not recorded, so the
#: store never holds a password or a session token (and a token that
#: expired is never replayed).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})

#: Meta keys by which, of two requests of one fingerprint, one may be dropped
#: and the other let through between PageOutputMiddleware and the dupefilter
#: (the not-due filter, the offsite check): both are recorded.
_PASS_KEYS = (META_REFRESH, META_SKIP, META_DISCOVERY, META_LASTMOD, META_VARIANT,
              "allow_offsite")

#: Between the fingerprint and the mark of a request's twin (see
#: :func:`entry_fingerprint`).
_TWIN = "~"


def _passes(request: Request) -> str:
    """What of *request* (beyond its fingerprint) may let it pass where its
    twin is dropped before the dupefilter; empty when nothing does."""
    values = [request.meta.get(key) for key in _PASS_KEYS]
    encoding = request.headers.get(b"Accept-Encoding")
    if encoding is None and all(v is None for v in values):
        return ""
    return repr((*values, encoding))


def entry_fingerprint(token: str) -> str:
    """The request fingerprint of a links record's entry token.

    A token is the fingerprint, or for a request carrying meta that may let
    it pass where another of the same fingerprint is dropped before the
    dupefilter (:data:`_PASS_KEYS`, an Accept-Encoding of its own), the
    fingerprint, ``~`` and a short hash of those: both requests are
    recorded, and a walk of the stored links tells them apart without
    reading their recipes.

    >>> entry_fingerprint("ab12"), entry_fingerprint("ab12~0f0f0f0f")
    ('ab12', 'ab12')
    """
    return token.partition(_TWIN)[0]


#: Deeper JSON is taken for not JSON (and a cycle ends here).
_MAX_DEPTH = 32


class Unrecordable(StrEnum):
    """Why a request cannot be recorded: its page is fetched in full next time.

    The values are the last part of ``incremental/replay/unrecordable/<reason>``.
    """

    #: Not exactly ``scrapy.Request`` (``FormRequest``, a plugin's class).
    REQUEST_CLASS = "request_class"
    #: A request body (a POST's form or JSON).
    BODY = "body"
    #: A callback or errback that is not a method of the spider (a
    #: function, a lambda, another object's method).
    NOT_A_SPIDER_METHOD = "not_a_spider_method"
    #: An ``Authorization``, ``Proxy-Authorization`` or ``Cookie`` header.
    CREDENTIALS = "credentials"
    META_NOT_JSON = "meta_not_json"
    CB_KWARGS_NOT_JSON = "cb_kwargs_not_json"
    COOKIES_NOT_JSON = "cookies_not_json"
    #: More distinct requests than INCREMENTAL_REPLAY_MAX_REQUESTS, or a
    #: record over its byte cap (:func:`record_byte_cap`).
    OVER_LIMIT = "over_limit"


#: What a spider can do about each reason (the ledger's warning says it).
ADVICE: dict[Unrecordable, str] = {
    Unrecordable.REQUEST_CLASS:
        "only plain scrapy.Request objects are recorded (not FormRequest or a plugin's "
        "request class)",
    Unrecordable.BODY: "requests with a body are not recorded",
    Unrecordable.NOT_A_SPIDER_METHOD:
        "give callback and errback a method of the spider (not a function, a lambda, "
        "a functools.partial or another object's method); pass arguments in cb_kwargs",
    Unrecordable.CREDENTIALS:
        "credentials are never written to the state store: let a downloader middleware "
        "add Authorization or Cookie headers (HttpAuthMiddleware, CookiesMiddleware)",
    Unrecordable.META_NOT_JSON:
        "keep meta to plain JSON values (str, numbers, bool, None, lists, dicts with str "
        "keys): pass an item's fields (dict(item)), not the item, and lists, not tuples",
    Unrecordable.CB_KWARGS_NOT_JSON:
        "keep cb_kwargs to plain JSON values (str, numbers, bool, None, lists, dicts with "
        "str keys)",
    Unrecordable.COOKIES_NOT_JSON: "keep cookies to plain JSON values",
    Unrecordable.OVER_LIMIT:
        "the page yields more distinct requests than INCREMENTAL_REPLAY_MAX_REQUESTS (or "
        "more than 512 bytes of recipe per request it allows, on average); raise the setting",
}


class Unbuildable(StrEnum):
    """Why a recipe cannot be made a request again for this spider.

    The values are the last part of ``incremental/replay/dropped/<reason>``.
    """

    #: The spider has no method of the recorded callback's name any more.
    CALLBACK_MISSING = "callback_missing"
    ERRBACK_MISSING = "errback_missing"
    #: A CrawlSpider's recorded rule index is out of range, or the rule at
    #: that index has another callback now (the rules were changed).
    RULE_MISSING = "rule_missing"
    #: Not a recipe this version writes.
    MALFORMED = "malformed"
    #: A page's own request could not be recorded (:func:`own_recipe`).
    NOT_RECORDED = "not_recorded"


@dataclass(frozen=True, slots=True)
class RecipeRules:
    """The crawl's settings that decide what a yielded request's recipe holds."""

    #: DEPTH_PRIORITY: DepthMiddleware took ``depth * depth_priority`` off
    #: the request's priority, and takes it off again when it is replayed.
    depth_priority: int = 0
    #: The ``download_timeout`` DownloadTimeoutMiddleware gives every
    #: request: a meta value equal to it is Scrapy's, not the spider's.
    download_timeout: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        timeout = getattr(crawler.spider, "download_timeout", None)
        if timeout is None:
            timeout = settings.getfloat("DOWNLOAD_TIMEOUT")
        return cls(depth_priority=settings.getint("DEPTH_PRIORITY"),
                   download_timeout=float(timeout))


#: Scrapy's defaults (no DEPTH_PRIORITY, no default download_timeout known).
DEFAULT_RULES = RecipeRules()


def plain_json(value: Any, depth: int = 0) -> bool:
    """Whether *value* comes back from JSON equal to itself.

    Text, numbers (finite), booleans, ``None``, lists, and dicts with text
    keys; subclasses of ``str``, ``int`` and ``dict`` come back as the base
    type, equal (lxml's text results, enums). A tuple would come back a
    list, an int key a string, an object not at all.

    >>> plain_json({"a": [1, 2.5, None, True]}), plain_json((1, 2)), plain_json({1: "a"})
    (True, False, False)
    """
    if depth > _MAX_DEPTH:
        return False
    if value is None or isinstance(value, (str, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if type(value) is list:
        return all(plain_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain_json(v, depth + 1) for k, v in value.items())
    return False


def dumps(value: Any) -> str:
    """Compact JSON (the store keeps it as it is)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def user_meta(request: Request, rules: RecipeRules) -> dict[str, Any]:
    """The request's meta without the keys Scrapy or this package manage (see the module)."""
    meta = request.meta
    host = host_of(request.url)
    kept: dict[str, Any] = {}
    for key, value in meta.items():
        if key.startswith("_") or key in MANAGED_META:
            continue
        if key == "proxy" and "_scheme_proxy" in meta:
            continue  # HttpProxyMiddleware's, from the environment: it sets it again
        if key == META_REFRESH and REFETCH_MARK in meta:
            continue  # our re-fetch after a 304 we could not take
        if key == "download_slot" and value == host:
            continue  # the slot Scrapy's downloader gives the host anyway
        if key == "download_timeout" and value == rules.download_timeout:
            continue  # DownloadTimeoutMiddleware's default
        kept[key] = value
    return kept


def _method_name(func: Callable[..., Any] | None, spider: Spider) -> str | Unrecordable | None:
    """The name of the spider method *func* is (``None`` for none)."""
    if func is None:
        return None
    name = getattr(func, "__name__", None)
    if (name and getattr(func, "__self__", None) is spider
            and getattr(spider, name, None) == func):
        return name
    return Unrecordable.NOT_A_SPIDER_METHOD


def _rule_callback(spider: Spider, index: int) -> str | None:
    """The name of the callback of the CrawlSpider's rule *index* ("" for none)."""
    rules = getattr(spider, "_rules", None)
    if rules is None or not 0 <= index < len(rules):
        return None
    return getattr(rules[index].callback, "__name__", "")


def _crawl_rule(spider: Spider, callback: str | None, meta: Mapping[str, Any]) -> int | None:
    """The rule index of a request CrawlSpider made for one of its rules."""
    rule = meta.get("rule")
    if (isinstance(spider, CrawlSpider) and callback == "_callback"
            and type(rule) is int):
        return rule
    return None


def recipe_of(request: Request, spider: Spider, rules: RecipeRules = DEFAULT_RULES, *,
              own: bool = False) -> dict[str, Any] | Unrecordable:
    """The recipe of *request*, yielded by a callback of *spider*, or why there is none.

    With *own*, the parts of a page's own request besides its URL and its
    callback (kept apart, in PageState): its headers are then not recorded
    either, since the downloader middlewares added theirs (cookies, user
    agent, credentials) and they cannot be told apart from the spider's.
    """
    names = _names(request, spider, own=own)
    if isinstance(names, Unrecordable):
        return names
    callback, errback = names
    headers = {} if own else _headers(request)
    if isinstance(headers, Unrecordable):
        return headers
    meta = user_meta(request, rules)
    depth = request.meta.get("depth")
    if not own and depth == 0 and type(depth) is int:
        # DepthMiddleware gives a yielded request its source's depth + 1, or
        # 0 when it consumed the spider's depth_reset: ask for it again.
        meta["depth_reset"] = True
    for value, reason in ((meta, Unrecordable.META_NOT_JSON),
                          (request.cb_kwargs, Unrecordable.CB_KWARGS_NOT_JSON),
                          (request.cookies, Unrecordable.COOKIES_NOT_JSON)):
        if not plain_json(value):
            return reason
    priority = request.priority
    if rules.depth_priority and type(depth) is int:
        priority += depth * rules.depth_priority
    rule = _crawl_rule(spider, callback, meta)
    parts: dict[str, Any] = {
        "u": None if own else request.url,
        "cb": None if own else callback,
        "eb": errback,
        "m": None if request.method == "GET" else request.method,
        "h": headers or None,
        "ck": request.cookies or None,
        "meta": meta or None,
        "kw": request.cb_kwargs or None,
        "p": priority or None,
        "df": True if request.dont_filter else None,
        # Log labels only: anything but text is left out.
        "fl": [f for f in request.flags if type(f) is str] or None,
        "enc": None if request.encoding == "utf-8" else request.encoding,
        # The rule's callback now: a replay checks the rules did not change.
        "rc": None if rule is None else _rule_callback(spider, rule),
    }
    return {key: value for key, value in parts.items() if value is not None}


def _names(request: Request, spider: Spider, *, own: bool
           ) -> tuple[str | None, str | None] | Unrecordable:
    """The names of the request's callback and errback, or why it cannot be recorded."""
    if type(request) is not Request:
        return Unrecordable.REQUEST_CLASS
    if request.body:
        return Unrecordable.BODY
    callback = _method_name(request.callback, spider)
    errback = _method_name(request.errback, spider)
    if isinstance(errback, Unrecordable):
        return errback
    if isinstance(callback, Unrecordable):
        # A page's own callback is kept apart (PageState.callback, None then).
        return (None, errback) if own else callback
    return callback, errback


def _headers(request: Request) -> dict[str, list[str]] | Unrecordable:
    headers: dict[str, list[str]] = {}
    for name, values in request.headers.items():
        text = name.decode("latin-1")
        lowered = text.lower()
        if lowered == "referer":
            continue  # RefererMiddleware's
        if lowered in CREDENTIAL_HEADERS:
            return Unrecordable.CREDENTIALS
        headers[text] = [v.decode("latin-1") for v in values]
    return headers


def own_recipe(request: Request, spider: Spider, rules: RecipeRules = DEFAULT_RULES
               ) -> str | None:
    """PageState.recipe of the page *request* fetched: JSON, ``None`` for nothing beyond
    its URL and callback, ``{"x": reason}`` when it cannot be recorded."""
    recipe = recipe_of(request, spider, rules, own=True)
    if isinstance(recipe, Unrecordable):
        return dumps({"x": str(recipe)})
    return dumps(recipe) if recipe else None


def _resolve(spider: Spider, name: Any) -> tuple[bool, Callable[..., Any] | None]:
    """``(found, method)``: the spider's method *name* (``None`` for no name)."""
    if name is None:
        return True, None
    method = getattr(spider, name, None) if isinstance(name, str) else None
    return (True, method) if callable(method) else (False, None)


#: The JSON type of each recipe field (``u``, ``cb`` and ``eb`` are checked apart).
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "m": str, "h": dict, "ck": (dict, list), "meta": dict, "kw": dict, "p": int,
    "df": bool, "fl": list, "enc": str, "rc": str,
}


def unbuildable(recipe: Mapping[str, Any], spider: Spider) -> Unbuildable | None:
    """Why *recipe* cannot be made into a request for *spider* (``None``: it
    can, but for what ``Request`` itself refuses, which :func:`build` says)."""
    found = _methods(recipe, spider)
    return found if isinstance(found, Unbuildable) else None


def _methods(recipe: Mapping[str, Any], spider: Spider
             ) -> Unbuildable | tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
    """The callback and errback of *recipe* (methods of *spider*, or
    ``None``), or why it cannot be made into a request (:func:`unbuildable`)."""
    if "x" in recipe:
        return Unbuildable.NOT_RECORDED
    if not isinstance(recipe.get("u"), str):
        return Unbuildable.MALFORMED
    found, callback = _resolve(spider, recipe.get("cb"))
    if not found:
        return Unbuildable.CALLBACK_MISSING
    found, errback = _resolve(spider, recipe.get("eb"))
    if not found:
        return Unbuildable.ERRBACK_MISSING
    # The recipe's own fields (a few), not every field a recipe may have.
    for key, value in recipe.items():
        kind = _FIELD_TYPES.get(key)
        if kind is not None and not isinstance(value, kind):
            return Unbuildable.MALFORMED
    rule = _crawl_rule(spider, recipe.get("cb"), recipe.get("meta", {}))
    if rule is not None:
        current = _rule_callback(spider, rule)
        if current is None or current != recipe.get("rc", current):
            return Unbuildable.RULE_MISSING
    return callback, errback


def build(recipe: Mapping[str, Any], spider: Spider) -> Request | Unbuildable:
    """The request *recipe* describes, for *spider*, or why it cannot be made."""
    methods = _methods(recipe, spider)
    if isinstance(methods, Unbuildable):
        return methods
    callback, errback = methods
    try:
        return Request(
            recipe["u"], callback=callback,
            method=recipe.get("m", "GET"), headers=recipe.get("h"), cookies=recipe.get("ck"),
            meta=recipe.get("meta", {}), encoding=recipe.get("enc", "utf-8"),
            priority=recipe.get("p", 0), dont_filter=bool(recipe.get("df", False)),
            errback=errback, flags=recipe.get("fl"),
            cb_kwargs=recipe.get("kw"),
        )
    except (TypeError, ValueError):
        return Unbuildable.MALFORMED


def plain_get_url(recipe: Mapping[str, Any], read_meta: frozenset[str]) -> str | None:
    """The URL of *recipe* when its request is a plain GET: an http(s) URL
    that ``Request`` leaves as it is, no headers, no ``dont_filter``, no
    encoding of its own, and none of the meta keys *read_meta* (nor
    ``verbatim_url``); ``None`` otherwise.

    For code that decides a stored request by rules reading only those meta
    keys and the URL: such a request is decided from its URL, without being
    built. The URL is the request's ``url`` as recorded, which ``Request``
    made safe already, so ``safe_url_string`` gives it back unchanged when
    it is built again, with one exception: a URL ending in a space or a
    control character (``Request("http://h #").url``), which it strips. A
    URL that is not plain printable ASCII without spaces is left to
    ``Request``.
    """
    if "m" in recipe and recipe["m"] != "GET":
        return None
    if "h" in recipe or recipe.get("df") or "enc" in recipe:
        return None
    meta = recipe.get("meta", {})
    if not isinstance(meta, dict) or not (read_meta.isdisjoint(meta)
                                          and _URL_META.isdisjoint(meta)):
        return None
    url = recipe.get("u")
    if not (isinstance(url, str) and url.startswith(_WEB_PREFIXES) and url.isascii()
            and url.isprintable() and " " not in url):
        return None
    return url


#: The URLs :func:`plain_get_url` takes.
_WEB_PREFIXES = ("http://", "https://")
#: Meta keys by which ``Request`` makes its URL otherwise.
_URL_META = frozenset({"verbatim_url"})


def page_request(url: str, callback: str | None, recipe: str | None,
                 spider: Spider) -> Request | Unbuildable:
    """A stored page's request again, from its URL, callback name and PageState.recipe."""
    try:
        parts = json.loads(recipe) if recipe else {}
    except ValueError:
        return Unbuildable.MALFORMED
    if not isinstance(parts, dict):
        return Unbuildable.MALFORMED
    return build({**parts, "u": url, "cb": callback}, spider)


def record_byte_cap(limit: int) -> int:
    """The most bytes a links record of at most *limit* requests may hold."""
    return max(MAX_RECORD_BYTES, limit * BYTES_PER_REQUEST)


def read_record(data: str) -> list[tuple[str | None, str | dict[str, Any]]] | None:
    """The entries of a links record: ``(fingerprint, recipe)`` each.

    The fingerprint is ``None`` where the record has none (a ``dont_filter``
    request, or a record of version 1); the recipe is its JSON text, left
    unparsed (a replay parses only those it builds), or already a dict (a
    record of version 1). ``None``: not a record this version reads.
    """
    if data.startswith(_HEADER_V3):
        parts = _v3_parts(data)
        if parts is None:
            return None
        return [(None if token == NO_FINGERPRINT else token, recipe)
                for token, recipe in zip(*parts, strict=True)]
    if data.startswith(_HEADER_V2):
        entries: list[tuple[str | None, str | dict[str, Any]]] = []
        for line in data.split("\n")[1:]:
            fp, sep, text = line.partition(" ")
            if not sep:
                return None
            entries.append((None if fp == NO_FINGERPRINT else fp, text))
        return entries
    recipes = _load_v1(data)
    return None if recipes is None else [(None, recipe) for recipe in recipes]


def record_tokens(data: str, *, whole: bool = False) -> list[str] | None:
    """The entry tokens of a links record of version 3 (a request's
    fingerprint, or NO_FINGERPRINT), read without parsing its recipes;
    ``None`` for a record of another version, or not one. *whole*: also
    ``None`` when the record does not hold a recipe line per token (a
    damaged record, which a replay drops)."""
    if not data.startswith(_HEADER_V3):
        return None
    found = _v3_tokens(data)
    if found is None:
        return None
    tokens, start = found
    if whole and data.count("\n", start) + 1 != len(tokens):
        return None
    return tokens


def _v3_tokens(data: str) -> tuple[list[str], int] | None:
    """A record of version 3's tokens, and where its recipes' lines start;
    ``None``: not one (a record holds one request at least)."""
    head = data.find("\n")
    end = data.find("\n", head + 1) if head >= 0 else -1
    if end < 0:
        return None
    tokens = data[head + 1:end].split(" ")
    return None if "" in tokens else (tokens, end + 1)


def _v3_parts(data: str) -> tuple[list[str], list[str]] | None:
    """A record of version 3's tokens and recipes' lines; ``None``: not one."""
    found = _v3_tokens(data)
    if found is None:
        return None
    tokens, start = found
    recipes = data[start:].split("\n")
    return (tokens, recipes) if len(recipes) == len(tokens) else None


def unseen_entries(data: str, seen: set[str]
                   ) -> list[tuple[str | None, str | dict[str, Any]]] | None:
    """The entries of a links record (:func:`read_record`) whose fingerprint
    is not in *seen*, in their order, each fingerprint added to *seen* as
    it is met (so a second entry with it is left out too); entries without
    one are all kept. ``None``: not a record this version reads (*seen* may
    then hold some of its fingerprints).

    What the stored-graph walk reads of every record of a crawl: most of a
    page's requests (navigation, index pages) were met on other pages
    already. A record of version 3 is tested as a set of tokens, and only
    the recipes' lines of a record with an unseen one are split.
    """
    if data.startswith(_HEADER_V3):
        return _unseen_v3(data, seen)
    if not data.startswith(_HEADER_V2):
        return read_record(data)  # no fingerprints: every entry is kept
    unseen: list[tuple[str | None, str | dict[str, Any]]] = []
    lines = data.split("\n")
    del lines[0]
    for line in lines:
        fingerprint, sep, text = line.partition(" ")
        if not sep:
            return None
        if fingerprint == NO_FINGERPRINT:
            unseen.append((None, text))
        elif fingerprint not in seen:
            seen.add(fingerprint)
            unseen.append((fingerprint, text))
    return unseen


def _unseen_v3(data: str, seen: set[str]
               ) -> list[tuple[str | None, str | dict[str, Any]]] | None:
    found = _v3_tokens(data)
    if found is None:
        return None
    tokens, start = found
    fresh = set(tokens)
    fresh -= seen
    if not fresh and NO_FINGERPRINT not in tokens:
        # As many recipes' lines as tokens: counted, not split.
        return [] if data.count("\n", start) + 1 == len(tokens) else None
    recipes = data[start:].split("\n")
    if len(recipes) != len(tokens):
        return None
    unseen: list[tuple[str | None, str | dict[str, Any]]] = []
    for token, recipe in zip(tokens, recipes, strict=True):
        if token == NO_FINGERPRINT:
            unseen.append((None, recipe))
        elif token in fresh:
            fresh.discard(token)  # a token met twice is taken once
            seen.add(token)
            unseen.append((token, recipe))
    return unseen


def fingerprint_canary(fingerprint: Callable[[Request], bytes]) -> str:
    """The canary a links record made with *fingerprint* carries."""
    return fingerprint(CANARY).hex()


def record_canary(data: str) -> str | None:
    """The canary of a links record's fingerprints (``None``: a record
    without fingerprints, of version 1, or not one this version reads)."""
    if not data.startswith(_HEADERS):
        return None
    # The header line alone (partition would copy the whole record after
    # it), parsed once per distinct header: a crawl's records share one.
    end = data.find("\n")
    line = data if end < 0 else data[:end]
    if line in _CANARIES:
        return _CANARIES[line]
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    canary = header.get("f") if isinstance(header, dict) else None
    if not isinstance(canary, str):
        canary = None
    if len(line) <= _CANARY_LINE_MAX:  # a header, not a broken record's one line
        if len(_CANARIES) >= _CANARIES_KEPT:
            _CANARIES.clear()
        _CANARIES[line] = canary
    return canary


#: record_canary's answers by header line (a crawl meets one or two).
_CANARIES: dict[str, str | None] = {}
_CANARIES_KEPT = 16
_CANARY_LINE_MAX = 256


def load_links(data: str) -> list[Any] | None:
    """The recipes of a links record, parsed (``None``: not a record this version reads)."""
    entries = read_record(data)
    if entries is None:
        return None
    recipes = [recipe_in(entry) for _, entry in entries]
    return None if None in recipes else recipes


def recipe_in(entry: str | dict[str, Any]) -> Any:
    """The recipe of a record's entry, parsed (``None``: not JSON)."""
    if not isinstance(entry, str):
        return entry
    try:
        return json.loads(entry)
    except ValueError:
        return None


def _load_v1(data: str) -> list[Any] | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("v") != 1:
        return None
    recipes = record.get("r")
    return recipes if isinstance(recipes, list) else None


class LinkRecorder:
    """The recipes of one page's yielded requests, as they are yielded, once each.

    Each recipe is JSON at once: the request's meta may change on its way
    through the downloader, and what was yielded is what counts. A request
    whose fingerprint an earlier one of the page had (the same URL with
    another fragment, say: Scrapy's fingerprint leaves fragments out) is
    not recorded: replayed, the dupefilter would drop it behind the first.
    ``dont_filter`` requests are all recorded (the dupefilter lets them
    through).
    """

    __slots__ = ("cap", "duplicates", "fingerprint", "header", "limit", "recipes", "rules",
                 "seen", "size", "spider", "tokens", "unrecordable", "url")

    def __init__(self, spider: Spider, rules: RecipeRules, limit: int,
                 fingerprint: Callable[[Request], bytes], canary: str) -> None:
        self.spider = spider
        self.rules = rules
        #: INCREMENTAL_REPLAY_MAX_REQUESTS: distinct requests (fingerprints).
        self.limit = limit
        self.cap = record_byte_cap(limit)
        #: The crawl's request fingerprinter (``crawler.request_fingerprinter``).
        self.fingerprint = fingerprint
        #: The entries' tokens and recipes' JSON, in the order yielded.
        self.tokens: list[str] = []
        self.recipes: list[str] = []
        #: The entries' tokens recorded (see :func:`entry_fingerprint`).
        self.seen: set[str] = set()
        #: Requests not recorded for an earlier one of the same fingerprint.
        self.duplicates = 0
        self.header = dumps({"v": FORMAT, "f": canary})
        self.size = len(self.header)
        #: Why not every request could be recorded (the first reason met),
        #: and the URL of that request.
        self.unrecordable: Unrecordable | None = None
        self.url: str | None = None

    def add(self, request: Request) -> Unrecordable | None:
        """Record *request*; the reason if it (and so the page) cannot be."""
        if self.unrecordable is not None:
            return None  # the page is fetched in full anyway: reported once
        if request.dont_filter:
            fp = NO_FINGERPRINT
        else:
            # Requests of one fingerprint are told apart by what may drop one
            # and pass the other before the dupefilter (the not-due filter, the
            # offsite check): replayed, the one that passed must be there.
            fp = self.fingerprint(request).hex()
            passes = _passes(request)
            if passes:
                # (A label, not a secret: any short stable hash would do.)
                fp = f"{fp}{_TWIN}{hashlib.blake2s(passes.encode(), digest_size=4).hexdigest()}"
            if fp in self.seen:
                self.duplicates += 1
                return None
            self.seen.add(fp)
        recipe = recipe_of(request, self.spider, self.rules)
        if isinstance(recipe, Unrecordable):
            return self._fail(recipe, request.url)
        text = dumps(recipe)
        # Its token, a space or newline, its recipe, a newline.
        self.size += len(fp) + len(text.encode()) + 2
        if len(self.tokens) >= self.limit or self.size > self.cap:
            return self._fail(Unrecordable.OVER_LIMIT, request.url)
        self.tokens.append(fp)
        self.recipes.append(text)
        return None

    def _fail(self, reason: Unrecordable, url: str) -> Unrecordable:
        self.unrecordable, self.url = reason, url
        self.tokens, self.recipes = [], []
        self.seen = set()
        return reason

    @property
    def complete(self) -> bool:
        return self.unrecordable is None

    def record(self) -> str | None:
        """The links record to store (``None``: no request, or not all recorded)."""
        if self.unrecordable is not None or not self.tokens:
            return None
        return "\n".join((self.header, " ".join(self.tokens), *self.recipes))
