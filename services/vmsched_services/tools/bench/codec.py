"""What serialization costs: encode + decode of every message on the hot path, at a cluster size."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime

from vmsched.contracts import (
    Explanation,
    FilteredHost,
    FilterReply,
    FilterRequest,
    Message,
    PlaceItem,
    Placement,
    PlaceOutcome,
    PlaceReply,
    PlaceRequest,
    PlaceResult,
    ScheduleDecision,
    ScheduleRequest,
    ScoreTable,
    UnitScores,
    WeighReply,
    WeighRequest,
)
from vmsched.scheduling.placement import pending_entry
from vmsched.scheduling.policy import DEFAULT_POLICY
from vmsched_services.tools.bench.data import host_reports, vm_spec

_SUMMARY = "765/1000 hosts available: 221 Network (missing network 'storage'), 14 Memory (insufficient free memory)"


def _roundtrip_us(msg: Message, repeat: int) -> dict[str, float]:
    model = type(msg)
    body = msg.__pydantic_serializer__.to_json(msg)
    t0 = time.perf_counter()
    for _ in range(repeat):
        msg.__pydantic_serializer__.to_json(msg)
    enc = (time.perf_counter() - t0) / repeat
    t0 = time.perf_counter()
    for _ in range(repeat):
        model.model_validate_json(body)
    dec = (time.perf_counter() - t0) / repeat
    return {"bytes": len(body), "encode_us": round(enc * 1e6, 1), "decode_us": round(dec * 1e6, 1)}


def bench_codec(n_hosts: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    ids = [h.host_id for h in host_reports(rng, "codec", n_hosts)]
    vm = vm_spec(rng, 0)
    rid = uuid.uuid4()
    filters, weights = DEFAULT_POLICY.filter_calls(), DEFAULT_POLICY.weight_calls()
    removed = [FilteredHost(host_id=h, filter="Memory", reason="free memory 487 MB < required 1088 MB") for h in ids]
    repeat = max(5, 20_000 // n_hosts)
    decision = ScheduleDecision(
        request_id=rid,
        cluster_id="codec",
        vm_id=vm.vm_id,
        status="placed",
        host_id=ids[0],
        alternates=ids[1:4],
        explanation=Explanation(summary="x", candidates=n_hosts, filtered=removed[: n_hosts // 2]),
        decided_at=datetime.now(UTC),
    )
    group = [ScheduleRequest(request_id=uuid.uuid4(), cluster_id="codec", vm=vm_spec(rng, k)) for k in range(8)]
    pending = [
        pending_entry(vm_spec(rng, 100 + k), ids[k % n_hosts], request_id=rid, fencing_token=1, expires_at=1e12)
        for k in range(32)
    ]
    placed = [
        PlaceResult(
            request_id=r.request_id,
            outcome=PlaceOutcome.PLACED,
            placements=[Placement(vm_id=r.vm.vm_id, host_id=ids[0], alternates=ids[1:4], summary=_SUMMARY)],
            explanation=Explanation(summary=_SUMMARY, candidates=n_hosts, filters=[f.unit for f in filters]),
        )
        for r in group
    ]
    return {
        "PlaceRequest(8 requests, 32 pending)": _roundtrip_us(
            PlaceRequest(
                request_id=rid,
                cluster_id="codec",
                state_version=1,
                items=[PlaceItem(request=r) for r in group],
                filters=filters,
                weights=weights,
                pending=pending,
            ),
            repeat,
        ),
        "PlaceReply(8 placed)": _roundtrip_us(PlaceReply(request_id=rid, state_version=1, results=placed), repeat),
        "ScheduleDecision(placed)": _roundtrip_us(
            decision.model_copy(update={"explanation": placed[0].explanation}), repeat
        ),
        "FilterRequest": _roundtrip_us(
            FilterRequest(request_id=rid, cluster_id="codec", state_version=1, vm=vm, candidates=ids, filters=filters),
            repeat,
        ),
        "FilterReply(all survive)": _roundtrip_us(FilterReply(request_id=rid, survivors=ids, removed=[]), repeat),
        "FilterReply(all removed)": _roundtrip_us(FilterReply(request_id=rid, survivors=[], removed=removed), repeat),
        "WeighRequest": _roundtrip_us(
            WeighRequest(request_id=rid, cluster_id="codec", state_version=1, vm=vm, hosts=ids, weights=weights),
            repeat,
        ),
        "WeighReply(best 4)": _roundtrip_us(
            WeighReply(
                request_id=rid, scores=ScoreTable(selector="RankSelector", hosts=ids[:4], units=[], totals=[1.0] * 4)
            ),
            repeat,
        ),
        "WeighReply(with table)": _roundtrip_us(
            WeighReply(
                request_id=rid,
                scores=ScoreTable(
                    selector="RankSelector",
                    hosts=ids,
                    units=[
                        UnitScores(
                            unit=w.unit, factor=w.factor, raw=[rng.random() for _ in ids], points=[1.0] * len(ids)
                        )
                        for w in weights
                    ],
                    totals=[1.0] * len(ids),
                ),
            ),
            repeat,
        ),
        "ScheduleDecision(half filtered, explain_hosts)": _roundtrip_us(decision, repeat),
    }


__all__ = ["bench_codec"]
