"""Whom a request is sent for (x-vmsched-on-behalf-of): carried by the bus from `acting_for` to the
handler, and believed by the audit only from a sender named in VMSCHED_API_USERS."""

from __future__ import annotations

from vmsched import constants as c
from vmsched.bus import MemoryBroker, MemoryBus, acting_for, on_behalf_of
from vmsched.bus.behalf import MESSAGE_ON_BEHALF_OF
from vmsched.bus.dispatch import MESSAGE_USER
from vmsched.contracts import PolicyRef
from vmsched.settings import Settings
from vmsched_services.authz import actor


async def test_the_bus_carries_the_name_to_the_handler() -> None:
    settings = Settings()
    broker = MemoryBroker()
    seen: list[str | None] = []

    async def handler(ref: PolicyRef) -> PolicyRef:
        seen.append(on_behalf_of())
        return ref

    async with MemoryBus(settings, broker, service="svc") as server, MemoryBus(settings, broker, service="cl") as cl:
        await server.serve(c.RPC_POLICY_HISTORY, PolicyRef, handler)
        with acting_for("alice"):
            await cl.call(c.RPC_POLICY_HISTORY, PolicyRef(name="p"), PolicyRef)
        await cl.call(c.RPC_POLICY_HISTORY, PolicyRef(name="p"), PolicyRef)
    assert seen == ["alice", None]


def test_only_a_trusted_sender_may_say_for_whom_it_asks() -> None:
    settings = Settings(api_users="vmsched-api")
    held, sender = MESSAGE_ON_BEHALF_OF.set("alice"), MESSAGE_USER.set("vmsched-api")
    try:
        assert actor(settings, "vmsched-api") == "vmsched-api for alice"
        assert actor(settings, "mallory") == "mallory"  # the claim is ignored (and logged)
    finally:
        MESSAGE_ON_BEHALF_OF.reset(held)
        MESSAGE_USER.reset(sender)
    assert actor(settings, "vmsched-api") == "vmsched-api"
