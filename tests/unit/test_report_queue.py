"""The state tracker's intake queue (vmsched_services.state_tracker.batches.ReportQueue): reports
that wait are applied together by cluster, in their order, barriers alone; each handler gets its own
report's outcome. The apply functions here record what they are given (the store side is tested on
a real Redis in tests/integration/test_state_batches.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.contracts import ClusterReport, HostReport, Message
from vmsched_services.state_tracker.batches import ReportQueue


def _host(cluster: str, n: int) -> HostReport:
    return HostReport.model_validate(
        {
            "cluster_id": cluster,
            "host_id": f"h{n}",
            "status": "up",
            "cpu_cores": 8,
            "physical_mem_mb": 8192,
            "mem_free_mb": 8192,
        }
    )


def _run_of(report: Message) -> str | None:
    return report.cluster_id if isinstance(report, HostReport) else None


class Recorder:
    """Apply functions that log what they apply: ("one", report) or ("run", cluster, reports)."""

    def __init__(self, bad: frozenset[str] = frozenset(), pause: float = 0.0) -> None:
        self.bad = bad  # host ids whose reports fail
        self.pause = pause
        self.calls: list[tuple[str, str | None, list[Message]]] = []

    def _failure(self, report: Message) -> ValueError | None:
        name = report.host_id if isinstance(report, HostReport) else getattr(report, "cluster_id", "")
        return ValueError(f"bad report {name}") if name in self.bad else None

    async def one(self, report: Message) -> None:
        self.calls.append(("one", None, [report]))
        await asyncio.sleep(self.pause)
        failure = self._failure(report)
        if failure is not None:
            raise failure

    async def run(self, cluster: str, reports: Sequence[Message]) -> list[BaseException | None]:
        self.calls.append(("run", cluster, list(reports)))
        await asyncio.sleep(self.pause)
        return [self._failure(r) for r in reports]

    def applied(self) -> list[Message]:
        return [r for _, _, reports in self.calls for r in reports]


def _queue(rec: Recorder, max_batch: int = 256) -> ReportQueue:
    return ReportQueue(rec.one, rec.run, _run_of, max_batch=max_batch)


async def test_a_lone_report_is_applied_at_once_alone() -> None:
    rec = Recorder()
    q = _queue(rec)
    await q.submit(_host("a", 1))
    assert rec.calls == [("run", "a", [_host("a", 1)])]
    assert len(q) == 0


async def test_waiting_reports_go_by_cluster_in_order_and_barriers_alone() -> None:
    rec = Recorder()
    q = _queue(rec)
    settings_a = ClusterReport(cluster_id="a")
    reports: list[Message] = [_host("a", 1), _host("b", 1), _host("a", 2), settings_a, _host("b", 2), _host("a", 3)]
    await asyncio.gather(*(q.submit(r) for r in reports))
    assert rec.calls == [
        ("run", "a", [_host("a", 1), _host("a", 2)]),
        ("run", "b", [_host("b", 1)]),
        ("one", None, [settings_a]),
        ("run", "b", [_host("b", 2)]),
        ("run", "a", [_host("a", 3)]),
    ]


async def test_a_drain_takes_at_most_max_batch() -> None:
    rec = Recorder()
    q = _queue(rec, max_batch=3)
    await asyncio.gather(*(q.submit(_host("a", n)) for n in range(8)))
    assert [len(reports) for _, _, reports in rec.calls] == [3, 3, 2]
    assert rec.applied() == [_host("a", n) for n in range(8)]


async def test_reports_arriving_while_a_batch_is_applied_make_the_next_batch() -> None:
    rec = Recorder(pause=0.01)
    q = _queue(rec)
    first = asyncio.ensure_future(q.submit(_host("a", 0)))
    await asyncio.sleep(0)  # the drain has taken report 0 and is applying it
    await asyncio.gather(first, *(q.submit(_host("a", n)) for n in range(1, 5)))
    ids = [[r.host_id for r in reports if isinstance(r, HostReport)] for _, _, reports in rec.calls]
    assert ids == [["h0"], ["h1", "h2", "h3", "h4"]]


async def test_each_handler_gets_its_own_reports_outcome() -> None:
    rec = Recorder(bad=frozenset({"h2", "broken"}))
    q = _queue(rec)
    reports = [_host("a", 1), _host("a", 2), ClusterReport(cluster_id="broken"), _host("a", 3)]
    outcomes = await asyncio.gather(*(q.submit(r) for r in reports), return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == ["NoneType", "ValueError", "ValueError", "NoneType"]
    assert "h2" in str(outcomes[1])
    assert "broken" in str(outcomes[2])


async def test_a_run_that_raises_fails_its_reports_only() -> None:
    async def run(cluster: str, reports: Sequence[Message]) -> list[BaseException | None]:
        if cluster == "a":
            raise ConnectionError("Redis away")
        return [None] * len(reports)

    rec = Recorder()
    q = ReportQueue(rec.one, run, _run_of)
    outcomes = await asyncio.gather(*(q.submit(_host(c, 1)) for c in "aba"), return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == ["ConnectionError", "NoneType", "ConnectionError"]


async def test_a_handler_cancelled_before_its_report_is_taken_applies_nothing() -> None:
    rec = Recorder(pause=0.01)
    q = _queue(rec)
    first = asyncio.ensure_future(q.submit(_host("a", 0)))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(q.submit(_host("a", 1)))
    kept = asyncio.ensure_future(q.submit(_host("a", 2)))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(first, kept)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert [r.host_id for r in rec.applied() if isinstance(r, HostReport)] == ["h0", "h2"]


async def test_the_drain_cancelled_leaves_no_handler_waiting() -> None:
    blocked = asyncio.Event()

    async def run(cluster: str, reports: Sequence[Message]) -> list[BaseException | None]:
        await blocked.wait()
        return [None] * len(reports)

    q = ReportQueue(Recorder().one, run, _run_of)
    handlers = [asyncio.ensure_future(q.submit(_host("a", n))) for n in range(3)]
    await asyncio.sleep(0.01)
    drain = q._drain
    assert drain is not None
    drain.cancel()
    results = await asyncio.gather(*handlers, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results


# (cluster or None for a barrier) per report, and the sizes of the bursts they come in.
_plans = st.tuples(
    st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=40),
    st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=6),
)


@settings(max_examples=200, deadline=None)
@given(plan=_plans)
def test_every_cluster_sees_its_reports_and_the_barriers_in_submission_order(
    plan: tuple[list[str | None], list[int], int],
) -> None:
    """However reports are bursted and bounded, the applied order restricted to one cluster and
    the barriers is the submitted order restricted the same way (so a barrier comes after every
    report submitted before it and before every one after), and everything is applied once."""
    clusters, bursts, max_batch = plan

    async def scenario() -> None:
        rec = Recorder()
        q = _queue(rec, max_batch=max_batch)
        submitted: list[Message] = [
            _host(cl, n) if cl is not None else ClusterReport(cluster_id=f"barrier{n}") for n, cl in enumerate(clusters)
        ]
        i = 0
        for size in bursts:
            await asyncio.gather(*(q.submit(r) for r in submitted[i : i + size]))
            i += size
        await asyncio.gather(*(q.submit(r) for r in submitted[i:]))
        applied = rec.applied()
        assert sorted(map(id, applied)) == sorted(map(id, submitted))
        for cl in ("a", "b", "c"):

            def seen(reports: list[Message], cl: str = cl) -> list[int]:
                return [id(r) for r in reports if _run_of(r) in (cl, None)]

            assert seen(applied) == seen(submitted)
        for _, cluster, reports in rec.calls:
            assert len(reports) <= max_batch
            assert all(_run_of(r) == cluster for r in reports)

    asyncio.run(scenario())


async def test_closing_cancels_the_batch_and_the_waiting_and_refuses_more() -> None:
    blocked = asyncio.Event()
    applied: list[str] = []

    async def run(cluster: str, reports: Sequence[Message]) -> list[BaseException | None]:
        await blocked.wait()
        applied.append(cluster)
        return [None] * len(reports)

    q = ReportQueue(Recorder().one, run, _run_of)
    taken = asyncio.ensure_future(q.submit(_host("a", 0)))
    await asyncio.sleep(0.01)  # report 0 is being applied
    waiting = asyncio.ensure_future(q.submit(_host("b", 1)))
    await asyncio.sleep(0)
    q.close()
    blocked.set()
    results = await asyncio.gather(taken, waiting, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert applied == []
    with pytest.raises(asyncio.CancelledError):
        await q.submit(_host("a", 2))
    assert applied == []
