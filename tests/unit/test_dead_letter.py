"""Dead letters read back from their headers: a service's copy and the broker's own dead-lettering,
and which of them can be sent again where they were going."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from vmsched import constants as c
from vmsched.bus import DeadLetter
from vmsched.bus.dispatch import HEADER_ATTEMPTS, HEADER_DEADLINE, HEADER_TRUNCATED, Delivery, dead_letter_copy
from vmsched_services.tools.ops import _find

OURS = ("vmsched.rpc", "vmsched.events", "")


def test_a_services_copy_says_why_who_where_and_when() -> None:
    delivery = Delivery(
        queue="vmsched.filter-worker.filter",
        body=b'{"x": 1}',
        routing_key="filter",
        exchange="vmsched.rpc",
        headers={"x-app": "engine", HEADER_DEADLINE: 1, HEADER_ATTEMPTS: 2},
    )
    before = datetime.now(UTC).replace(microsecond=0)
    body, headers = dead_letter_copy(delivery, "invalid FilterRequest: hosts: too many", "filter-worker", 1024)
    dl = DeadLetter.parse(delivery.queue, body, headers, "FilterRequest")
    assert (dl.queue, dl.routing_key, dl.exchange, dl.service) == (
        "vmsched.filter-worker.filter",
        "filter",
        "vmsched.rpc",
        "filter-worker",
    )
    assert dl.reason == "invalid FilterRequest: hosts: too many"
    assert dl.type == "FilterRequest"
    assert dl.dead_lettered_at is not None
    assert before <= dl.dead_lettered_at <= datetime.now(UTC)
    assert dl.id == headers[c.HEADER_DLX_ID]
    assert dl.unrequeueable(OURS) is None
    # Sent again as the engine sent it: its own headers, none of the refusal's, attempts from zero.
    assert dl.requeue_headers() == {"x-app": "engine"}
    # Two copies of one message are two dead letters.
    _, other = dead_letter_copy(delivery, "again", "filter-worker", 1024)
    assert DeadLetter.parse(delivery.queue, body, other).id != dl.id


def test_the_brokers_own_dead_lettering_is_read_from_x_death() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5)
    headers = {
        "x-death": [
            {
                "queue": "vmsched.selector.schedule",
                "reason": "expired",
                "exchange": "vmsched.rpc",
                "routing-keys": [b"schedule"],
                "time": when,
                "count": 1,
            }
        ],
        "x-first-death-reason": "expired",
    }
    dl = DeadLetter.parse("schedule", b"{}", headers)
    assert (dl.queue, dl.routing_key, dl.exchange, dl.service) == (
        "vmsched.selector.schedule",
        "schedule",
        "vmsched.rpc",
        "broker",
    )
    assert dl.reason == "expired by the broker"
    assert dl.dead_lettered_at == when.replace(tzinfo=UTC)
    assert dl.unrequeueable(OURS) is None
    assert dl.requeue_headers() == {}
    assert DeadLetter.parse("schedule", b"{}", headers).id == dl.id  # stable across reads


def test_what_cannot_be_sent_again_says_why() -> None:
    copy = {c.HEADER_DLX_REASON: "r", c.HEADER_DLX_ROUTING_KEY: "state.host.c1", c.HEADER_DLX_EXCHANGE: "x"}
    assert DeadLetter.parse("q", b"", copy).unrequeueable(OURS) == "its original exchange 'x' is not one of vmsched's"
    older = {c.HEADER_DLX_REASON: "r", c.HEADER_DLX_ROUTING_KEY: "state.host.c1"}
    assert DeadLetter.parse("q", b"", older).unrequeueable(OURS) == "its original exchange was not recorded"
    cut = {**copy, c.HEADER_DLX_EXCHANGE: "vmsched.events", HEADER_TRUNCATED: True}
    assert DeadLetter.parse("q", b"", cut).unrequeueable(OURS) == "its body was cut when it was dead-lettered"
    nowhere = {**copy, c.HEADER_DLX_EXCHANGE: "", c.HEADER_DLX_ROUTING_KEY: ""}
    assert DeadLetter.parse("q", b"", nowhere).unrequeueable(OURS) == "its original routing key was not recorded"
    unknown = DeadLetter.parse("q", b"body", {})
    assert (unknown.reason, unknown.exchange, unknown.unrequeueable(OURS)) == (
        "",
        None,
        "its original exchange was not recorded",
    )


async def test_an_id_made_only_of_digits_is_found_as_an_id_not_taken_for_a_position() -> None:
    def letter(ident: str) -> DeadLetter:
        return DeadLetter.parse("q", b"{}", {c.HEADER_DLX_REASON: "bad", c.HEADER_DLX_ID: ident})

    class Queue:
        """The dead-letter queue's contents, oldest first (what Bus.dead_letters reads)."""

        def __init__(self) -> None:
            self.letters = [letter("0a1b2c3d4e5f"), letter("141665886796")]

        async def dead_letters(self, limit: int) -> list[DeadLetter]:
            return self.letters[:limit]

    queue: Any = Queue()
    assert (await _find(queue, "141665886796"))[0] == 2  # one id in ~400 is all digits
    assert (await _find(queue, "2"))[1].id == "141665886796"  # a short number is a position
    assert (await _find(queue, "0a1b2c3d4e5f"))[0] == 1
