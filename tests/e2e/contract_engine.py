"""A small engine written from vmsched's contracts/ alone: aio-pika, jsonschema and the JSON files.

It imports nothing of vmsched and spells none of vmsched's wire names (exchanges, queues, routing
keys, headers, the reply-to queue): every one is read from contracts/asyncapi.json, so running it
proves the contracts say everything an engine needs. tests/e2e/test_engine_from_contracts.py
copies it and contracts/ into a scratch directory and runs it against vmsched's service processes.

    python contract_engine.py CONTRACTS_DIR AMQP_URL AMQP_PREFIX CLUSTER_ID [LOSS_DIR]

It reports a cluster and its hosts, waits until vmsched has them (RPC `state`), asks where a VM
should run (RPC `schedule`), checks the reply against schemas/ScheduleDecision.json, follows the
decision event, sends one invalid request to see an error reply, and prints one JSON line.

With LOSS_DIR it also lives through Redis forgetting the cluster: it reports its VM running, writes
LOSS_DIR/placed and waits for LOSS_DIR/forgotten (the test deletes the cluster's Redis keys in
between), then does what the contract says when a request is answered `state_resyncing`: waits for
the resyncRequested event, reports the cluster in full (the running VM included), publishes
resyncComplete, and retries until the request is decided; and replays the first request.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import jsonschema
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage, AbstractQueue

HOSTS = 3
HOST_MEM_MB = 8192
CALL_TIMEOUT_S = 15.0


class Contract:
    """What contracts/ says, looked up by the names the AsyncAPI document gives its parts."""

    def __init__(self, root: Path, prefix: str) -> None:
        self.doc: dict[str, Any] = json.loads((root / "asyncapi.json").read_text())
        self.schemas = {p.stem: json.loads(p.read_text()) for p in (root / "schemas").glob("*.json")}
        names = self.doc["x-vmsched-names"]
        #: The deployment prefix goes in front of exchange and queue names, never routing keys.
        self.prefix = prefix + names["separator"] if prefix else ""
        self.content_type: str = self.doc["defaultContentType"]
        traits = self.doc["components"]["messageTraits"]
        (self.error_header,) = traits["rpcReply"]["headers"]["properties"]
        request_headers = traits["rpcRequest"]["headers"]["properties"]
        (self.deadline_header,) = (h for h, s in request_headers.items() if s["x-vmsched-set-by"] == "publisher")

    def exchange(self, channel: str) -> dict[str, Any]:
        exchange: dict[str, Any] = self.doc["channels"][channel]["bindings"]["amqp"]["exchange"]
        return exchange

    def exchange_name(self, channel: str) -> str:
        return self.prefix + str(self.exchange(channel)["name"])

    def address(self, channel: str, cluster: str | None = None) -> str:
        address: str = self.doc["channels"][channel]["address"]
        return address.replace("{clusterId}", cluster) if cluster is not None else address

    def message_name(self, channel: str) -> str:
        (name,) = self.doc["channels"][channel]["messages"]
        return str(name)

    def message_type(self, name: str) -> str:
        return str(self.doc["components"]["messages"][name]["bindings"]["amqp"]["messageType"])

    def reply_models(self, operation: str) -> list[str]:
        return [ref["$ref"].rsplit("/", 1)[-1] for ref in self.doc["operations"][operation]["reply"]["messages"]]

    def operation_binding(self, operation: str) -> dict[str, Any]:
        binding: dict[str, Any] = self.doc["operations"][operation]["bindings"]["amqp"]
        return binding

    def validate(self, name: str, body: Any) -> None:
        jsonschema.Draft202012Validator(self.schemas[name]).validate(body)


class Engine:
    def __init__(self, contract: Contract, connection: AbstractConnection) -> None:
        self.contract = contract
        self.connection = connection
        self.replies: dict[str, asyncio.Future[AbstractIncomingMessage]] = {}
        self.exchanges: dict[str, AbstractExchange] = {}

    async def setup(self) -> None:
        """Declare what the contract lets an engine declare: the exchanges, with their exact parameters."""
        self.channel = await self.connection.channel(publisher_confirms=True)
        for spec in self.contract.doc["x-vmsched-exchanges"].values():
            name = self.contract.prefix + spec["name"]
            self.exchanges[name] = await self.channel.declare_exchange(
                name, aio_pika.ExchangeType(spec["type"]), durable=spec["durable"], auto_delete=spec["autoDelete"]
            )
        # Direct reply-to: consumed (no-ack) on the channel that publishes the requests, before any request.
        reply_to = self.contract.doc["operations"]["schedule"]["x-vmsched-reply-to"]
        queue = aio_pika.Queue(
            self.channel, reply_to, durable=False, exclusive=False, auto_delete=False, arguments=None
        )
        await queue.consume(self._on_reply, no_ack=True)

    def exchange(self, channel: str) -> AbstractExchange:
        return self.exchanges[self.contract.exchange_name(channel)]

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        future = self.replies.pop(message.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(message)

    async def wait_for_queue(self, channel: str, timeout: float = 30.0) -> None:
        """Reports published before the state tracker's queue exists are lost: wait until it does."""
        queue = self.contract.prefix + self.contract.doc["channels"][channel]["x-vmsched-queue"]
        end = time.monotonic() + timeout
        while True:
            probe = await self.connection.channel()  # a failed passive declare closes its channel
            try:
                await probe.declare_queue(queue, passive=True)
                await probe.close()
                return
            except aio_pika.exceptions.ChannelClosed:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)

    def operation_of(self, channel: str) -> str:
        ops: dict[str, Any] = self.contract.doc["operations"]
        return next(name for name, op in ops.items() if op["channel"]["$ref"] == f"#/channels/{channel}")

    async def publish_event(self, channel: str, cluster: str, body: dict[str, Any]) -> None:
        name = self.contract.message_name(channel)
        self.contract.validate(name, body)
        binding = self.contract.operation_binding(self.operation_of(channel))
        message = aio_pika.Message(
            json.dumps(body).encode(),
            content_type=self.contract.content_type,
            type=self.contract.message_type(name),
            delivery_mode=aio_pika.DeliveryMode(binding["deliveryMode"]),
        )
        await self.exchange(channel).publish(message, routing_key=self.contract.address(channel, cluster))

    async def call(
        self, operation: str, body: dict[str, Any], *, check_request: bool = True
    ) -> tuple[str, dict[str, Any], bool]:
        """One RPC: (reply model name, reply body, whether it is an error reply), checked against its schema."""
        request = self.contract.message_name(operation)
        if check_request:
            self.contract.validate(request, body)
        binding = self.contract.operation_binding(operation)
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()
        self.replies[correlation_id] = future
        message = aio_pika.Message(
            json.dumps(body).encode(),
            content_type=self.contract.content_type,
            type=self.contract.message_type(request),
            correlation_id=correlation_id,
            reply_to=self.contract.doc["operations"][operation]["x-vmsched-reply-to"],
            expiration=CALL_TIMEOUT_S,
            delivery_mode=aio_pika.DeliveryMode(binding["deliveryMode"]),
            headers={self.contract.deadline_header: int((time.time() + CALL_TIMEOUT_S) * 1000)},
        )
        await self.exchange(operation).publish(
            message, routing_key=self.contract.address(operation), mandatory=binding["mandatory"]
        )
        reply = await asyncio.wait_for(future, CALL_TIMEOUT_S)
        assert reply.correlation_id == correlation_id
        assert reply.content_type == self.contract.content_type
        models = self.contract.reply_models(operation)
        failed = bool((reply.headers or {}).get(self.contract.error_header))
        name = reply.type or ""
        assert name in models, f"reply type {name!r} is none of {models}"
        assert (name == "ErrorReply") == failed, f"reply type {name!r} with error header {failed}"
        reply_body: dict[str, Any] = json.loads(reply.body)
        self.contract.validate(name, reply_body)
        return name, reply_body, failed

    async def follow(self, channel: str, cluster: str) -> AbstractQueue:
        """A server-named exclusive queue of the engine's own, bound to the channel's key for `cluster`."""
        queue = await self.channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(self.exchange(channel), routing_key=self.contract.address(channel, cluster))
        return queue


def host(cluster: str, i: int) -> dict[str, Any]:
    return {
        "cluster_id": cluster,
        "host_id": f"{cluster}-h{i}",
        "status": "up",
        "cpu_cores": 8,
        "physical_mem_mb": HOST_MEM_MB,
        "mem_free_mb": HOST_MEM_MB,
        "reserved_mem_mb": 0,
    }


async def wait_for_hosts(engine: Engine, cluster: str, want: int, timeout: float = 30.0) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        name, state, failed = await engine.call("state", {"cluster_id": cluster})
        if not failed and len(state["hosts"]) >= want:
            return state
        # Until the first report is applied the cluster is unknown: the one error worth waiting out.
        assert not failed or state["code"] == "unknown_cluster", state
        assert time.monotonic() < end, f"vmsched did not get {want} hosts of {cluster}: {name} {state}"
        await asyncio.sleep(0.1)


async def next_event(contract: Contract, queue: AbstractQueue, name: str, keep: Any) -> dict[str, Any]:
    async with queue.iterator(timeout=CALL_TIMEOUT_S) as messages:
        async for message in messages:
            await message.ack()
            assert message.type == contract.message_type(name)
            body: dict[str, Any] = json.loads(message.body)
            contract.validate(name, body)
            if keep(body):
                return body
    raise AssertionError(f"no {name} event")


async def live_through_a_loss(
    engine: Engine, cluster: str, vm: dict[str, Any], first: dict[str, Any], host_id: str, loss_dir: Path
) -> dict[str, Any]:
    contract = engine.contract
    resyncs = await engine.follow("resyncRequested", cluster)
    running = {
        "cluster_id": cluster,
        "vm_id": vm["vm_id"],
        "status": "running",
        "host_id": host_id,
        "mem_mb": 1024,
        "vcpus": 1,
    }
    await engine.publish_event("vmReport", cluster, running)
    (loss_dir / "placed").write_text(first["request_id"])
    end = time.monotonic() + 60
    while not (loss_dir / "forgotten").exists():
        assert time.monotonic() < end, "the test never made Redis forget"
        await asyncio.sleep(0.05)
    second = {"request_id": str(uuid.uuid4()), "cluster_id": cluster, "vm": {**vm, "vm_id": f"{cluster}-vm2"}}
    _, refused, _ = await engine.call("schedule", second)
    asked = await next_event(contract, resyncs, "ResyncRequested", lambda r: True)
    # The full report, as the request says: the cluster, every host, every VM holding resources.
    await engine.publish_event("clusterReport", cluster, {"cluster_id": cluster, "memory_overcommit_pct": 100})
    for i in range(HOSTS):
        await engine.publish_event("hostReport", cluster, host(cluster, i))
    await engine.publish_event("vmReport", cluster, running)
    done = {"cluster_id": cluster, "generation": asked["generation"], "hosts": HOSTS, "vms": 1}
    await engine.publish_event("resyncComplete", cluster, done)
    retryable = refused["error"]["code"]
    while True:
        _, after, _ = await engine.call("schedule", second)
        if after["status"] != "error" or after["error"]["code"] != retryable or time.monotonic() > end:
            break
        await asyncio.sleep(0.2)
    _, replay, _ = await engine.call("schedule", first)
    return {"refused": refused, "asked": asked, "after": after, "replay": replay}


async def main(contracts: Path, url: str, prefix: str, cluster: str, loss_dir: Path | None) -> dict[str, Any]:
    contract = Contract(contracts, prefix)
    connection = await aio_pika.connect(url)
    async with connection:
        engine = Engine(contract, connection)
        await engine.setup()
        await engine.wait_for_queue("hostReport")
        decisions = await engine.follow("decision", cluster)

        await engine.publish_event("clusterReport", cluster, {"cluster_id": cluster, "memory_overcommit_pct": 100})
        hosts = [host(cluster, i) for i in range(HOSTS)]
        # A field from a newer engine: reports tolerate it (their schemas allow additional properties).
        hosts[0]["x_engine_extension"] = {"rack": "r1"}
        for body in hosts:
            await engine.publish_event("hostReport", cluster, body)
        state = await wait_for_hosts(engine, cluster, HOSTS)

        request_id = str(uuid.uuid4())
        vm = {"vm_id": f"{cluster}-vm1", "mem_mb": 1024, "vcpus": 1}
        request = {"request_id": request_id, "cluster_id": cluster, "vm": vm}
        reply_type, decision, failed = await engine.call("schedule", request)
        assert not failed, decision
        jsonschema.Draft202012Validator(contract.schemas["ScheduleDecision"]).validate(decision)
        event = await next_event(contract, decisions, "ScheduleDecision", lambda d: d["request_id"] == request_id)

        # What a mistake looks like: the schema already refuses it, and so does vmsched, saying where.
        bad = {"request_id": str(uuid.uuid4()), "cluster_id": cluster, "vm": {**vm, "vm_id": "v2", "mem_mb": 0}}
        schema_refuses = not jsonschema.Draft202012Validator(contract.schemas["ScheduleRequest"]).is_valid(bad)
        _, error, error_failed = await engine.call("schedule", bad, check_request=False)
        loss = None
        if loss_dir is not None:
            loss = await live_through_a_loss(engine, cluster, vm, request, decision["host_id"], loss_dir)
        return {
            "loss": loss,
            "hosts": sorted(h["report"]["host_id"] for h in state["hosts"]),
            "reply_type": reply_type,
            "decision": decision,
            "event": event,
            "error": {"failed": error_failed, "schema_refuses": schema_refuses, **error},
            "error_codes": sorted(contract.doc["x-vmsched-error-codes"]),
        }


if __name__ == "__main__":
    root, amqp_url, amqp_prefix, cluster_id = sys.argv[1:5]
    loss = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    print(json.dumps(asyncio.run(main(Path(root), amqp_url, amqp_prefix, cluster_id, loss))))
