"""Connecting to one of several RabbitMQ nodes: which URLs, and the next node on every attempt."""

from __future__ import annotations

from yarl import URL

from vmsched.bus.amqp.nodes import FailoverConnection, amqp_urls
from vmsched.settings import Settings

A, B, C = (f"amqp://guest:guest@127.0.0.1:{port}/" for port in (5701, 5702, 5703))


def test_the_failover_urls_follow_the_main_url_each_once() -> None:
    settings = Settings(amqp_url=A, amqp_failover_urls=f" {B}, ,{C},{A},{B}")
    assert amqp_urls(settings) == [A, B, C]
    assert amqp_urls(Settings(amqp_url=A)) == [A]


async def test_every_connection_attempt_after_the_first_goes_to_the_next_node_round_the_list() -> None:
    conn = FailoverConnection(URL(B), nodes=[A, B, C], first=1)
    tried = []
    for _ in range(5):
        conn.transport = None  # what the robust connection does at the start of each attempt
        tried.append(str(conn.url))
    assert tried == [B, C, A, B, C]


async def test_one_node_is_always_tried_again() -> None:
    conn = FailoverConnection(URL(A), nodes=[A])
    for _ in range(3):
        conn.transport = None
        assert str(conn.url) == A
