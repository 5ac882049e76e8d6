"""Politeness: per-slot AIMD windows, Retry-After, Crawl-delay, a shared budget.

- :mod:`.window`: the AIMD window of one download slot (pure);
- :mod:`.retry_after`: Retry-After values (pure);
- :mod:`.errors`: what a download error weighs (timeout, hard, soft), by type;
- :mod:`.budget`: one window and token bucket per slot in Redis, shared by
  every worker (its Lua script is ``budget.lua``);
- :mod:`.extension`: ``AdaptiveThrottle``, which applies the windows to
  Scrapy's download slots;
- :mod:`.middlewares`: the Retry-After retries and the shared budget's gate.
"""
