"""Old import path of :class:`~incremental_crawler.state.stores.sqlite.SQLiteStateStore`."""

from incremental_crawler.state.stores.sqlite import SQLiteStateStore

__all__ = ["SQLiteStateStore"]
