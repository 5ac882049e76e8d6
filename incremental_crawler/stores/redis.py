"""Old import path of :class:`~incremental_crawler.state.stores.redis.RedisStateStore`."""

from incremental_crawler.state.stores.redis import RedisStateStore

__all__ = ["RedisStateStore"]
