"""Three cluster workers are one polite client of a limited site.

What the site saw of three worker processes' timing (a promise kept within
5 ms of a 429): no other test's crawlers beside (under xdist), apart from
the other cluster tests (tests/test_cluster.py), which run beside others.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import pytest_twisted

from tests.cluster_worker import Worker

pytestmark = pytest.mark.alone


@pytest.mark.parametrize("state_uri", ["redis"], indirect=True)
@pytest_twisted.ensureDeferred
async def test_three_cluster_workers_are_one_polite_client_of_a_limited_site(
    site, state_uri, cluster_prefix, tmp_path
):
    # Politeness on, as shipped: the cluster URL also shares one per-domain
    # budget. The site allows R requests/s per client address; all workers
    # are 127.0.0.1, so it counts them together. 30 pages: their shared
    # window, starting at 8/s, doubles past the site's rate within them.
    rate, burst, n = 10, 3, 30
    site.add_pages(n, size=1000)
    limiter = site.limit(rate=rate, burst=burst)
    polite = ("-s", "INCREMENTAL_THROTTLE_ENABLED=True",
              "-s", f"INCREMENTAL_THROTTLE_SHARED_PREFIX={cluster_prefix}:budget",
              # Each worker alone would offer 8/s: 24/s together.
              "-s", "INCREMENTAL_THROTTLE_START_RATE=8")
    workers = [Worker(site, state_uri, cluster_prefix, tmp_path, str(i), *polite)
               for i in range(3)]
    for worker in workers:
        assert await worker.wait() == 0, worker.tail()
    gets = Counter(r.path for r in site.log if r.path.startswith("/p/") and r.status == 200)
    assert len(gets) == n and max(gets.values()) == 1
    assert sorted(url for w in workers for url in w.urls()) == sorted(
        site.url(f"/p/{i:04d}") for i in range(n))
    n429 = sum(1 for r in site.log if r.status == 429)
    assert n429 <= 0.1 * len(site.log), n429
    assert limiter.broken_promises == 0
    starts = sorted(r.started for r in site.log)
    busiest = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    assert busiest <= rate + burst, busiest
    # The budget came with the cluster URL: every worker took its tokens there.
    assert all(re.search(r"'incremental/throttle/shared/acquires': [1-9]", w.text())
               for w in workers)
