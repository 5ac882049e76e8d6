"""The Python window and the Lua budget take the same steps on the same signals.

One process keeps its slot's window in :class:`DomainWindow`; with
``INCREMENTAL_THROTTLE_SHARED_URL`` all workers keep it in Redis, changed by
``budget.lua``. Both must grow and cut a site's rate by the same rules, or a
site sees a different crawler depending on how it is deployed. Each row
applies one sequence of signals to both, the script in the real Redis (db
10, a key prefix of the test's own), and after every step the rates agree
exactly (Redis writes a Lua number with the digits it takes to read it back
the same, so the script's stored rate is the double it computed) and are
the row's expected rate.

Where they differ by design, the rows feed each side what it is told in a
crawl:

* **Latency**: ``DomainWindow.ok(latency)`` ignores an answer slower than
  the target latency; the worker reports ``good`` to the script only for
  fast ones (``AdaptiveThrottle._response_downloaded``). Every answer here is
  fast.
* **A soft error after a hard one** is hard: the window counts consecutive
  hard signals, the script does not; the worker reports such an error to the
  script as a hard signal (``AdaptiveThrottle._share``), and so does this test.
* **Sequence numbers**: the window stamps a request as it reaches the
  downloader, the script numbers tokens as it grants them; "send n" draws n
  of each. The token bucket is not under test: its clock is wound back
  before each draw (``ts`` = 0) so that the tokens are there without waiting.
* Only in the script: tokens, freezes, parks, the Crawl-delay cap (it bounds
  the pace, not the stored rate); several signals in one round trip (applied
  healthy answers first, then soft errors, then the hard signal: one kind per
  step here). Only in the window: latencies, concurrency, the penalty box,
  the delay floor, backoff.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from incremental_crawler.politeness.budget import BUDGET_LUA, Grant, script_args
from incremental_crawler.politeness.window import DomainWindow, WindowPolicy
from tests.redis_util import BUDGET_REDIS_URI

FAST = 0.01  # seconds: below any target latency here

#: A step: ("send", n) | ("ok", n) | ("hard", seq or None) | ("soft", seq), and
#: the rate expected after it. seq None: a request without a sequence number
#: (it counts as the latest one sent).
Step = tuple[tuple[str, Any], float]

ROWS: dict[str, tuple[WindowPolicy, list[Step]]] = {
    "slow start doubles after each window of healthy answers": (
        WindowPolicy(start_rate=4, max_rate=50),
        [(("ok", 1), 4), (("ok", 2), 4), (("ok", 1), 8), (("ok", 7), 8), (("ok", 1), 16),
         (("ok", 16), 32)],
    ),
    "additive increase after the first hard signal": (
        WindowPolicy(start_rate=4, max_rate=50, increase=1, decrease=0.7),
        [(("send", 1), 4), (("hard", 1), 2.8), (("ok", 2), 2.8), (("ok", 1), 3.8),
         (("ok", 3), 3.8), (("ok", 1), 4.8), (("ok", 5), 5.8)],
    ),
    "a hard signal cuts once per window of requests in flight": (
        WindowPolicy(start_rate=10, decrease=0.7),
        [(("send", 10), 10), (("hard", 1), 7), (("hard", 2), 7), (("hard", 10), 7),
         (("send", 1), 7), (("hard", 5), 7), (("hard", 11), 4.9), (("hard", 11), 4.9),
         (("send", 3), 4.9), (("hard", 14), 3.43)],
    ),
    "a signal without a sequence number counts as the latest request": (
        WindowPolicy(start_rate=10, decrease=0.5),
        [(("send", 3), 10), (("hard", None), 5), (("hard", None), 5), (("send", 1), 5),
         (("hard", None), 2.5)],
    ),
    "soft errors cost a little each, one after a hard signal is hard": (
        WindowPolicy(start_rate=10, decrease=0.5, soft_decrease=0.9),
        [(("soft", 0), 9), (("soft", 0), 8.1), (("ok", 8), 8.1), (("ok", 1), 16.2),
         (("send", 2), 16.2), (("hard", 1), 8.1),
         (("soft", 2), 8.1),  # after a hard one: hard, and in flight before the cut
         (("send", 1), 8.1), (("soft", 3), 4.05),  # hard again: a new window
         (("ok", 1), 4.05), (("soft", 3), 3.645)],  # a healthy answer ends the run
    ),
    "healthy answers reset the count towards the next window": (
        WindowPolicy(start_rate=4, soft_decrease=0.5),
        [(("ok", 3), 4), (("soft", 0), 2), (("ok", 1), 2), (("ok", 1), 4)],
    ),
    "the rate stays within min_rate and max_rate": (
        WindowPolicy(start_rate=4, min_rate=1, max_rate=6, decrease=0.7, soft_decrease=0.5),
        [(("ok", 4), 6), (("ok", 20), 6), (("send", 1), 6), (("hard", 1), 4.2),
         (("ok", 5), 5.2), (("ok", 6), 6), (("ok", 6), 6),
         (("send", 1), 6), (("hard", 2), 4.2), (("send", 1), 4.2), (("hard", 3), 2.94),
         (("send", 1), 2.94), (("hard", 4), 2.058), (("send", 1), 2.058),
         (("hard", 5), 1.4406), (("send", 1), 1.4406), (("hard", 6), 1.00842),
         (("send", 1), 1.00842), (("hard", 7), 1), (("send", 1), 1), (("hard", 8), 1),
         (("ok", 1), 2), (("soft", 8), 1), (("soft", 8), 1)],
    ),
    # INCREMENTAL_THROTTLE_DOMAINS overrides are fields of the policy: one
    # can put the global start rate outside a domain's bounds.
    "a start rate above max_rate starts at max_rate": (
        WindowPolicy(start_rate=8, max_rate=3),
        [(("ok", 3), 3), (("send", 1), 3), (("hard", 1), 2.1)],
    ),
    "a start rate below min_rate starts at min_rate": (
        WindowPolicy(start_rate=0.5, min_rate=2, max_rate=10),
        [(("ok", 1), 2), (("ok", 1), 4)],
    ),
}


class Script:
    """The Lua budget of one slot, called as workers call it."""

    def __init__(self, client: redis.Redis, key: str, policy: WindowPolicy) -> None:
        self.client, self.key, self.policy = client, key, policy
        self.sha = client.script_load(BUDGET_LUA)
        self.sent = 0

    def call(self, op: str, **kwargs: Any) -> Grant:
        args = script_args(op, self.policy, **kwargs)
        return Grant.from_reply(self.client.evalsha(self.sha, 1, self.key, *args))

    def send(self, n: int) -> Grant:
        """n tokens, numbered on from the last (the bucket filled before each draw)."""
        got = 0
        grant = None
        for _ in range(10 * n):  # bounded: a full bucket grants at least one
            if got == n:
                break
            self.client.hset(self.key, "ts", 0)
            grant = self.call("acquire", want=n - got)
            assert grant.granted >= 1 and grant.first_seq == self.sent + 1
            got += grant.granted
            self.sent += grant.granted
        assert got == n and grant is not None
        return grant

    def stored_rate(self) -> float:
        return float(self.client.hget(self.key, "rate"))


def step_window(window: DomainWindow, kind: str, arg: Any) -> None:
    if kind == "send":
        for _ in range(arg):
            window.stamp()
    elif kind == "ok":
        for _ in range(arg):
            window.ok(FAST)
    elif kind == "hard":
        window.hard_error(window.sent if arg is None else arg)
    else:
        window.soft_error(arg)


def step_script(script: Script, window: DomainWindow, kind: str, arg: Any) -> Grant:
    """What a worker sends the script for the step (*window*: before the step)."""
    if kind == "send":
        return script.send(arg)
    if kind == "ok":
        return script.call("report", good=arg)
    if kind == "hard":
        return script.call("report", hard_seq=-1 if arg is None else arg)
    # A soft error after a hard signal is reported as hard (AdaptiveThrottle._share).
    if window.consecutive_hard > 0:
        return script.call("report", hard_seq=arg)
    return script.call("report", soft=1)


@pytest.fixture
def client():
    client = redis.Redis.from_url(BUDGET_REDIS_URI)
    yield client
    client.close()


@pytest.mark.parametrize("row", list(ROWS))
def test_the_window_and_the_script_agree_after_every_step(row, client, budget_prefix):
    policy, steps = ROWS[row]
    window = DomainWindow(policy)
    script = Script(client, f"{budget_prefix}:example.com", policy)
    for number, ((kind, arg), expected) in enumerate(steps, 1):
        grant = step_script(script, window, kind, arg)
        step_window(window, kind, arg)
        where = f"step {number} {kind} {arg}"
        assert script.stored_rate() == window.rate, where
        assert grant.rate == pytest.approx(window.rate, abs=1e-6), where
        assert window.rate == pytest.approx(expected), where
        assert script.sent == window.sent, where


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_a_domain_max_rate_below_the_global_min_rate_caps_the_script(kind, client,
                                                                    budget_prefix):
    # INCREMENTAL_THROTTLE_DOMAINS = {"slow.example": {"max_rate": 0.05}}: one
    # request in 20 s, below the global min_rate (0.1). A cut stops at
    # min_rate, above this max_rate: the bounds are applied after the
    # signals too, max_rate last, so an error never speeds the domain up.
    # (DomainWindow's cuts stop at min_rate here: a case no parity row has.)
    policy = WindowPolicy(max_rate=0.05)
    assert policy.min_rate > policy.max_rate
    script = Script(client, f"{budget_prefix}:slow.example", policy)
    assert script.send(1).rate == pytest.approx(0.05)
    grant = script.call("report", hard_seq=1) if kind == "hard" else script.call("report", soft=1)
    assert grant.rate == pytest.approx(0.05)
    assert script.stored_rate() == pytest.approx(0.05)
