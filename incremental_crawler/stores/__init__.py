"""Old import paths of the state stores, kept so that settings written for them work.

The stores live in :mod:`incremental_crawler.state.stores`; an
``INCREMENTAL_STATE_STORES`` that names
``incremental_crawler.stores.sqlite.SQLiteStateStore`` (or ``.redis``) still
loads them.
"""

from incremental_crawler.state.stores import StateStore, StateStoreError, open_store

__all__ = ["StateStore", "StateStoreError", "open_store"]
