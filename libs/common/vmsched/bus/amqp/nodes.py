"""Connecting to one of several RabbitMQ nodes of a cluster, and reconnecting to the next one.

aio-pika's robust connection reconnects to the one URL it was given, so a bus pointed at a node
that is gone would wait for that node forever while its peers hold the (quorum) queues. A
`FailoverConnection` is the same robust connection (channels, exchanges, queues and consumers
restored on reconnect) whose URL moves to the next node before every connection attempt after
the first: the robust connection clears its transport at the start of each attempt, which is
where the URL is moved on (aio-pika has no hook of its own for it). After a lost connection, the
channels are restored one reconnect interval after connecting (see `_on_connected`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
from aio_pika.abc import AbstractRobustConnection, UnderlayConnection
from aio_pika.robust_connection import RobustConnection
from yarl import URL

from vmsched.reach import TlsFiles
from vmsched.settings import Settings


def amqp_urls(settings: Settings) -> list[str]:
    """amqp_url, then every other node of amqp_failover_urls (each once, in the order given)."""
    urls = [settings.amqp_url]
    for raw in settings.amqp_failover_urls.split(","):
        url = raw.strip()
        if url and url not in urls:
            urls.append(url)
    return urls


class FailoverConnection(RobustConnection):
    """A robust connection that tries its nodes in turn, starting at `first`."""

    def __init__(self, url: URL, *, nodes: list[str], first: int = 0, **kwargs: Any) -> None:
        self._nodes = [URL(u) for u in nodes] or [url]
        self._index = first % len(self._nodes)
        self._attempts = 0
        self._transport: UnderlayConnection | None = None
        self._initialised = False  # Connection.__init__ clears the transport too: not an attempt
        super().__init__(self._nodes[self._index], **kwargs)
        self._initialised = True

    @property
    def transport(self) -> UnderlayConnection | None:
        return self._transport

    @transport.setter
    def transport(self, value: UnderlayConnection | None) -> None:
        if value is None and self._initialised:
            # Every attempt but the very first starts here on the next node (closing clears it
            # too: moving on then is harmless, nothing connects after a close).
            if self._attempts and len(self._nodes) > 1:
                self._index = (self._index + 1) % len(self._nodes)
                self.url = self._nodes[self._index]
            self._attempts += 1
        self._transport = value

    async def _on_connected(self) -> None:
        # After a lost connection, wait one reconnect interval before restoring the channels: the
        # node that went may have led queues whose new leaders are still being elected, and a
        # consumer restored on such a queue can hang for seconds until the broker closes the
        # connection (INTERNAL_ERROR). Until then the connection counts as not yet back.
        if self._attempts > 1:
            await asyncio.sleep(self.reconnect_interval)
        await super()._on_connected()

    @property
    def node(self) -> URL:
        """The node the connection is (or will next be) on."""
        return self.url


async def connect_failover(settings: Settings, **kwargs: Any) -> AbstractRobustConnection:
    """A robust connection to the first node of `amqp_urls(settings)` that answers; the last
    failure if none does. Later reconnects go round the nodes from the one it is on."""
    nodes = amqp_urls(settings)
    if any(u.startswith("amqps:") for u in nodes):
        # amqps:// nodes connect over TLS with this context; aiormq ignores it for amqp:// ones.
        kwargs.setdefault("ssl_context", TlsFiles.of(settings, "amqp").context())
    if len(nodes) == 1:
        conn: AbstractRobustConnection = await aio_pika.connect_robust(nodes[0], **kwargs)
        return conn
    last: BaseException | None = None
    for first in range(len(nodes)):
        try:
            conn = await aio_pika.connect_robust(nodes[first], connection_class=_bound(nodes, first), **kwargs)
            return conn
        except Exception as exc:  # the next node is tried; the last failure is raised
            last = exc
    assert last is not None
    raise last


def _bound(nodes: list[str], first: int) -> type[FailoverConnection]:
    """FailoverConnection with its nodes given (connect_robust passes only the URL)."""

    class Bound(FailoverConnection):
        def __init__(self, url: URL, **kwargs: Any) -> None:
            super().__init__(url, nodes=nodes, first=first, **kwargs)

    return Bound


__all__ = ["FailoverConnection", "amqp_urls", "connect_failover"]
