"""Recipes: a yielded request to JSON and back, or why not. One table each.

No reactor, no store: real Scrapy requests, spiders and DepthMiddleware.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.http import FormRequest, HtmlResponse, JsonRequest
from scrapy.linkextractors import LinkExtractor
from scrapy.spidermiddlewares.depth import DepthMiddleware
from scrapy.spiders import CrawlSpider, Rule
from scrapy.utils.request import fingerprint
from scrapy.utils.test import get_crawler

from incremental_crawler.crawl.due import RULES_META
from incremental_crawler.crawl.replay import Replayer
from incremental_crawler.recipes import (
    DEFAULT_RULES,
    MAX_RECORD_BYTES,
    NO_FINGERPRINT,
    LinkRecorder,
    RecipeRules,
    Unbuildable,
    Unrecordable,
    build,
    fingerprint_canary,
    load_links,
    own_recipe,
    page_request,
    plain_get_url,
    plain_json,
    read_record,
    recipe_of,
    record_byte_cap,
    record_canary,
    unbuildable,
    unseen_entries,
    user_meta,
)
from incremental_crawler.state.keys import canonical_url, page_key

#: Scrapy's default request fingerprinter, as a crawl's ledger passes it.
FINGERPRINT = get_crawler().request_fingerprinter.fingerprint
CANARY_HEX = fingerprint_canary(FINGERPRINT)


def recorder_of(limit: int) -> LinkRecorder:
    """A page's recorder, as the ledger makes it."""
    return LinkRecorder(SPIDER, RecipeRules(), limit=limit, fingerprint=FINGERPRINT,
                        canary=CANARY_HEX)

URL = "http://example.com/a"


class UnitSpider(Spider):
    name = "unit"

    def parse(self, response):
        return []

    def parse_item(self, response, **kwargs):
        return []

    def on_error(self, failure):
        return []


class Other:
    def parse(self, response):
        return []


class RulesSpider(CrawlSpider):
    name = "rules"
    rules = (
        Rule(LinkExtractor(allow=r"/list/")),  # follow, no callback
        Rule(LinkExtractor(allow=r"/item/"), callback="parse_item"),
    )

    def parse_item(self, response):
        return []


SPIDER = UnitSpider()


def roundtrip(request: Request, spider: Spider = SPIDER,
              rules: RecipeRules = DEFAULT_RULES) -> Request:
    recipe = recipe_of(request, spider, rules)
    assert isinstance(recipe, dict), recipe
    # Through the store's JSON, as a replay reads it.
    rebuilt = build(json.loads(json.dumps(recipe)), spider)
    assert isinstance(rebuilt, Request), rebuilt
    return rebuilt


def same_request(a: Request, b: Request) -> None:
    assert (a.url, a.method, a.callback, a.errback, a.priority, a.dont_filter,
            a.cb_kwargs, a.cookies, a.encoding, a.flags, a.body) == (
        b.url, b.method, b.callback, b.errback, b.priority, b.dont_filter,
        b.cb_kwargs, b.cookies, b.encoding, b.flags, b.body)
    assert dict(a.headers) == dict(b.headers)


ROUNDTRIPS: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("callback", {"callback": SPIDER.parse_item}),
    ("callback and errback", {"callback": SPIDER.parse_item, "errback": SPIDER.on_error}),
    ("cb_kwargs", {"callback": SPIDER.parse_item, "cb_kwargs": {"n": 3, "tags": ["a"]}}),
    ("meta", {"meta": {"page": 2, "link_text": "Next", "nested": {"a": [1, 2.5, None]}}}),
    ("priority", {"priority": -7}),
    ("dont_filter", {"dont_filter": True}),
    ("HEAD", {"method": "HEAD"}),
    ("headers", {"headers": {"Accept": "text/html", "X-Many": ["1", "2"]}}),
    ("cookies", {"cookies": {"currency": "EUR"}}),
    ("flags", {"flags": ["listing"]}),
    ("encoding", {"encoding": "latin-1"}),
    ("public incremental keys", {"meta": {"incremental_variant": "fr",
                                          "incremental_refresh": True}}),
]


@pytest.mark.parametrize(("label", "kwargs"), ROUNDTRIPS, ids=[r[0] for r in ROUNDTRIPS])
def test_a_recorded_request_is_built_again_the_same(label: str, kwargs: dict[str, Any]) -> None:
    request = Request(URL, **kwargs)
    rebuilt = roundtrip(request)
    same_request(rebuilt, request)
    assert rebuilt.meta == request.meta


def test_defaults_are_omitted() -> None:
    assert recipe_of(Request(URL), SPIDER) == {"u": URL}
    assert recipe_of(Request(URL, callback=SPIDER.parse), SPIDER) == {"u": URL, "cb": "parse"}


UNRECORDABLE: list[tuple[str, Any, Unrecordable]] = [
    ("FormRequest", lambda: FormRequest(URL, formdata={"q": "x"}), Unrecordable.REQUEST_CLASS),
    ("JsonRequest", lambda: JsonRequest(URL, data={"q": 1}), Unrecordable.REQUEST_CLASS),
    ("body", lambda: Request(URL, method="POST", body=b"q=x"), Unrecordable.BODY),
    ("lambda", lambda: Request(URL, callback=lambda r: []), Unrecordable.NOT_A_SPIDER_METHOD),
    ("another object's method", lambda: Request(URL, callback=Other().parse),
     Unrecordable.NOT_A_SPIDER_METHOD),
    ("another spider's method", lambda: Request(URL, callback=UnitSpider().parse),
     Unrecordable.NOT_A_SPIDER_METHOD),
    ("errback function", lambda: Request(URL, errback=print), Unrecordable.NOT_A_SPIDER_METHOD),
    ("an item in meta", lambda: Request(URL, meta={"item": Other()}), Unrecordable.META_NOT_JSON),
    ("a tuple in meta", lambda: Request(URL, meta={"pos": (1, 2)}), Unrecordable.META_NOT_JSON),
    ("int keys in meta", lambda: Request(URL, meta={"map": {1: "a"}}),
     Unrecordable.META_NOT_JSON),
    ("NaN in meta", lambda: Request(URL, meta={"x": float("nan")}), Unrecordable.META_NOT_JSON),
    ("a set in cb_kwargs", lambda: Request(URL, callback=SPIDER.parse_item,
                                           cb_kwargs={"seen": {1}}),
     Unrecordable.CB_KWARGS_NOT_JSON),
    ("Authorization", lambda: Request(URL, headers={"Authorization": "Bearer t"}),
     Unrecordable.CREDENTIALS),
    ("Cookie header", lambda: Request(URL, headers={"Cookie": "s=1"}), Unrecordable.CREDENTIALS),
    ("cookies not JSON", lambda: Request(URL, cookies=[{"name": "a", "value": b"x"}]),
     Unrecordable.COOKIES_NOT_JSON),
]


@pytest.mark.parametrize(("label", "make", "reason"), UNRECORDABLE,
                         ids=[r[0] for r in UNRECORDABLE])
def test_what_cannot_be_recorded_says_why(label: str, make: Any, reason: Unrecordable) -> None:
    assert recipe_of(make(), SPIDER) is reason


def test_a_cycle_in_meta_is_not_json() -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert not plain_json(loop)
    assert recipe_of(Request(URL, meta={"loop": loop}), SPIDER) is Unrecordable.META_NOT_JSON


def test_meta_scrapy_and_the_package_manage_is_not_recorded() -> None:
    user = {"page": 2, "download_slot": "shared", "download_timeout": 5.0,
            "incremental_variant": "de", "proxy": "http://proxy:8080"}
    managed = {
        "depth": 3, "download_latency": 0.2, "download_slot": "example.com",
        "download_timeout": 180.0, "redirect_urls": [URL], "redirect_times": 1,
        "redirect_ttl": 19, "redirect_reasons": [301], "retry_times": 1,
        "is_start_request": True, "cache_timestamp": 1.0, "_dont_cache": True,
        "_incremental_txn": object(), "_throttle_seq": 4,
    }
    rules = RecipeRules(download_timeout=180.0)
    # Scrapy's own values (copied with meta=response.meta): none is kept.
    copied = Request(URL, meta=managed)
    assert user_meta(copied, rules) == {}
    assert recipe_of(copied, SPIDER, rules) == {"u": URL}
    # The spider's own choices are, even under the same names.
    chosen = Request(URL, meta={**managed, **user})
    assert user_meta(chosen, rules) == user
    assert roundtrip(chosen, rules=rules).meta == user


def test_our_refetch_and_the_environment_proxy_are_not_the_spiders() -> None:
    request = Request(URL, meta={"incremental_refresh": True, "_incremental_refetch": True,
                                 "proxy": "http://env:3128", "_scheme_proxy": True})
    assert user_meta(request, RecipeRules()) == {}


def test_referer_is_left_to_referer_middleware() -> None:
    request = Request(URL, headers={"Referer": "http://example.com/", "Accept": "a/b"})
    assert recipe_of(request, SPIDER)["h"] == {"Accept": ["a/b"]}


def depth_middleware(prio: int) -> DepthMiddleware:
    return DepthMiddleware.from_crawler(get_crawler(settings_dict={"DEPTH_PRIORITY": prio}))


@pytest.mark.parametrize("prio", [0, 1, -2])
def test_depth_middleware_gives_a_replayed_request_what_it_gave_the_original(prio: int) -> None:
    mw = depth_middleware(prio)
    source = HtmlResponse(URL, body=b"", request=Request(URL, meta={"depth": 2}))
    yielded = mw.get_processed_request(Request(URL + "/b", priority=5), source)
    assert yielded is not None and yielded.meta["depth"] == 3
    rules = RecipeRules(depth_priority=prio)
    recipe = recipe_of(yielded, SPIDER, rules)
    assert isinstance(recipe, dict) and recipe["p"] == 5
    again = mw.get_processed_request(roundtrip(yielded, rules=rules), source)
    assert again is not None
    assert (again.priority, again.meta) == (yielded.priority, yielded.meta)


def test_a_depth_reset_is_asked_for_again() -> None:
    mw = depth_middleware(0)
    source = HtmlResponse(URL, body=b"", request=Request(URL, meta={"depth": 4}))
    yielded = mw.get_processed_request(Request(URL + "/b", meta={"depth_reset": True}), source)
    assert yielded is not None and yielded.meta == {"depth": 0}
    again = mw.get_processed_request(roundtrip(yielded), source)
    assert again is not None and again.meta == {"depth": 0}


BUILD_FAILURES: list[tuple[str, dict[str, Any], Unbuildable]] = [
    ("callback gone", {"u": URL, "cb": "parse_old"}, Unbuildable.CALLBACK_MISSING),
    ("callback not callable", {"u": URL, "cb": "name"}, Unbuildable.CALLBACK_MISSING),
    ("errback gone", {"u": URL, "eb": "on_old_error"}, Unbuildable.ERRBACK_MISSING),
    ("no url", {"cb": "parse"}, Unbuildable.MALFORMED),
    ("meta not a dict", {"u": URL, "meta": [1]}, Unbuildable.MALFORMED),
    ("a bad method", {"u": URL, "m": 3}, Unbuildable.MALFORMED),
    ("a relative url", {"u": "/a"}, Unbuildable.MALFORMED),
    ("not recorded", {"x": "meta_not_json"}, Unbuildable.NOT_RECORDED),
]


@pytest.mark.parametrize(("label", "recipe", "reason"), BUILD_FAILURES,
                         ids=[r[0] for r in BUILD_FAILURES])
def test_what_cannot_be_built_says_why(label: str, recipe: dict[str, Any],
                                       reason: Unbuildable) -> None:
    assert build(recipe, SPIDER) is reason


LISTING = (b'<html><body><a href="/list/2">more</a> <a href="/item/1">One</a>'
           b' <a href="/item/2">Two</a></body></html>')


def rules_requests(spider: CrawlSpider) -> list[Request]:
    response = HtmlResponse("http://example.com/list/1", body=LISTING, encoding="utf-8")
    return [r for r in spider._requests_to_follow(response) if r is not None]


def test_crawl_spider_requests_are_rebuilt_for_their_rule() -> None:
    spider = RulesSpider()
    requests = rules_requests(spider)
    assert [r.meta for r in requests] == [
        {"rule": 0, "link_text": "more"}, {"rule": 1, "link_text": "One"},
        {"rule": 1, "link_text": "Two"}]
    for request in requests:
        rebuilt = roundtrip(request, spider)
        same_request(rebuilt, request)
        assert rebuilt.meta == request.meta
        assert rebuilt.callback == spider._callback


class FewerRulesSpider(RulesSpider):
    rules = (Rule(LinkExtractor(allow=r"/list/")),)


class SwappedRulesSpider(RulesSpider):
    rules = tuple(reversed(RulesSpider.rules))


@pytest.mark.parametrize("changed", [FewerRulesSpider, SwappedRulesSpider])
def test_a_crawl_spider_request_whose_rule_changed_is_not_built(changed: type) -> None:
    spider = RulesSpider()
    item_request = rules_requests(spider)[1]
    recipe = recipe_of(item_request, spider)
    assert isinstance(recipe, dict) and recipe["rc"] == "parse_item"
    assert build(recipe, changed()) is Unbuildable.RULE_MISSING
    # The same rules in another crawl (another instance of the spider) are fine.
    assert isinstance(build(recipe, RulesSpider()), Request)


def test_a_page_records_its_requests_up_to_the_limit() -> None:
    recorder = recorder_of(3)
    for i in range(3):
        assert recorder.add(Request(f"{URL}/{i}", callback=SPIDER.parse_item)) is None
    record = recorder.record()
    assert record is not None and recorder.complete
    assert [r["u"] for r in load_links(record) or []] == [f"{URL}/{i}" for i in range(3)]
    assert recorder.add(Request(f"{URL}/3")) is Unrecordable.OVER_LIMIT
    assert recorder.record() is None and not recorder.complete
    assert recorder.url == f"{URL}/3"


def test_a_record_over_the_byte_bound_is_not_kept() -> None:
    # The cap follows the limit (512 bytes a request), never below 1 MiB.
    assert record_byte_cap(10) == MAX_RECORD_BYTES
    assert record_byte_cap(50_000) == 50_000 * 512
    recorder = recorder_of(1000)
    big = "x" * (record_byte_cap(1000) // 3 - 200)
    reasons = [recorder.add(Request(f"{URL}/{i}", meta={"big": big})) for i in range(4)]
    assert reasons == [None, None, None, Unrecordable.OVER_LIMIT]
    assert recorder.record() is None


def test_the_first_request_that_cannot_be_recorded_decides_and_is_reported_once() -> None:
    recorder = recorder_of(10)
    assert recorder.add(Request(URL)) is None
    assert recorder.add(Request(f"{URL}/2", meta={"item": Other()})) is (
        Unrecordable.META_NOT_JSON)
    assert recorder.add(Request(URL, callback=print)) is None  # reported already
    assert (recorder.unrecordable, recorder.record()) == (Unrecordable.META_NOT_JSON, None)


def test_a_page_records_each_request_fingerprint_once() -> None:
    # Fragments: Scrapy's fingerprint leaves them out, the dupefilter would
    # drop the second behind the first. dont_filter requests pass it: all kept.
    recorder = recorder_of(4)
    for url in (URL, f"{URL}#one", f"{URL}#two", f"{URL}/b", f"{URL}/b#x"):
        assert recorder.add(Request(url)) is None
    for _ in range(2):
        assert recorder.add(Request(URL, dont_filter=True)) is None
    assert recorder.duplicates == 3 and recorder.complete  # 4: duplicates do not count
    record = recorder.record()
    assert record is not None
    entries = read_record(record)
    assert entries is not None
    assert [fp for fp, _ in entries] == [
        FINGERPRINT(Request(URL)).hex(), FINGERPRINT(Request(f"{URL}/b")).hex(), None, None]
    assert NO_FINGERPRINT in record
    assert [r["u"] for r in load_links(record) or []] == [URL, f"{URL}/b", URL, URL]
    assert [r.get("df") for r in load_links(record) or []] == [None, None, True, True]


def test_a_record_says_which_fingerprinter_made_it() -> None:
    recorder = recorder_of(4)
    assert recorder.add(Request(URL)) is None
    record = recorder.record()
    assert record is not None and record_canary(record) == CANARY_HEX
    # One keeping fragments fingerprints the canary otherwise.
    keeping = get_crawler(settings_dict={
        "REQUEST_FINGERPRINTER_CLASS": f"{__name__}.KeepFragments"}).request_fingerprinter
    assert fingerprint_canary(keeping.fingerprint) != CANARY_HEX
    assert record_canary(json.dumps({"v": 1, "r": []})) is None


class KeepFragments:
    """A project's fingerprinter telling fragments apart."""

    def fingerprint(self, request: Request) -> bytes:
        return fingerprint(request, keep_fragments=True)


def test_a_record_of_the_first_format_is_still_read() -> None:
    old = json.dumps({"v": 1, "r": [{"u": URL}, {"u": f"{URL}/b", "cb": "parse_item"}]})
    assert read_record(old) == [(None, {"u": URL}), (None, {"u": f"{URL}/b", "cb": "parse_item"})]
    assert [r["u"] for r in load_links(old) or []] == [URL, f"{URL}/b"]


def unseen_by_read_record(data: str, seen: set[str]) -> list[tuple[Any, Any]] | None:
    """What unseen_entries answers, the plain way: every entry read, in order."""
    entries = read_record(data)
    if entries is None:
        return None
    unseen = []
    for fp, entry in entries:
        if fp is not None:
            if fp in seen:
                continue
            seen.add(fp)
        unseen.append((fp, entry))
    return unseen


def test_unseen_entries_are_read_records_entries_not_met_yet() -> None:
    # Records as a crawl writes them (versions 2 and 3), and every way one can be otherwise:
    # dont_filter entries, another width, a line without a space or shorter
    # than a fingerprint, two spaces, an empty line, a trailing newline, no
    # entries, the first format.
    rng = random.Random(5)
    pool = [f"{i:040x}" for i in range(30)]
    # Twins: the same fingerprint with what may pass one and drop the other.
    pool += [f"{pool[i]}~{i:08x}" for i in range(5)]
    header = '{"v":2,"f":"' + CANARY_HEX + '"}'
    header_v3 = '{"v":3,"f":"' + CANARY_HEX + '"}'

    def line() -> str:
        kind = rng.random()
        recipe = json.dumps({"u": f"{URL}/{rng.randrange(50)}", "meta": {"t": "a b"}},
                            separators=(",", ":"))
        if kind < 0.80:
            return f"{rng.choice(pool)} {recipe}"
        return rng.choice([
            f"{NO_FINGERPRINT} {recipe}", f"abc {recipe}", rng.choice(pool), "", "x",
            f"{rng.choice(pool)[:20]} {rng.choice(pool)[:19]} {recipe}",
            f"{rng.choice(pool)}  {recipe}", f" {recipe}",
        ])

    records = [header, header + "\n", json.dumps({"v": 1, "r": [{"u": URL}]}), "nonsense"]
    for n in range(3000):
        # Mostly small records; every tenth a hub's (up to 100 requests).
        lines = [line() for _ in range(rng.randint(1, 100 if n % 10 == 0 else 12))]
        if rng.random() < 0.5:  # half the records: a crawl's lines only
            lines = [entry for entry in lines if entry.partition(" ")[0] in pool]
        records.append("\n".join([header, *lines]) + ("\n" if rng.random() < 0.05 else ""))
        # The same entries as version 3 writes them (tokens first), and
        # every way such a record can be otherwise: a token line with two
        # spaces or none, fewer or more recipes than tokens, a trailing newline.
        pairs = [entry.partition(" ") for entry in lines]
        tokens = [fp for fp, _, _ in pairs]
        recipes = [text for _, _, text in pairs]
        if rng.random() < 0.3:
            tokens.append(rng.choice([*pool, NO_FINGERPRINT, tokens[0] if tokens else "x"]))
            recipes.append(rng.choice(recipes) if recipes else "{}")
        broken = rng.random()
        token_line = " ".join(tokens)
        if broken < 0.05:
            token_line = token_line.replace(" ", "  ", 1)
        elif broken < 0.10:
            recipes = recipes[:-1]
        elif broken < 0.15:
            recipes = [*recipes, "{}"]
        records.append("\n".join([header_v3, token_line, *recipes])
                       + ("\n" if broken > 0.97 else ""))
    for record in records:
        seen = set(rng.sample(pool, rng.randint(0, len(pool))))
        if rng.random() < 0.1:
            seen.add(NO_FINGERPRINT)  # (never by a crawl: its entries are kept all the same)
        expected_seen = set(seen)
        expected = unseen_by_read_record(record, expected_seen)
        assert unseen_entries(record, seen) == expected, record
        if expected is not None:
            assert seen == expected_seen, record


def test_a_page_without_requests_has_no_record_but_is_complete() -> None:
    recorder = recorder_of(10)
    assert recorder.record() is None and recorder.complete


@pytest.mark.parametrize("data", ["", "nope", "[]", '{"v": 3, "r": []}', '{"v": 1, "r": {}}',
                                  '{"v":2}\nno-separator', '{"v":2}\nabc not-json'])
def test_records_of_another_format_are_not_read(data: str) -> None:
    assert load_links(data) is None


def test_a_pages_own_recipe_rebuilds_its_request() -> None:
    # What the re-seeder gets back: URL and callback from PageState, the rest here.
    plain = Request(URL, callback=SPIDER.parse_item,
                    headers={"User-Agent": "Scrapy", "Cookie": "s=1"},
                    meta={"download_latency": 0.1, "depth": 2, "_incremental_ctx": object()})
    assert own_recipe(plain, SPIDER) is None
    rich = Request(URL, callback=SPIDER.parse_item, errback=SPIDER.on_error, priority=3,
                   meta={"page": 2, "depth": 2}, cb_kwargs={"n": 1})
    recipe = own_recipe(rich, SPIDER)
    assert recipe is not None and json.loads(recipe) == {
        "eb": "on_error", "meta": {"page": 2}, "kw": {"n": 1}, "p": 3}
    rebuilt = page_request(URL, "parse_item", recipe, SPIDER)
    assert isinstance(rebuilt, Request)
    same_request(rebuilt, Request(URL, callback=SPIDER.parse_item, errback=SPIDER.on_error,
                                  priority=3, cb_kwargs={"n": 1}))
    assert rebuilt.meta == {"page": 2}
    unrecordable = own_recipe(Request(URL, meta={"item": Other()}), SPIDER)
    assert unrecordable == '{"x":"meta_not_json"}'
    assert page_request(URL, "parse", unrecordable, SPIDER) is Unbuildable.NOT_RECORDED


def test_a_crawl_spider_pages_own_recipe_keeps_its_rule() -> None:
    spider = RulesSpider()
    item_request = rules_requests(spider)[1]
    recipe = own_recipe(item_request, spider)
    rebuilt = page_request(item_request.url, "_callback", recipe, spider)
    assert isinstance(rebuilt, Request)
    assert rebuilt.meta == {"rule": 1, "link_text": "One"}
    assert page_request(item_request.url, "_callback", recipe,
                        SwappedRulesSpider()) is Unbuildable.RULE_MISSING


#: Of ROUNDTRIPS, the requests whose recipe is a plain GET for the rules
#: (decided by its URL: no method, headers, dont_filter, encoding or meta
#: key the rules read).
PLAIN = {"plain", "callback", "callback and errback", "cb_kwargs", "meta", "priority",
         "cookies", "flags"}


@pytest.mark.parametrize(("label", "kwargs"), ROUNDTRIPS, ids=[r[0] for r in ROUNDTRIPS])
def test_a_plain_get_is_decided_by_its_url_as_its_request_is(label: str,
                                                             kwargs: dict[str, Any]) -> None:
    recipe = json.loads(json.dumps(recipe_of(Request(URL, **kwargs), SPIDER)))
    url = plain_get_url(recipe, RULES_META)
    assert (url is not None) == (label in PLAIN)
    if url is not None:
        built = build(recipe, SPIDER)
        assert isinstance(built, Request)
        assert unbuildable(recipe, SPIDER) is None
        assert url == built.url
        assert page_key(built, "s", default_encoding=b"gzip") == ("s", canonical_url(url), "")


@pytest.mark.parametrize("raw", [
    "http://Example.COM/a b?z=1&a=2#frag", "http://example.com/caf\u00e9/\u043c\u0438\u0440",
    "http://example.com/%7Euser/a%2Fb?q=%E2%82%AC", "http://example.com/a/../b/./c",
    "https://xn--caf-dma.example/\u20ac", "http://example.com/?q=a+b&q=c d",
    "http://127.0.0.1:8080/p/0001.html#s-2",
])
def test_a_recorded_url_gives_the_key_its_request_gives(raw: str) -> None:
    """The recorded URL is the request's, made safe already: the walk keys
    it without ``Request`` making it safe again."""
    recipe = json.loads(json.dumps(recipe_of(Request(raw), SPIDER)))
    url = plain_get_url(recipe, RULES_META)
    assert url is not None
    built = build(recipe, SPIDER)
    assert isinstance(built, Request)
    assert page_key(built, "s") == ("s", canonical_url(url), "")


@pytest.mark.parametrize(("label", "recipe", "reason"), BUILD_FAILURES,
                         ids=[r[0] for r in BUILD_FAILURES])
def test_unbuildable_says_why_as_build_does(label: str, recipe: dict[str, Any],
                                            reason: Unbuildable) -> None:
    # Request's own refusals (a relative URL) only build can tell.
    expected = None if label == "a relative url" else reason
    assert unbuildable(recipe, SPIDER) is expected


def test_a_304_whose_requests_were_all_seen_gets_no_stand_in_unless_one_is_dont_filter(
) -> None:
    """Replayer.response: no stand-in for a record whose every request the
    dupefilter saw; a stand-in when one is ``dont_filter`` (the dupefilter
    lets it through), when one was not seen, when the record is damaged
    (the full replay drops it and flags the page), or when asked always
    (a page not due)."""
    crawler = get_crawler(UnitSpider)
    flagged: list[object] = []
    replayer = Replayer(crawler, SPIDER, lambda key, flags: flagged.append(key))
    seen: set[str] = set()
    replayer._seen_found, replayer._seen = True, lambda fps: {fp for fp in fps if fp in seen}

    def record(*requests: Request) -> str:
        recorder = recorder_of(10)
        for request in requests:
            assert recorder.add(request) is None
        data = recorder.record()
        assert data is not None
        return data

    page = Request(URL, callback=SPIDER.parse_item)
    key = page_key(page, "s", canonical_url)
    plain = [Request(f"{URL}/{i}", callback=SPIDER.parse_item) for i in range(3)]
    seen.update(FINGERPRINT(r).hex() for r in plain)
    assert replayer.response(page, key, record(*plain)) is None
    assert replayer.response(page, key, record(*plain), always=True) is not None
    kept = record(*plain, Request(f"{URL}/x", callback=SPIDER.parse_item, dont_filter=True))
    assert replayer.response(page, key, kept) is not None
    unseen = record(*plain, Request(f"{URL}/new", callback=SPIDER.parse_item))
    assert replayer.response(page, key, unseen) is not None
    damaged = record(*plain).rsplit("\n", 1)[0]
    assert replayer.response(page, key, damaged) is not None
    stats = crawler.stats
    assert stats is not None and stats.get_value("incremental/replay/no_stand_in") == 1
