"""A host group's fine sums by next visit on a cluster (layout 8): 128
hashes a group, a visit's in its hour modulo 128, each field the visit and
its callback; what a flush, a page moved to another hour and the repairs
leave there is what the pages say, and every summary is the pages'.

(Written from the second review of layout 8, which found no test that
failed when a repair left a forgotten page's fine sum behind.)
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import pytest_twisted

from incremental_crawler.state.records import PageKey
from incremental_crawler.state.stores.redis import RedisStateStore
from incremental_crawler.state.stores.redis.core import fine_part, host_group
from tests.redis_cluster_util import own_prefix  # noqa: F401 (the prefix fixture)
from tests.test_store_contract import SCOPE, brute_summary, call, full_state

H = 3_600 * 500_000  # an hour's first second (2027)
K = 128 * 3_600  # two visits K apart share a hash
VISITS = [
    0, 1, 59, 60, 3_599, 3_600, 3_601,
    H - 1, H, H + 59, H + 60, H + 3_599, H + 3_600,
    H + K, H + K + 59, H + K + 60, H - K + 30, H + 2 * K, H - 1 + K,
    10 ** 10, 10 ** 10 + K, 10 ** 10 + 7 * K + 1,
    -7_201, -1, -K - 1,
]


def pages(version: int, shift: int = 0) -> list[tuple[str, int, int]]:
    """(url, version, next visit): each visit on three hosts (other groups)
    and two pages of one host (its group) per visit."""
    out = []
    for n, visit in enumerate(VISITS):
        out.extend((f"https://h{h}.example/v{n}", version, visit + shift) for h in range(3))
        out.append((f"https://same.example/v{n}", version, visit + shift))
    return out


def expected(states: list[Any]) -> tuple[dict, dict]:
    """What the group's fine and coarse sums must hold, from the pages."""
    fine: dict[tuple[str, int], dict[str, list[int]]] = {}
    coarse: dict[str, dict[str, list[int]]] = {}
    for s in states:
        if s.callback is None:
            continue
        tag = f"{{{SCOPE}|{host_group(urlsplit(s.key.url).hostname)}}}"
        v = int(s.next_visit)
        at = fine.setdefault((tag, fine_part(v)), {}).setdefault(f"{v}|{s.callback}", [0, 0])
        at[0] += 1
        at[1] += s.size
        at = coarse.setdefault(tag, {}).setdefault(f"{v // 60}|{s.callback}", [0, 0])
        at[0] += 1
        at[1] += s.size
    return _as_text(fine), _as_text(coarse)


def _as_text(sums: dict[Any, dict[str, list[int]]]) -> dict[Any, dict[str, str]]:
    """Sums as the store keeps them: each field's count and bytes as text."""
    return {k: {f: f"{c} {b}" for f, (c, b) in v.items()} for k, v in sums.items()}


def stored(cluster: Any, prefix: str) -> tuple[dict, dict]:
    fine: dict[tuple[str, int], dict[str, str]] = {}
    coarse: dict[str, dict[str, str]] = {}
    with cluster.client() as client:
        for raw in cluster.keys(f"{prefix}:nvf:*"):
            key = raw.decode()
            tag, _, k = key[len(prefix) + len(":nvf:"):].rpartition(":")
            got = {f.decode(): v.decode() for f, v in client.hgetall(key).items()}
            assert got, key
            fine[tag, int(k)] = got
        for raw in cluster.keys(f"{prefix}:nvs:*"):
            key = raw.decode()
            got = {f.decode(): v.decode() for f, v in client.hgetall(key).items()}
            if got:
                coarse[key[len(prefix) + len(":nvs:"):]] = got
    return fine, coarse


def windows() -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = [(-math.inf, math.inf)]
    for v in VISITS:
        m = v // 60 * 60
        out += [(v - 1, v), (v, v + 1), (v - 61, v), (v, v + 60), (m - 1, m), (m, m + 59),
                (v - 1, v + K), (-math.inf, v), (v, math.inf), (v - 3_601, v + 3_600)]
    return out


async def assert_summaries(store: RedisStateStore, befores=(math.inf,)) -> int:
    states = list(store.iter_pages(SCOPE))
    n = 0
    for before in befores:
        for after, upto in windows():
            got = await call(store.summarize_pages(SCOPE, after=after, upto=upto,
                                                   checked_before=before))
            assert tuple(got) == brute_summary(states, after, upto, before, ()), (
                after, upto, before, tuple(got))
            n += 1
    return n


def assert_stored_is_the_pages(store: RedisStateStore, cluster: Any, prefix: str) -> None:
    states = list(store.iter_pages(SCOPE))
    want_fine, want_coarse = expected(states)
    got_fine, got_coarse = stored(cluster, prefix)
    assert got_fine == want_fine
    assert got_coarse == want_coarse


def stage(store: RedisStateStore, spec: list[tuple[str, int, int]]) -> None:
    for url, version, visit in spec:
        store.stage_page(full_state(PageKey(SCOPE, url), version, callback="parse",
                                    next_visit=visit))


@pytest_twisted.ensureDeferred
async def test_a_groups_fine_sums_are_its_pages_across_hours_moves_and_repairs(
    redis_cluster: Any, prefix: str,
) -> None:
    store = RedisStateStore(redis_cluster.url, prefix=prefix)
    try:
        stage(store, pages(1))
        await call(store.flush())
        assert_stored_is_the_pages(store, redis_cluster, prefix)
        n = await assert_summaries(store)
        # Two visits K apart in one group: one hash, two fields.
        tag = f"{{{SCOPE}|{host_group('same.example')}}}"
        with redis_cluster.client() as client:
            both = client.hgetall(f"{prefix}:nvf:{tag}:{fine_part(H)}")
        assert {f"{H}|parse".encode(), f"{H + K}|parse".encode(),
                f"{H + 2 * K}|parse".encode()} <= set(both)
        # Every page moved to another hour (shift 5 h 7 s), with a mark and
        # a recheck between.
        store.mark_run_start(SCOPE, 2_000_000)
        spec = pages(1)
        moved = [(url, 1_000_000 + 5, visit + 5 * 3_600 + 7) for url, _, visit in spec[::2]]
        stage(store, moved)
        await call(store.flush())
        assert_stored_is_the_pages(store, redis_cluster, prefix)
        n += await assert_summaries(store, befores=(math.inf, 1_000_003, 2_000_001))
        # Moved back into the hash 128 h earlier/later.
        stage(store, [(url, 7, visit - K) for url, _, visit in moved[::3]])
        await call(store.flush())
        assert_stored_is_the_pages(store, redis_cluster, prefix)
        store.forget_page(SCOPE, spec[0][0])
        store.forget_page(SCOPE, spec[1][0])
        store.forget_host(SCOPE, "same.example")
        assert_stored_is_the_pages(store, redis_cluster, prefix)
        n += await assert_summaries(store)
        assert n > 500
    finally:
        await call(store.close())
