"""A repair's hold on its scope (``scrapy state forget``, ``forget-host``,
``reset``): taken before the repair reads anything, alone (no crawl, cluster
worker or other repair holds the scope beside it, and none can start while
it holds), renewed while the repair runs, released when it ends; a repair
killed leaves a hold that lapses by itself a ttl later (never taken over
because its pid is not running here: in another PID namespace it may be).

The hold has a store of its own (the same URI, opened again): the renewal
runs in a thread of its own while the repair works on the command's store.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import TYPE_CHECKING

from incremental_crawler import clock
from incremental_crawler.state.stores.base import (
    REPAIR_HOLD,
    RepairStopped,
    StateStoreError,
    describe_holder,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from incremental_crawler.state.stores import AdminStore

__all__ = ["REPAIR_HOLD_TTL", "HoldLost", "RepairHold", "ScopeTaken"]

#: Seconds a repair's hold lasts unless renewed (every third of it): as a
#: crawl's, so that a killed repair's scope is free a minute later.
REPAIR_HOLD_TTL = 60.0


class ScopeTaken(Exception):
    """Another holds the scope: *holder* (a hold's name), until *expires*."""

    def __init__(self, holder: str, expires: float) -> None:
        super().__init__(holder, expires)
        self.holder = holder
        self.expires = expires


class HoldLost(Exception):
    """The repair's hold could not be kept while it ran; the message says why."""


class RepairHold:
    """``with RepairHold(open_store, scope):`` the repair inside holds *scope*
    alone; :class:`ScopeTaken` when another holds it. *open_store* opens the
    hold's own store (the command's URI)."""

    def __init__(self, open_store: Callable[[], AdminStore], scope: str,
                 ttl: float = REPAIR_HOLD_TTL) -> None:
        self._open_store = open_store
        self.scope = scope
        self.ttl = ttl
        self.name = f"{REPAIR_HOLD}{socket.gethostname()}:{os.getpid()}"
        self._store: AdminStore | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._held_until = 0.0
        #: Why a renewal failed (None while every one held).
        self.lost: str | None = None

    def __enter__(self) -> RepairHold:
        store = self._store = self._open_store()
        try:
            now = clock.now()
            held = store.take_scope(self.scope, self.name, self.ttl, now)
        except BaseException:
            self._close()
            raise
        if held is not None:
            self._close()
            raise ScopeTaken(*held)
        self._held_until = now + self.ttl
        self._renewer = threading.Thread(target=self._renew, name="repair-hold", daemon=True)
        self._renewer.start()
        return self

    def _renew(self) -> None:
        assert self._store is not None
        failure = ""  # why the renewals since the last one that held failed
        # Bounded by the repair: the command sets _stop when it ends.
        while not self._stop.wait(self.ttl / 3):
            now = clock.now()
            try:
                held = self._store.take_scope(self.scope, self.name, self.ttl, now)
            except StateStoreError as exc:
                # Tried again at the next third, while the hold lasts.
                failure = f"the hold could not be renewed: {exc}"
                if clock.now() >= self._held_until:
                    self.lost = (f"the hold lapsed ({failure}) and a crawl may have "
                                 "written meanwhile")
                    return
                continue
            if held is not None:
                self.lost = (f"{describe_holder(held[0])} took the scope (the hold "
                             f"lapsed{f': {failure}' if failure else ''})")
                return
            if now >= self._held_until:
                # Renewed, but late: another may have held the scope
                # meanwhile, and ended.
                self.lost = (f"the hold lapsed ({failure or 'renewed late'}) and a crawl "
                             "may have written meanwhile")
                return
            self._held_until = now + self.ttl
            failure = ""

    def check(self) -> None:
        """Before a step of the repair that deletes: raises
        :class:`RepairStopped` once the hold is lost, or may have lapsed
        (its renewals failed up to its lapse), so that the repair deletes
        nothing further beside another holder."""
        lost = self.lost
        if lost is None and clock.now() >= self._held_until:
            lost = "the hold may have lapsed: it could not be renewed in time"
        if lost is not None:
            raise RepairStopped(lost)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        lost = self.lost
        if lost is None and clock.now() >= self._held_until:
            # The last renewals failed, and the hold ended meanwhile.
            lost = "the hold lapsed (it could not be renewed in time)"
        self._close(release=True)
        if lost is not None and kind is None:
            raise HoldLost(lost)

    def _close(self, release: bool = False) -> None:
        store, self._store = self._store, None
        if store is None:
            return

        async def close() -> None:
            try:
                if release:
                    await store.release_scope(self.scope, self.name)
            finally:
                await store.close()

        asyncio.run(close())
