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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from vmsched import constants as c
from vmsched.contracts import VmSpec
from vmsched.settings import Settings
from vmsched_services.tools.chaos.base import (
    Outcome,
    Result,
    Stage,
    experiment_settings,
    run_tag,
    schedule_with_retries,
    staged,
    timed,
)
from vmsched_services.tools.chaos.inject import queue_depths
from vmsched_services.tools.procs import READY_ROUTE, rss_mb
from vmsched_services.tools.stats import percentile

#: The length of the poison property value: longer than an ErrorReply's message may be.
POISON_LEN = 9_000
#: Clauses of the large JsonFilter query sent to the filter queue (about 0.5 MB of JSON).
BIG_QUERY_CLAUSES = 20_000
#: A property value longer than any valid one.
POISON = "x" * POISON_LEN
#: JSON nested deeper than any parser's bound.
DEEP = b'{"a":' * 5000 + b"1" + b"}" * 5000


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


def _unit_request(cluster: str, fields: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A filter or weigh request for the hostile VM (the selector's request to a unit worker):
    its common fields, then the unit's `fields`, then `changes` in place of or after them."""
    common = {"request_id": str(uuid.uuid4()), "cluster_id": cluster, "state_version": 0, "vm": _valid_vm("hostile-vm")}
    return {**common, **fields, **changes}


def _filter_request(cluster: str, hosts: list[str], **changes: Any) -> dict[str, Any]:
    return _unit_request(cluster, {"candidates": hosts, "filters": [{"unit": "Memory"}]}, changes)


def _weigh_request(cluster: str, hosts: list[str], **changes: Any) -> dict[str, Any]:
    weights = [{"unit": "OptimalForEvenGuestDistribution", "factor": 1.0}]
    return _unit_request(cluster, {"hosts": hosts, "weights": weights}, changes)


def _place_request(cluster: str, hosts: list[str], **changes: Any) -> dict[str, Any]:
    """The selector's request to place a group (the hosts are the filter-worker's own business)."""
    item = {"request": _schedule_request(cluster, _valid_vm("hostile-vm")), "may_wait": False}
    req = {"request_id": str(uuid.uuid4()), "cluster_id": cluster, "state_version": 0, "items": [item]}
    return {**req, "filters": [{"unit": "Memory"}], **changes}


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


# ---------------------------------------------------------------------- one maker per kind of message
@dataclass(frozen=True)
class Target:
    """What the hostile messages are aimed at, and the random stream that picks their variants."""

    rng: random.Random
    cluster: str
    hosts: list[str]
    #: The services' bound on a message's size (an oversized message is one byte past it).
    max_bytes: int


#: Makes one message of a kind (its name given) for a target; `route` is the RPC queue drawn for it,
#: which a kind aimed at one queue only ignores.
Maker = Callable[[Target, str, str], Raw]


def _malformed(t: Target, kind: str, route: str) -> Raw:
    body = t.rng.choice([b'{"request_id": ', b"\xff\xfe\x00garbage", b"not json at all", b"[]", b"null", b"{}"])
    return Raw(kind, "rpc", route, body, bad=True)


def _wrong_types(t: Target, kind: str, route: str) -> Raw:
    if route == c.RPC_FILTER:
        body = _j(_filter_request(t.cluster, t.hosts, candidates="all-of-them", state_version="latest"))
    elif route == c.RPC_PLACE:
        body = _j(_place_request(t.cluster, t.hosts, items={"request": "every one"}, state_version="latest"))
    elif route == c.RPC_WEIGH:
        body = _j(_weigh_request(t.cluster, t.hosts, weights={"unit": 7}))
    else:
        body = _j(_schedule_request(t.cluster, {**_valid_vm("v"), "mem_mb": "lots", "vcpus": [1]}))
    return Raw(kind, "rpc", route, body, bad=True)


def _bool_for_int(t: Target, kind: str, route: str) -> Raw:
    vm = {**_valid_vm(f"bool-{uuid.uuid4().hex[:8]}"), "mem_mb": True, "vcpus": True}
    return Raw(kind, "rpc", c.RPC_SCHEDULE, _j(_schedule_request(t.cluster, vm)), bad=True)


def _deep_nesting(t: Target, kind: str, route: str) -> Raw:
    return Raw(kind, "rpc", route, DEEP, bad=True)


def _poison_property(t: Target, kind: str, route: str) -> Raw:
    # A policy property far longer than any valid value, and invalid: the unit's regex
    # refuses it, and the refusal quotes it.
    if t.rng.random() < 0.5:
        call = {"unit": "NumInstancesFilter", "properties": {"MaxInstancesPerHost": POISON}}
        return Raw(kind, "rpc", c.RPC_FILTER, _j(_filter_request(t.cluster, t.hosts, filters=[call])), bad=True)
    call = {"unit": "CPUWeigher", "properties": {"CpuAllocationRatio": POISON}}
    return Raw(kind, "rpc", c.RPC_WEIGH, _j(_weigh_request(t.cluster, t.hosts, weights=[call])), bad=True)


def _unknown_unit(t: Target, kind: str, route: str) -> Raw:
    call = {"unit": "NoSuchUnit"}
    if route == c.RPC_WEIGH:
        return Raw(kind, "rpc", route, _j(_weigh_request(t.cluster, t.hosts, weights=[call])), bad=True)
    return Raw(kind, "rpc", c.RPC_FILTER, _j(_filter_request(t.cluster, t.hosts, filters=[call])), bad=True)


def _bad_event(t: Target, kind: str, route: str) -> Raw:
    host = t.hosts[0]
    body, type_name = t.rng.choice(
        [
            (b"{not json", "HostReport"),
            (_j(_host_report(t.cluster, host, cpu_cores=-4)), "HostReport"),
            (_j(_host_report(t.cluster, host, status="exploded")), "HostReport"),
            (_j(_host_report(t.cluster, host)), "NoSuchMessage"),
            (_j({"cluster_id": t.cluster, "vm_id": "v", "status": 12}), "VmReport"),
            (DEEP, "HostReport"),
        ]
    )
    return Raw(kind, "events", c.host_report_key(t.cluster), body, bad=True, type_name=type_name)


def _oversized(t: Target, kind: str, route: str) -> Raw:
    body = b'{"pad": "' + b"a" * (t.max_bytes + 1) + b'"}'
    return Raw(kind, "rpc", route, body, bad=True)


def _valid_big_query(t: Target, kind: str, route: str) -> Raw:
    # Within every declared bound (depth, message size), but large: each clause is
    # evaluated for every host. To the schedule queue (the cluster's policy may not run
    # JsonFilter) and, larger, straight to the filter queue with JsonFilter asked for.
    if t.rng.random() < 0.5:
        clauses: list[Any] = [[">=", "$free_ram_mb", 1] for _ in range(2000)]
        vm = {**_valid_vm(f"q-{uuid.uuid4().hex[:8]}"), "query": ["and", *clauses]}
        return Raw(kind, "rpc", c.RPC_SCHEDULE, _j(_schedule_request(t.cluster, vm)), bad=False)
    clauses = [[">=", "$free_ram_mb", 1] for _ in range(BIG_QUERY_CLAUSES)]
    vm = {**_valid_vm("hostile-vm"), "query": ["and", *clauses]}
    req = _filter_request(t.cluster, t.hosts, vm=vm, filters=[{"unit": "JsonFilter"}])
    return Raw(kind, "rpc", c.RPC_FILTER, _j(req), bad=False)


def _valid_long_extra_specs(t: Target, kind: str, route: str) -> Raw:
    specs = {f"custom:key{i}": "v" * 1000 for i in range(256)}
    vm = {**_valid_vm(f"s-{uuid.uuid4().hex[:8]}"), "extra_specs": specs}
    return Raw(kind, "rpc", c.RPC_SCHEDULE, _j(_schedule_request(t.cluster, vm)), bad=False)


#: Every kind of message, its weight in the mix and its maker: most bad, some hostile but valid.
KINDS: Mapping[str, tuple[float, Maker]] = {
    "malformed": (20, _malformed),
    "wrong_types": (20, _wrong_types),
    "bool_for_int": (5, _bool_for_int),
    "deep_nesting": (5, _deep_nesting),
    "poison_property": (10, _poison_property),
    "unknown_unit": (5, _unknown_unit),
    "bad_event": (20, _bad_event),
    "oversized": (0.1, _oversized),
    "valid_big_query": (1, _valid_big_query),
    "valid_long_extra_specs": (1, _valid_long_extra_specs),
}


def generate(rng: random.Random, cluster: str, hosts: list[str], max_bytes: int) -> Iterator[Raw]:
    """An endless mix of hostile messages, drawn by KINDS' weights."""
    target = Target(rng, cluster, hosts, max_bytes)
    names = list(KINDS)
    weights = [w for w, _ in KINDS.values()]
    while True:
        kind = rng.choices(names, weights)[0]
        route = rng.choice((c.RPC_PLACE, c.RPC_FILTER, c.RPC_WEIGH, c.RPC_SCHEDULE))
        yield KINDS[kind][1](target, kind, route)


# ---------------------------------------------------------------------- the experiment
async def hostile_input(
    base: Settings,
    log_dir: Path,
    *,
    messages: int = 10_000,
    rate_per_s: float = 400.0,
    probe_every_s: float = 0.25,
    seed: int = 5,
) -> Result:
    """`messages` hostile messages (generate) at `rate_per_s`, with a valid request probing the
    services every `probe_every_s`; what must hold is in the module docstring."""
    res = Result("hostile_input", {"messages": messages, "rate_per_s": rate_per_s})
    with timed(res):
        settings = experiment_settings(base, "hostile")
        rng = random.Random(seed)
        services = ("state-tracker", "filter-worker", "weigher", "selector")
        async with staged(settings, log_dir, services, tag=run_tag("hi"), clusters=1, hosts=8, mem_mb=262_144) as stage:
            cluster, host_ids = stage.hosts[0].cluster_id, [h.host_id for h in stage.hosts]
            for i in range(5):  # warm caches (policy, state) before the memory baseline
                await stage.client.schedule(cluster, {**_valid_vm(f"{stage.tag}-warm{i}")}, timeout=10)
            before = await _footprint(stage)
            traffic = _Traffic(settings, stage, cluster)
            gen = generate(rng, cluster, host_ids, settings.max_message_bytes)
            await traffic.run(res, gen, messages=messages, rate_per_s=rate_per_s, probe_every_s=probe_every_s)
            after = await _footprint(stage)
            exited = [f"{p.name}#{p.index} ({p.popen.returncode})" for p in stage.stack.procs if not p.alive]
        _hostile_figures(res, traffic, before, after, exited)
        res.check("bad_unanswered", "==", 0)
        res.check("bad_accepted", "==", 0)
        res.check("hostile_valid_answered", ">=", len(traffic.valid()))
        res.check("services_exited", "==", 0)
        res.check("consumers_lost", "==", 0)
        res.check("undrained_messages", "==", 0)
        res.check("probes_unanswered", "==", 0)
        res.check_timing("probe_latency_max_s", "<=", 1.0, short_bound=10.0)
        res.check("rss_growth_max_mb", "<=", 20.0)
    return res


@dataclass(frozen=True)
class _Footprint:
    """What the services hold at one moment: consumers per RPC queue, RSS (MB) per first process."""

    consumers: dict[str, int]
    rss_mb: dict[str, float]


async def _footprint(stage: Stage) -> _Footprint:
    consumers = {s: await stage.stack.consumers(s) for s in READY_ROUTE}
    return _Footprint(consumers, {f"{p.name}": rss_mb(p.pid) or 0.0 for p in stage.started})


@dataclass
class _Traffic:
    """hostile_input's stream: the raw messages sent (by correlation id), the replies to them
    ("ok" or "error"), those dead-lettered, and the valid requests probing the services meanwhile."""

    settings: Settings
    stage: Stage
    cluster: str
    sent: dict[str, Raw] = field(default_factory=dict)
    replies: dict[str, str] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    probes: list[Outcome] = field(default_factory=list)

    def valid(self) -> set[str]:
        """The correlation ids of the hostile but valid messages sent."""
        return {k for k, r in self.sent.items() if not r.bad}

    async def run(
        self, res: Result, gen: Iterator[Raw], *, messages: int, rate_per_s: float, probe_every_s: float
    ) -> None:
        """Publish `messages` from `gen` at `rate_per_s`, probing all along; wait for the services
        to drain them (figure undrained_messages); collect the dead-lettered ones."""
        conn = await aio_pika.connect(self.settings.amqp_url)
        try:
            ch = await conn.channel(publisher_confirms=False)
            reply_q = await ch.declare_queue(exclusive=True, auto_delete=True)
            await reply_q.consume(self._on_reply, no_ack=True)
            calls = {
                name: await ch.get_exchange(self.settings.amqp_prefix + name, ensure=False) for name in c.RPC_EXCHANGES
            }
            ev_ex = await ch.get_exchange(self.settings.amqp_prefix + c.EVENTS_EXCHANGE, ensure=False)
            stop_probes = asyncio.Event()
            probe_task = asyncio.create_task(self._probe(stop_probes, probe_every_s))
            try:
                t0 = time.monotonic()
                for i in range(messages):
                    raw = next(gen)
                    ex = calls[c.rpc_exchange(raw.routing_key)] if raw.exchange == "rpc" else ev_ex
                    await ex.publish(self._message(i, raw, reply_q.name), routing_key=raw.routing_key)
                    ahead = t0 + (i + 1) / rate_per_s - time.monotonic()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                await _wait_drained(res, self.settings)
                await asyncio.sleep(1.0)  # the last replies
            finally:
                stop_probes.set()
                await probe_task
            self.dead |= await _drain_dead_letters(ch, self.settings)
        finally:
            await conn.close()

    def _message(self, i: int, raw: Raw, reply_to: str) -> aio_pika.Message:
        corr = f"{'bad' if raw.bad else 'big'}-{i}"
        self.sent[corr] = raw
        return aio_pika.Message(
            raw.body,
            content_type="application/json",
            correlation_id=corr,
            reply_to=reply_to if raw.exchange == "rpc" else None,
            type=raw.type_name,
        )

    async def _on_reply(self, m: AbstractIncomingMessage) -> None:
        self.replies[m.correlation_id or ""] = "error" if m.headers.get(c.HEADER_ERROR) else "ok"

    async def _probe(self, stop: asyncio.Event, every_s: float) -> None:
        while not stop.is_set():
            o = Outcome(self.cluster, _probe_vm(f"{self.stage.tag}-p{len(self.probes)}"), uuid.uuid4())
            self.probes.append(o)
            await schedule_with_retries(self.stage.client, o, call_timeout=10.0, give_up_after=10.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)


async def _wait_drained(res: Result, settings: Settings) -> None:
    """Drained: nothing ready or unacknowledged on the services' queues (bounded)."""
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
        res.notes.append("not drained after 30 s: " + ", ".join(f"{q} {d[:2]}" for q, d in stuck.items()))


def _hostile_figures(res: Result, traffic: _Traffic, before: _Footprint, after: _Footprint, exited: list[str]) -> None:
    sent, replies, dead, probes = traffic.sent, traffic.replies, traffic.dead, traffic.probes
    bad = {k: r for k, r in sent.items() if r.bad}
    refused = {k for k in bad if replies.get(k) == "error" or k in dead}
    accepted = {k for k in bad if replies.get(k) == "ok" and k not in dead}
    unanswered = set(bad) - refused - accepted
    by_kind = Counter(bad[k].kind for k in unanswered | accepted)
    valid = traffic.valid()
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
    lost = sum(max(0, before.consumers[s] - after.consumers[s]) for s in before.consumers)
    res.figures["consumers_lost"] = lost
    growth = {name: after.rss_mb[name] - before.rss_mb[name] for name in before.rss_mb}
    res.figures["rss_growth_max_mb"] = round(max(growth.values(), default=0.0), 1)
    res.notes.append("RSS growth MB: " + ", ".join(f"{k} {v:+.1f}" for k, v in growth.items()))
    if by_kind:
        res.notes.append(
            "bad messages not refused, by kind: " + ", ".join(f"{k} x{v}" for k, v in by_kind.most_common())
        )
    if exited:
        res.notes.append("exited: " + ", ".join(exited))


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
