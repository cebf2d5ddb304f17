"""ReportBatcher: an engine's reports handed in together go as one StateReports per cluster (hosts
first, each kind in order), a lone one as itself; a cluster's next message waits for the previous
one's confirm, so its reports reach the broker in order; a failed publish fails exactly its own
reports. The client here records what it is asked to publish (the broker's part is
tests/integration/test_state_reports.py)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import host_report, vm_report
from vmsched.client import ReportBatcher, SchedulerClient
from vmsched.contracts import HostReport, StateReports, VmReport
from vmsched.contracts.state import MAX_STATE_REPORTS

Sent = HostReport | VmReport | StateReports


class RecordingClient:
    """The three publishing calls a ReportBatcher makes; `gate` holds each publish until set."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.sent: list[Sent] = []
        self.in_flight = 0
        self.most_in_flight: dict[str, int] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_on = fail_on

    async def _publish(self, message: Sent) -> None:
        cluster = message.cluster_id
        self.in_flight += 1
        self.most_in_flight[cluster] = max(self.most_in_flight.get(cluster, 0), self.in_flight)
        try:
            await self.gate.wait()
            ids = [r.vm_id if isinstance(r, VmReport) else r.host_id for r in _reports(message)]
            if self.fail_on in ids:
                raise ConnectionError(f"broker away while sending {self.fail_on}")
            self.sent.append(message)
        finally:
            self.in_flight -= 1

    async def report_host(self, report: HostReport) -> None:
        await self._publish(report)

    async def report_vm(self, report: VmReport) -> None:
        await self._publish(report)

    async def report_states(self, reports: StateReports) -> None:
        await self._publish(reports)


def _reports(message: Sent) -> list[HostReport | VmReport]:
    return message.reports() if isinstance(message, StateReports) else [message]


def _batcher(client: RecordingClient, **kw: int) -> ReportBatcher:
    return ReportBatcher(cast(SchedulerClient, client), **kw)


def _host(cluster: str, n: int) -> HostReport:
    return host_report(cluster, f"h{n}", cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)


def _vm(cluster: str, n: int) -> VmReport:
    return vm_report(cluster, f"vm-{n}", "h0", mem_mb=512, vcpus=1)


async def test_reports_handed_in_together_go_as_one_message_hosts_first() -> None:
    client = RecordingClient()
    batcher = _batcher(client)
    hosts, vms = [_host("c", 0), _host("c", 1)], [_vm("c", 0), _vm("c", 1), _vm("c", 2)]
    reports: list[HostReport | VmReport] = [vms[0], hosts[0], vms[1], hosts[1], vms[2]]
    await asyncio.gather(*(batcher.report(r) for r in reports))
    assert client.sent == [StateReports(cluster_id="c", hosts=hosts, vms=vms)]


async def test_a_lone_report_goes_as_itself() -> None:
    client = RecordingClient()
    batcher = _batcher(client)
    await batcher.report(_vm("c", 0))
    await batcher.report(_host("c", 0))
    assert client.sent == [_vm("c", 0), _host("c", 0)]


async def test_a_clusters_reports_wait_for_its_message_in_flight_and_keep_their_order() -> None:
    client = RecordingClient()
    client.gate.clear()
    batcher = _batcher(client)
    first = asyncio.create_task(batcher.report(_vm("c", 0)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert client.in_flight == 1
    later = [asyncio.create_task(batcher.report(_vm("c", n))) for n in range(1, 4)]
    other = asyncio.create_task(batcher.report(_vm("d", 9)))  # another cluster does not wait
    await asyncio.sleep(0.01)
    assert not first.done()
    assert client.most_in_flight == {"c": 1, "d": 2}
    client.gate.set()
    await asyncio.gather(first, *later, other)
    sent_c = [m for m in client.sent if m.cluster_id == "c"]
    assert sent_c == [_vm("c", 0), StateReports(cluster_id="c", vms=[_vm("c", n) for n in range(1, 4)])]
    assert max(client.most_in_flight.values()) <= 2


async def test_a_failed_publish_fails_its_own_reports_and_the_next_message_goes() -> None:
    client = RecordingClient(fail_on="vm-1")
    client.gate.clear()
    batcher = _batcher(client)
    first = asyncio.create_task(batcher.report(_vm("c", 0)))
    await asyncio.sleep(0)
    doomed = [asyncio.create_task(batcher.report(_vm("c", n))) for n in (1, 2)]
    await asyncio.sleep(0)
    client.gate.set()
    await first
    for task in doomed:
        with pytest.raises(ConnectionError, match="vm-1"):
            await task
    await batcher.report(_vm("c", 3))
    assert client.sent == [_vm("c", 0), _vm("c", 3)]


async def test_a_long_burst_is_cut_at_the_bound() -> None:
    client = RecordingClient()
    batcher = _batcher(client, max_reports=4)
    await asyncio.gather(*(batcher.report(_vm("c", n)) for n in range(10)))
    await batcher.wait_sent()
    assert [len(_reports(m)) for m in client.sent] == [4, 4, 2]
    assert [r for m in client.sent for r in _reports(m)] == [_vm("c", n) for n in range(10)]


def test_the_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="max_reports"):
        _batcher(RecordingClient(), max_reports=MAX_STATE_REPORTS + 1)


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.booleans(), st.integers(0, 5)), min_size=1, max_size=40))
def test_each_kind_of_each_cluster_keeps_its_order(steps: list[tuple[str, bool, int]]) -> None:
    """Whatever is handed in at once, a cluster's host reports reach the broker in the order they
    were handed in, and so do its VM reports."""

    async def scenario() -> None:
        client = RecordingClient()
        batcher = _batcher(client, max_reports=3)
        reports = [_host(c, n) if is_host else _vm(c, n) for c, is_host, n in steps]
        await asyncio.gather(*(batcher.report(r) for r in reports))
        for cluster in ("a", "b"):
            for kind in (HostReport, VmReport):
                given_order = [r for r in reports if r.cluster_id == cluster and isinstance(r, kind)]
                sent = [r for m in client.sent if m.cluster_id == cluster for r in _reports(m) if isinstance(r, kind)]
                assert sent == given_order

    asyncio.run(scenario())
