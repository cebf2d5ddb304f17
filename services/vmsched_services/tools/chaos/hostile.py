"""5. hostile_input: malformed, oversized, wrongly typed, deeply nested and poisonous messages,
published raw to the filter, weigh and schedule queues and to the state events, among valid
schedule requests. Every bad one must be dead-lettered or answered with an error; no service may
crash, wedge (lose a consumer, stop draining its queue) or grow by more than 20 MB; valid
requests keep being answered within 1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import VmSpec
from vmsched.settings import Settings
from vmsched_services.tools.chaos.base import (
    Outcome,
    Result,
    make_clusters,
    percentile,
    running,
    schedule_with_retries,
    scoped_settings,
)
from vmsched_services.tools.chaos.experiments import DEFAULT_TIMEOUTS, _defaults, _tag
from vmsched_services.tools.chaos.inject import queue_depths
from vmsched_services.tools.procs import READY_ROUTE, rss_mb

#: The length of the poison property value: longer than an ErrorReply's message may be.
POISON_LEN = 9_000
#: Clauses of the large JsonFilter query sent to the filter queue (about 0.5 MB of JSON).
BIG_QUERY_CLAUSES = 20_000


@dataclass(frozen=True)
class Raw:
    """One raw message: where it goes, what it is, and whether a service must refuse it."""

    kind: str
    exchange: str  # "rpc" or "events"
    routing_key: str
    body: bytes
    bad: bool
    type_name: str | None = None


def _valid_vm(vm_id: str) -> dict[str, Any]:
    return {"vm_id": vm_id, "mem_mb": 512, "vcpus": 1, "networks": ["vmnet"]}


def _filter_request(cluster: str, hosts: list[str], **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "cluster_id": cluster,
        "state_version": 0,
        "vm": _valid_vm("hostile-vm"),
        "candidates": hosts,
        "filters": [{"unit": "Memory"}],
    }
    req.update(changes)
    return req


def _weigh_request(cluster: str, hosts: list[str], **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "cluster_id": cluster,
        "state_version": 0,
        "vm": _valid_vm("hostile-vm"),
        "hosts": hosts,
        "weights": [{"unit": "OptimalForEvenGuestDistribution", "factor": 1.0}],
    }
    req.update(changes)
    return req


def _schedule_request(cluster: str, vm: dict[str, Any], **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {"request_id": str(uuid.uuid4()), "cluster_id": cluster, "vm": vm, "explain_scores": False}
    req.update(changes)
    return req


def _host_report(cluster: str, host: str, **changes: Any) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "cluster_id": cluster,
        "host_id": host,
        "status": "up",
        "cpu_cores": 8,
        "physical_mem_mb": 8192,
        "mem_free_mb": 8192,
    }
    rep.update(changes)
    return rep


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def generate(rng: random.Random, cluster: str, hosts: list[str], max_bytes: int) -> Iterator[Raw]:
    """An endless mix of hostile messages (most bad, some hostile but valid)."""
    host_key = c.host_report_key(cluster)
    poison = "x" * POISON_LEN
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    kinds: list[tuple[str, float]] = [
        ("malformed", 20),
        ("wrong_types", 20),
        ("bool_for_int", 5),
        ("deep_nesting", 5),
        ("poison_property", 10),
        ("unknown_unit", 5),
        ("bad_event", 20),
        ("oversized", 0.1),
        ("valid_big_query", 1),
        ("valid_long_extra_specs", 1),
    ]
    names = [k for k, _ in kinds]
    weights = [w for _, w in kinds]
    while True:
        kind = rng.choices(names, weights)[0]
        route = rng.choice((c.RPC_FILTER, c.RPC_WEIGH, c.RPC_SCHEDULE))
        if kind == "malformed":
            body = rng.choice([b'{"request_id": ', b"\xff\xfe\x00garbage", b"not json at all", b"[]", b"null", b"{}"])
            yield Raw(kind, "rpc", route, body, bad=True)
        elif kind == "wrong_types":
            if route == c.RPC_FILTER:
                body = _j(_filter_request(cluster, hosts, candidates="all-of-them", state_version="latest"))
            elif route == c.RPC_WEIGH:
                body = _j(_weigh_request(cluster, hosts, weights={"unit": 7}))
            else:
                body = _j(_schedule_request(cluster, {**_valid_vm("v"), "mem_mb": "lots", "vcpus": [1]}))
            yield Raw(kind, "rpc", route, body, bad=True)
        elif kind == "bool_for_int":
            vm = {**_valid_vm(f"bool-{uuid.uuid4().hex[:8]}"), "mem_mb": True, "vcpus": True}
            yield Raw(kind, "rpc", c.RPC_SCHEDULE, _j(_schedule_request(cluster, vm)), bad=True)
        elif kind == "deep_nesting":
            yield Raw(kind, "rpc", route, deep, bad=True)
        elif kind == "poison_property":
            # A policy property far longer than any valid value, and invalid: the unit's regex
            # refuses it, and the refusal quotes it.
            if rng.random() < 0.5:
                call = {"unit": "NumInstancesFilter", "properties": {"MaxInstancesPerHost": poison}}
                yield Raw(kind, "rpc", c.RPC_FILTER, _j(_filter_request(cluster, hosts, filters=[call])), bad=True)
            else:
                call = {"unit": "CPUWeigher", "properties": {"CpuAllocationRatio": poison}}
                yield Raw(kind, "rpc", c.RPC_WEIGH, _j(_weigh_request(cluster, hosts, weights=[call])), bad=True)
        elif kind == "unknown_unit":
            call = {"unit": "NoSuchUnit"}
            if route == c.RPC_WEIGH:
                yield Raw(kind, "rpc", route, _j(_weigh_request(cluster, hosts, weights=[call])), bad=True)
            else:
                yield Raw(kind, "rpc", c.RPC_FILTER, _j(_filter_request(cluster, hosts, filters=[call])), bad=True)
        elif kind == "bad_event":
            body, type_name = rng.choice(
                [
                    (b"{not json", "HostReport"),
                    (_j(_host_report(cluster, hosts[0], cpu_cores=-4)), "HostReport"),
                    (_j(_host_report(cluster, hosts[0], status="exploded")), "HostReport"),
                    (_j(_host_report(cluster, hosts[0])), "NoSuchMessage"),
                    (_j({"cluster_id": cluster, "vm_id": "v", "status": 12}), "VmReport"),
                    (deep, "HostReport"),
                ]
            )
            yield Raw(kind, "events", host_key, body, bad=True, type_name=type_name)
        elif kind == "oversized":
            body = b'{"pad": "' + b"a" * (max_bytes + 1) + b'"}'
            yield Raw(kind, "rpc", route, body, bad=True)
        elif kind == "valid_big_query":
            # Within every declared bound (depth, message size), but large: each clause is
            # evaluated for every host. To the schedule queue (the cluster's policy may not run
            # JsonFilter) and, larger, straight to the filter queue with JsonFilter asked for.
            if rng.random() < 0.5:
                clauses: list[Any] = [[">=", "$free_ram_mb", 1] for _ in range(2000)]
                vm = {**_valid_vm(f"q-{uuid.uuid4().hex[:8]}"), "query": ["and", *clauses]}
                yield Raw(kind, "rpc", c.RPC_SCHEDULE, _j(_schedule_request(cluster, vm)), bad=False)
            else:
                clauses = [[">=", "$free_ram_mb", 1] for _ in range(BIG_QUERY_CLAUSES)]
                vm = {**_valid_vm("hostile-vm"), "query": ["and", *clauses]}
                req = _filter_request(cluster, hosts, vm=vm, filters=[{"unit": "JsonFilter"}])
                yield Raw(kind, "rpc", c.RPC_FILTER, _j(req), bad=False)
        else:  # valid_long_extra_specs
            specs = {f"custom:key{i}": "v" * 1000 for i in range(256)}
            vm = {**_valid_vm(f"s-{uuid.uuid4().hex[:8]}"), "extra_specs": specs}
            yield Raw(kind, "rpc", c.RPC_SCHEDULE, _j(_schedule_request(cluster, vm)), bad=False)


async def hostile_input(
    base: Settings,
    log_dir: Path,
    *,
    messages: int = 10_000,
    rate_per_s: float = 400.0,
    probe_every_s: float = 0.25,
    seed: int = 5,
) -> Result:

    res = Result("hostile_input", {"messages": messages, "rate_per_s": rate_per_s})
    started = time.monotonic()
    settings = scoped_settings(base, "hostile", **_defaults(*DEFAULT_TIMEOUTS))
    rng = random.Random(seed)
    tag = _tag("hi")
    sent: dict[str, Raw] = {}
    replies: dict[str, str] = {}
    dead: set[str] = set()
    probes: list[Outcome] = []
    async with running(settings, log_dir) as stack:
        procs = await stack.start("state-tracker", "filter-worker", "weigher", "selector")
        async with SchedulerClient(settings) as client:
            all_hosts = await make_clusters(client, tag, 1, 8, 262_144)
            cluster, host_ids = all_hosts[0].cluster_id, [h.host_id for h in all_hosts]
            for i in range(5):  # warm caches (policy, state) before the memory baseline
                await client.schedule(cluster, {**_valid_vm(f"{tag}-warm{i}")}, timeout=10)
            consumers_before = {s: await stack.consumers(s) for s in READY_ROUTE}
            rss_before = {f"{p.name}": rss_mb(p.pid) or 0.0 for p in procs}

            conn = await aio_pika.connect(settings.amqp_url)
            try:
                ch = await conn.channel(publisher_confirms=False)
                reply_q = await ch.declare_queue(exclusive=True, auto_delete=True)

                async def on_reply(m: AbstractIncomingMessage) -> None:
                    replies[m.correlation_id or ""] = "error" if m.headers.get(c.HEADER_ERROR) else "ok"

                await reply_q.consume(on_reply, no_ack=True)
                rpc_ex = await ch.get_exchange(settings.amqp_prefix + c.RPC_EXCHANGE, ensure=False)
                ev_ex = await ch.get_exchange(settings.amqp_prefix + c.EVENTS_EXCHANGE, ensure=False)
                stop_probes = asyncio.Event()

                async def prober() -> None:
                    while not stop_probes.is_set():
                        o = Outcome(cluster, _probe_vm(f"{tag}-p{len(probes)}"), uuid.uuid4())
                        probes.append(o)
                        await schedule_with_retries(client, o, call_timeout=10.0, give_up_after=10.0)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop_probes.wait(), probe_every_s)

                probe_task = asyncio.create_task(prober())
                gen = generate(rng, cluster, host_ids, settings.max_message_bytes)
                t0 = time.monotonic()
                try:
                    for i in range(messages):
                        raw = next(gen)
                        corr = f"{'bad' if raw.bad else 'big'}-{i}"
                        sent[corr] = raw
                        msg = aio_pika.Message(
                            raw.body,
                            content_type="application/json",
                            correlation_id=corr,
                            reply_to=reply_q.name if raw.exchange == "rpc" else None,
                            type=raw.type_name,
                        )
                        ex = rpc_ex if raw.exchange == "rpc" else ev_ex
                        await ex.publish(msg, routing_key=raw.routing_key)
                        ahead = t0 + (i + 1) / rate_per_s - time.monotonic()
                        if ahead > 0:
                            await asyncio.sleep(ahead)
                    # Drained: nothing ready or unacknowledged on the services' queues (bounded).
                    drain_end = time.monotonic() + 30
                    stuck: dict[str, tuple[int, int, int]] = {}
                    while time.monotonic() < drain_end:
                        depths = await queue_depths(settings)
                        stuck = {q: d for q, d in depths.items() if q != c.DEAD_LETTER_QUEUE and (d[0] or d[1])}
                        if not stuck:
                            break
                        await asyncio.sleep(0.5)
                    res.figures["undrained_messages"] = sum(d[0] + d[1] for d in stuck.values())
                    if stuck:
                        res.notes.append(
                            "not drained after 30 s: " + ", ".join(f"{q} {d[:2]}" for q, d in stuck.items())
                        )
                    await asyncio.sleep(1.0)  # the last replies
                finally:
                    stop_probes.set()
                    await probe_task
                dead |= await _drain_dead_letters(ch, settings)
            finally:
                await conn.close()
            consumers_after = {s: await stack.consumers(s) for s in READY_ROUTE}
            rss_after = {f"{p.name}": rss_mb(p.pid) or 0.0 for p in procs}
            exited = [f"{p.name}#{p.index} ({p.popen.returncode})" for p in stack.procs if not p.alive]
    bad = {k: r for k, r in sent.items() if r.bad}
    refused = {k for k in bad if replies.get(k) == "error" or k in dead}
    accepted = {k for k in bad if replies.get(k) == "ok" and k not in dead}
    unanswered = set(bad) - refused - accepted
    by_kind = Counter(bad[k].kind for k in unanswered | accepted)
    valid = {k for k, r in sent.items() if not r.bad}
    lat = [o.latency_s for o in probes if o.answered]
    res.figures["bad_sent"] = len(bad)
    res.figures["bad_refused"] = len(refused)
    res.figures["bad_unanswered"] = len(unanswered)
    res.figures["bad_accepted"] = len(accepted)
    res.figures["hostile_valid_sent"] = len(valid)
    res.figures["hostile_valid_answered"] = sum(1 for k in valid if k in replies)
    res.figures["probes"] = len(probes)
    res.figures["probes_unanswered"] = sum(not o.answered for o in probes)
    res.figures["probe_latency_p50_s"] = round(percentile(lat, 50), 3)
    res.figures["probe_latency_max_s"] = round(max((o.latency_s for o in probes), default=0.0), 3)
    res.figures["services_exited"] = len(exited)
    res.figures["consumers_lost"] = sum(max(0, consumers_before[s] - consumers_after[s]) for s in consumers_before)
    growth = {name: rss_after[name] - rss_before[name] for name in rss_before}
    res.figures["rss_growth_max_mb"] = round(max(growth.values(), default=0.0), 1)
    res.notes.append("RSS growth MB: " + ", ".join(f"{k} {v:+.1f}" for k, v in growth.items()))
    if by_kind:
        res.notes.append(
            "bad messages not refused, by kind: " + ", ".join(f"{k} x{v}" for k, v in by_kind.most_common())
        )
    if exited:
        res.notes.append("exited: " + ", ".join(exited))
    res.check("bad_unanswered", "==", 0)
    res.check("bad_accepted", "==", 0)
    res.check("hostile_valid_answered", ">=", len(valid))
    res.check("services_exited", "==", 0)
    res.check("consumers_lost", "==", 0)
    res.check("undrained_messages", "==", 0)
    res.check("probes_unanswered", "==", 0)
    res.check("probe_latency_max_s", "<=", 1.0)
    res.check("rss_growth_max_mb", "<=", 20.0)
    res.elapsed_s = time.monotonic() - started
    return res


def _probe_vm(vm_id: str) -> Any:

    return VmSpec(vm_id=vm_id, mem_mb=64, vcpus=1, networks=["vmnet"])


async def _drain_dead_letters(ch: Any, settings: Settings) -> set[str]:
    """Consume the experiment's own dead-letter queue; the correlation ids found there."""
    q = await ch.declare_queue(settings.amqp_prefix + c.DEAD_LETTER_QUEUE, passive=True)
    found: set[str] = set()
    while True:
        msg = await q.get(no_ack=True, fail=False, timeout=5)
        if msg is None:
            return found
        if msg.correlation_id:
            found.add(msg.correlation_id)
