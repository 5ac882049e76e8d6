"""Keys: the canonicaliser's fast path agrees with w3lib's canonicalize_url."""

from __future__ import annotations

import random

from w3lib.url import canonicalize_url

from incremental_crawler.state.keys import Canonicalizer

ALPHABET = "abcXYZ019-._~/%?#&=:@!$'()*+,; "


def test_fast_path_matches_w3lib_on_random_urls():
    canonical = Canonicalizer(size=16)
    rng = random.Random(7)
    hosts = ["a.com", "Example.COM", "127.0.0.1:8080", "x-y.org:80", "ex.com"]
    for _ in range(20_000):
        path = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12)))
        url = f"{rng.choice(['http', 'https'])}://{rng.choice(hosts)}/{path}"
        assert canonical(url) == canonicalize_url(url), url


def test_common_sitemap_urls_take_the_fast_path_unchanged():
    canonical = Canonicalizer()
    for url in ("http://127.0.0.1:9/p/000001", "https://shop.example.com/a/b-c_d.html",
                "https://example.com/"):
        assert canonical(url) == url == canonicalize_url(url)
    assert canonical("http://example.com/./a") == "http://example.com/a"
    assert canonical("http://example.com/a?b=2&a=1") == "http://example.com/a?a=1&b=2"


def test_fast_path_with_a_fragment_matches_w3lib():
    # A fragment after an already-canonical URL is dropped without w3lib:
    # whatever it holds (escapes, spaces, tabs, another '#', non-ASCII).
    canonical = Canonicalizer(size=16)
    rng = random.Random(11)
    fragment_chars = ALPHABET + "\t\n\x00\x7fé€#"
    bases = ["http://127.0.0.1:9/p/0001.html", "https://Example.COM/a", "http://a.com/",
             "http://a.com/./b", "http://a.com/b?c=1", "http://a.com/%7Eb", "http://a.com"]
    for _ in range(5_000):
        fragment = "".join(rng.choice(fragment_chars) for _ in range(rng.randint(0, 12)))
        url = f"{rng.choice(bases)}#{fragment}"
        assert canonical(url) == canonicalize_url(url), url
    assert canonical("http://127.0.0.1:9/p/0001.html#ref-0") == "http://127.0.0.1:9/p/0001.html"
