"""Typed access to Twisted's global reactor.

``from twisted.internet import reactor`` is typed as a mix of Twisted's
``zope.interface`` interfaces (``IReactorTime``, ``IReactorTCP``...), whose
methods are declared without ``self``. mypy reads them as plain classes
(the mypy-zope plugin is not used), so it takes each method's first
parameter for ``self`` and rejects every call made through them. The
protocols here state the few methods the package calls, with the
signatures those interfaces document.

The reactor is imported when :func:`get_reactor` is called, never when this
module is imported: Scrapy installs the reactor it wants first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from collections.abc import Callable

    from twisted.internet.address import IPv4Address, IPv6Address
    from twisted.internet.defer import Deferred
    from twisted.internet.protocol import Factory

__all__ = ["ListeningPort", "Reactor", "get_reactor"]


class ListeningPort(Protocol):
    """A listening TCP port (``IListeningPort``)."""

    def getHost(self) -> IPv4Address | IPv6Address: ...

    def stopListening(self) -> Deferred[None] | None: ...


class Reactor(Protocol):
    """The reactor methods the package calls (``IReactorCore``, ``IReactorTime``,
    ``IReactorTCP``)."""

    def callLater(self, delay: float, callable: Callable[..., object],
                  *args: object, **kwargs: object) -> object: ...

    def stop(self) -> None: ...

    def listenTCP(self, port: int, factory: Factory[Any], backlog: int = 50,
                  interface: str = "") -> ListeningPort: ...


def get_reactor() -> Reactor:
    """The installed reactor (installing Twisted's default one if none is)."""
    from twisted.internet import reactor  # noqa: PLC0415 (installed by Scrapy first)

    return cast("Reactor", reactor)
