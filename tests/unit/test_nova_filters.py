"""Nova filter units: hand-computed cases per unit, edge cases (zero, one, equal hosts, missing data)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from tests.factories import CLUSTER, host, hosts_n, kept, pend, reasons, table, vm
from vmsched.contracts import ClusterReport, HostState, PendingEntry
from vmsched.errors import InvalidProperty
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, validate_properties
from vmsched.scheduling.units.nova_attributes import host_attribute
from vmsched.scheduling.units.nova_filters import NOVA_FILTER_UNITS, metric_names
from vmsched.scheduling.units.nova_versions import canonical_arch, version_satisfies, version_tuple
from vmsched.scheduling.units.registry import REGISTRY

NOW = 1_700_000_000.0


def grouped(
    *hosts: HostState, groups: dict[str, dict[str, str]], pending: list[PendingEntry] | None = None
) -> HostTable:
    settings = ClusterReport(cluster_id=CLUSTER, host_groups=groups)
    return HostTable.from_states(list(hosts), settings).with_pending(pending or [])


def run(name: str, hosts: HostTable, spec: Any = None, **props: str) -> FilterVerdict:
    unit = REGISTRY[name]
    assert unit.filter is not None
    return unit.filter(hosts, spec if spec is not None else vm(), validate_properties(unit, props))


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# ------------------------------------------------------------------------------------- catalogue
NAMES = {
    "AllHostsFilter",
    "ComputeFilter",
    "ComputeCapabilitiesFilter",
    "AggregateInstanceExtraSpecsFilter",
    "RamFilter",
    "AggregateRamFilter",
    "CoreFilter",
    "AggregateCoreFilter",
    "DiskFilter",
    "AggregateDiskFilter",
    "NumInstancesFilter",
    "AggregateNumInstancesFilter",
    "IoOpsFilter",
    "AggregateIoOpsFilter",
    "AggregateMultiTenancyIsolation",
    "MetricsFilter",
    "AvailabilityZoneFilter",
    "RetryFilter",
    "JsonFilter",
    "ImagePropertiesFilter",
}


def test_units_are_declared() -> None:
    assert {u.name for u in NOVA_FILTER_UNITS} == NAMES
    for unit in NOVA_FILTER_UNITS:
        assert REGISTRY[unit.name] is unit
        assert unit.kinds == ("filter",)
        assert unit.description
        for name, spec in unit.properties.items():
            assert spec.default is not None, name
            assert spec.matches(spec.default), name
            assert spec.description


@pytest.mark.parametrize(
    ("unit", "prop", "good", "bad"),
    [
        ("RamFilter", "RamAllocationRatio", ["1", "1.5", "0.5", "16.0"], ["0", "0.0", "-1", "x", "1."]),
        ("CoreFilter", "CpuAllocationRatio", ["16", "2.25"], ["", "abc"]),
        ("DiskFilter", "DiskAllocationRatio", ["1.0"], ["0"]),
        ("NumInstancesFilter", "MaxInstancesPerHost", ["1", "50"], ["0", "-3", "5.5"]),
        ("IoOpsFilter", "MaxIoOpsPerHost", ["0", "8", "12"], ["08", "-1"]),
        ("ComputeFilter", "ServiceDownTime", ["60", "1"], ["0", "1.5"]),
        ("MetricsFilter", "WeightSetting", ["", "cpu.percent=1.0,mem.free=-1", "a=1, b = 2"], ["a", "a=x", "=1"]),
        ("AvailabilityZoneFilter", "DefaultAvailabilityZone", ["nova", "az-1"], ["", "a b"]),
    ],
)
def test_property_regexes(unit: str, prop: str, good: list[str], bad: list[str]) -> None:
    u = REGISTRY[unit]
    for value in good:
        assert validate_properties(u, {prop: value})[prop] == value
    for value in bad:
        with pytest.raises(InvalidProperty):
            validate_properties(u, {prop: value})


EVERYTHING = vm(
    extra_specs={"free_ram_mb": ">= 1", "ssd": "true"},
    image_properties={"hw_architecture": "x86_64"},
    availability_zone="az1",
    tried_hosts=["x"],
    query=[">=", "$free_ram_mb", 0],
    tenant_id="t1",
    disk_mb=10,
)


@pytest.mark.parametrize("unit", NOVA_FILTER_UNITS, ids=lambda u: u.name)
def test_zero_hosts(unit: PolicyUnit) -> None:
    assert unit.filter is not None
    verdict = unit.filter(table(), EVERYTHING, validate_properties(unit, {"WeightSetting": "m=1"}))
    assert len(verdict.keep) == 0
    assert list(verdict.reasons) == []


@pytest.mark.parametrize("unit", NOVA_FILTER_UNITS, ids=lambda u: u.name)
def test_equal_hosts_share_a_verdict(unit: PolicyUnit) -> None:
    assert unit.filter is not None
    hosts = hosts_n(4, disk_total_mb=100, disk_free_mb=100, reported_at=at(NOW)).with_pending([], now=NOW)
    verdict = unit.filter(hosts, EVERYTHING, validate_properties(unit, {"WeightSetting": "m=1"}))
    assert len(set(verdict.keep.tolist())) == 1
    assert len(set(verdict.reasons)) <= 1


@pytest.mark.parametrize("unit", NOVA_FILTER_UNITS, ids=lambda u: u.name)
def test_plain_vm_on_default_hosts_keeps_all(unit: PolicyUnit) -> None:
    """A VM asking for nothing special fits an idle host: no unit removes it (one host, no data)."""
    assert unit.filter is not None
    hosts = table(host("h1", reported_at=at(NOW))).with_pending([], now=NOW)
    verdict = unit.filter(hosts, vm(), validate_properties(unit, {}))
    assert verdict.keep.tolist() == [True]


# ---------------------------------------------------------------------------------------- Compute
def test_compute_filter() -> None:
    hosts = table(
        host("fresh", reported_at=at(NOW - 60)),
        host("stale", reported_at=at(NOW - 61)),
        host("never"),
        host("off", reported_at=at(NOW), enabled=False),
        host("future", reported_at=at(NOW + 90)),
    ).with_pending([], now=NOW)
    verdict = run("ComputeFilter", hosts)
    assert kept(hosts, verdict) == ["fresh"]
    assert reasons(hosts, verdict) == {
        "stale": "last heartbeat 61 s ago > service down time 60 s",
        "never": "no heartbeat ever reported",
        "off": "compute service disabled",
        "future": "heartbeat 90 s in the future > service down time 60 s",
    }
    assert kept(hosts, run("ComputeFilter", hosts, ServiceDownTime="120")) == ["fresh", "stale", "future"]


def test_compute_filter_without_decision_time() -> None:
    hosts = table(host("old", reported_at=at(1)), host("never"), host("off", reported_at=at(1), enabled=False))
    assert np.isnan(hosts.as_of)
    assert kept(hosts, run("ComputeFilter", hosts)) == ["old"]


# ---------------------------------------------------------------------------- ComputeCapabilities
CAPS = {"cpu_info": {"features": ["aes", "mmx", "sse"], "vendor": "Intel"}, "gpus": 2}


def test_compute_capabilities_scoped_and_unscoped() -> None:
    hosts = table(
        host("big", capabilities=CAPS, mem_free_mb=8192, physical_mem_mb=8192, hypervisor_version=2_000_000),
        host("old", capabilities={"cpu_info": {"features": ["aes"]}}, hypervisor_version=1_005_003),
        host("bare"),
    )
    spec = vm(
        extra_specs={
            "capabilities:cpu_info:features": "<all-in> aes mmx",
            "hypervisor_version": ">= 1005003",
            "hw:cpu_policy": "dedicated",  # another namespace: ignored
            "ssd": "true",  # not a host attribute: ignored
        }
    )
    verdict = run("ComputeCapabilitiesFilter", hosts, spec)
    assert kept(hosts, verdict) == ["big"]
    assert reasons(hosts, verdict) == {
        "old": "extra spec 'capabilities:cpu_info:features' = '<all-in> aes mmx' not met by host value \"['aes']\"",
        "bare": "extra spec 'capabilities:cpu_info:features' = '<all-in> aes mmx': the host does not report it",
    }


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        ({"free_ram_mb": ">= 4096"}, ["a"]),  # 8192 - 0 reserved - 1024 committed = 7168; b: 4096 - 1024 = 3072
        ({"num_instances": "<= 2"}, ["b"]),
        ({"vcpus_total": "= 8"}, ["a"]),
        ({"hypervisor_type": "s== QEMU"}, ["a", "b"]),
        ({"host": "<in> a"}, ["a"]),
        ({"capabilities:hypervisor_type": "<or> KVM <or> QEMU"}, ["a", "b"]),  # falls back to attributes
        ({"capabilities:gpus": "= 1"}, ["a"]),
        ({"arch": "s== x86_64"}, ["a", "b"]),
        ({"free_ram_mb": "> 2"}, []),  # a literal "> 2": no host value equals it
        ({}, ["a", "b"]),
    ],
)
def test_compute_capabilities_attributes(specs: dict[str, str], expected: list[str]) -> None:
    hosts = table(
        host("a", physical_mem_mb=8192, cpu_cores=8, vm_count=3, mem_committed_mb=1024, capabilities={"gpus": 2}),
        host("b", physical_mem_mb=4096, cpu_cores=4, vm_count=1, mem_committed_mb=1024),
    )
    assert kept(hosts, run("ComputeCapabilitiesFilter", hosts, vm(extra_specs=specs))) == expected


def test_host_attributes_count_pending() -> None:
    hosts = table(
        host("a", physical_mem_mb=4096, reserved_mem_mb=100, mem_committed_mb=1000, vm_count=2, vcpus_committed=3),
        pending=[pend("a", mem_mb=500, vcpus=2)],
    )
    assert host_attribute(hosts, 0, "free_ram_mb") == 4096 - 100 - 1000 - 500
    assert host_attribute(hosts, 0, "num_instances") == 3
    assert host_attribute(hosts, 0, "vcpus_used") == 5
    assert host_attribute(hosts, 0, "num_io_ops") == 1
    assert host_attribute(hosts, 0, "reported_at") is None  # NaN reads as missing
    assert host_attribute(hosts, 0, "no_such_thing") is None
    assert host_attribute(hosts, 0, "enabled") is True


# ------------------------------------------------------------------------ AggregateInstanceExtraSpecs
def test_aggregate_instance_extra_specs() -> None:
    groups = {"fast": {"ssd": "true", "gpu": "a100,h100"}, "slow": {"ssd": "false"}, "mixed": {"ssd": "false"}}
    hosts = grouped(
        host("f", host_groups=["fast"]),
        host("s", host_groups=["slow"]),
        host("both", host_groups=["slow", "fast"]),
        host("none"),
        groups=groups,
    )
    spec = vm(extra_specs={"aggregate_instance_extra_specs:ssd": "true", "hw:mem_page_size": "large"})
    verdict = run("AggregateInstanceExtraSpecsFilter", hosts, spec)
    assert kept(hosts, verdict) == ["f", "both"]  # any group value matching is enough
    assert reasons(hosts, verdict) == {
        "s": "extra spec 'aggregate_instance_extra_specs:ssd' = 'true' not met by group metadata 'false'",
        "none": "extra spec 'aggregate_instance_extra_specs:ssd': no host group of the host has metadata 'ssd'",
    }
    # unscoped keys count too; comma-separated metadata values are alternatives
    assert kept(hosts, run("AggregateInstanceExtraSpecsFilter", hosts, vm(extra_specs={"gpu": "h100"}))) == [
        "f",
        "both",
    ]
    assert kept(hosts, run("AggregateInstanceExtraSpecsFilter", hosts, vm(extra_specs={"gpu": "<in> 100"}))) == [
        "f",
        "both",
    ]
    assert kept(hosts, run("AggregateInstanceExtraSpecsFilter", hosts, vm(extra_specs={}))) == list(hosts.ids)


# ------------------------------------------------------------------------------------ RAM / Core / Disk
def test_ram_filter_reason_and_ratio() -> None:
    hosts = table(
        host("fits", physical_mem_mb=2048, mem_committed_mb=1000),
        host("full", physical_mem_mb=1024, mem_committed_mb=1000),
        host("small", physical_mem_mb=512),
    )
    spec = vm(mem_mb=960)  # + 64 overhead = 1024 MB
    verdict = run("RamFilter", hosts, spec)
    # fits: 2048 x 1.5 - 1000 = 2072 >= 1024
    assert kept(hosts, verdict) == ["fits"]
    assert reasons(hosts, verdict) == {
        "full": "total RAM 1024 MB x ratio 1.5 - used 1000 MB = 536 MB < requested 1024 MB",
        "small": "total RAM 512 MB < requested 1024 MB",  # never overcommit against itself
    }
    # 2048 x 1.0 - 1000 = 1048 >= 1024; with 1072 MB asked it no longer fits
    assert kept(hosts, run("RamFilter", hosts, spec, RamAllocationRatio="1.0")) == ["fits"]
    assert kept(hosts, run("RamFilter", hosts, vm(mem_mb=1008), RamAllocationRatio="1.0")) == []


def test_ram_filter_counts_pending_and_reserved() -> None:
    hosts = table(
        host("a", physical_mem_mb=4096, reserved_mem_mb=96, mem_committed_mb=1000), pending=[pend("a", mem_mb=2000)]
    )
    verdict = run("RamFilter", hosts, vm(mem_mb=936), RamAllocationRatio="1.0")  # need 1000
    # 4096 - (96 + 1000 + 2000) = 1000 >= 1000
    assert kept(hosts, verdict) == ["a"]
    verdict = run("RamFilter", hosts, vm(mem_mb=937), RamAllocationRatio="1.0")
    assert reasons(hosts, verdict) == {"a": "total RAM 4096 MB x ratio 1 - used 3096 MB = 1000 MB < requested 1001 MB"}


def test_aggregate_ram_filter_takes_the_minimum_ratio() -> None:
    groups = {
        "g1": {"ram_allocation_ratio": "2.0"},
        "g2": {"ram_allocation_ratio": "1.0"},
        "bad": {"ram_allocation_ratio": "x"},
    }
    hosts = grouped(
        host("two", physical_mem_mb=1024, host_groups=["g1", "g2"]),
        host("one", physical_mem_mb=1024, host_groups=["g1"]),
        host("bad", physical_mem_mb=1024, host_groups=["bad"]),
        host("none", physical_mem_mb=1024),
        groups=groups,
    )
    spec = vm(mem_mb=1024 - 64)  # need 1024
    assert kept(hosts, run("AggregateRamFilter", hosts, spec)) == ["two", "one", "bad", "none"]
    busy = grouped(
        host("two", physical_mem_mb=1024, mem_committed_mb=512, host_groups=["g1", "g2"]),
        host("one", physical_mem_mb=1024, mem_committed_mb=512, host_groups=["g1"]),
        host("bad", physical_mem_mb=1024, mem_committed_mb=512, host_groups=["bad"]),
        host("none", physical_mem_mb=1024, mem_committed_mb=512),
        groups=groups,
    )
    verdict = run("AggregateRamFilter", busy, spec, RamAllocationRatio="1.2")
    # two: min(2.0, 1.0) = 1.0 -> 512 free < 1024; one: 2.0 -> 1536; bad/none: property 1.2 -> 716.8
    assert kept(busy, verdict) == ["one"]
    assert reasons(busy, verdict)["two"] == (
        "total RAM 1024 MB x ratio 1 (ram_allocation_ratio of the host's groups) - used 512 MB"
        " = 512 MB < requested 1024 MB"
    )
    assert (
        reasons(busy, verdict)["none"] == "total RAM 1024 MB x ratio 1.2 - used 512 MB = 716.8 MB < requested 1024 MB"
    )


def test_core_filter() -> None:
    hosts = table(
        host("ok", cpu_cores=2, vcpus_committed=30),
        host("busy", cpu_cores=2, vcpus_committed=31),
        host("tiny", cpu_cores=1),
        host("unknown", cpu_cores=0, vcpus_committed=1000),
        pending=[pend("busy", vcpus=0)],
    )
    verdict = run("CoreFilter", hosts, vm(vcpus=2))
    # ok: 2 x 16 - 30 = 2 >= 2; busy: 32 - 31 = 1 < 2; tiny: 1 core < 2 vCPUs; unknown: fail safe
    assert kept(hosts, verdict) == ["ok", "unknown"]
    assert reasons(hosts, verdict) == {
        "busy": "2 cores x ratio 16 - used 31 vCPUs = 1 vCPUs < requested 2",
        "tiny": "1 cores < requested 2 vCPUs",
    }


def test_core_filter_pending_and_aggregate() -> None:
    hosts = grouped(
        host("a", cpu_cores=4, vcpus_committed=2, host_groups=["g"]),
        host("b", cpu_cores=4, vcpus_committed=2),
        groups={"g": {"cpu_allocation_ratio": "1.0"}},
        pending=[pend("a", vcpus=1), pend("b", vcpus=1)],
    )
    verdict = run("AggregateCoreFilter", hosts, vm(vcpus=2), CpuAllocationRatio="2.0")
    # a: 4 x 1.0 - 3 = 1 < 2; b: 4 x 2.0 - 3 = 5
    assert kept(hosts, verdict) == ["b"]
    assert reasons(hosts, verdict)["a"].endswith("- used 3 vCPUs = 1 vCPUs < requested 2")
    assert kept(hosts, run("CoreFilter", hosts, vm(vcpus=2), CpuAllocationRatio="1.0")) == []


def test_disk_filter() -> None:
    hosts = table(
        host("ok", disk_total_mb=1000, disk_free_mb=600),
        host("used", disk_total_mb=1000, disk_free_mb=499),
        host("small", disk_total_mb=400, disk_free_mb=400),
        host("unknown"),
    )
    verdict = run("DiskFilter", hosts, vm(disk_mb=500))
    assert kept(hosts, verdict) == ["ok"]
    assert reasons(hosts, verdict) == {
        "used": "total disk 1000 MB x ratio 1 - used 501 MB = 499 MB < requested 500 MB",
        "small": "total disk 400 MB < requested 500 MB",
        "unknown": "total disk 0 MB < requested 500 MB",
    }
    assert kept(hosts, run("DiskFilter", hosts, vm(disk_mb=500), DiskAllocationRatio="2.0")) == ["ok", "used"]
    assert kept(hosts, run("DiskFilter", hosts, vm(disk_mb=0))) == list(hosts.ids)


def test_aggregate_disk_filter() -> None:
    hosts = grouped(
        host("a", disk_total_mb=1000, disk_free_mb=200, host_groups=["g"]),
        host("b", disk_total_mb=1000, disk_free_mb=200),
        groups={"g": {"disk_allocation_ratio": "1.5"}},
    )
    # a: 1500 - 800 = 700 >= 500; b: 1000 - 800 = 200
    assert kept(hosts, run("AggregateDiskFilter", hosts, vm(disk_mb=500))) == ["a"]


# ------------------------------------------------------------------------------- NumInstances / IoOps
def test_num_instances() -> None:
    hosts = table(
        host("a", vm_count=49), host("b", vm_count=50), host("c", vm_count=48), pending=[pend("c"), pend("c")]
    )
    verdict = run("NumInstancesFilter", hosts)
    assert kept(hosts, verdict) == ["a"]
    assert reasons(hosts, verdict) == {
        "b": "50 instances >= max 50",
        "c": "48 instances + 2 pending = 50 >= max 50",
    }
    assert kept(hosts, run("NumInstancesFilter", hosts, MaxInstancesPerHost="51")) == ["a", "b", "c"]


def test_aggregate_num_instances() -> None:
    hosts = grouped(
        host("a", vm_count=3, host_groups=["small", "big"]),
        host("b", vm_count=3, host_groups=["big"]),
        host("c", vm_count=3),
        groups={"small": {"max_instances_per_host": "3"}, "big": {"max_instances_per_host": "10"}},
    )
    verdict = run("AggregateNumInstancesFilter", hosts, MaxInstancesPerHost="2")
    assert kept(hosts, verdict) == ["b"]
    assert reasons(hosts, verdict) == {
        "a": "3 instances >= max 3 (max_instances_per_host of the host's groups)",
        "c": "3 instances >= max 2",
    }


def test_io_ops() -> None:
    hosts = table(host("a", num_io_ops=7), host("b", num_io_ops=8), host("c", num_io_ops=7), pending=[pend("c")])
    verdict = run("IoOpsFilter", hosts)
    assert kept(hosts, verdict) == ["a"]
    assert reasons(hosts, verdict) == {
        "b": "8 I/O ops >= max 8",
        "c": "7 I/O ops + 1 pending starts = 8 >= max 8",
    }
    assert kept(hosts, run("IoOpsFilter", hosts, MaxIoOpsPerHost="0")) == []


def test_aggregate_io_ops() -> None:
    hosts = grouped(
        host("a", num_io_ops=2, host_groups=["g"]), host("b", num_io_ops=2), groups={"g": {"max_io_ops_per_host": "2"}}
    )
    assert kept(hosts, run("AggregateIoOpsFilter", hosts)) == ["b"]


# ------------------------------------------------------------------------------------- tenancy
def test_multi_tenancy_isolation() -> None:
    groups = {"iso": {"filter_tenant_id": "t1, t2"}, "iso2": {"filter_tenant_id_2": "t3"}, "open": {"x": "1"}}
    hosts = grouped(
        host("iso", host_groups=["iso"]),
        host("iso2", host_groups=["iso", "iso2"]),
        host("open", host_groups=["open"]),
        host("plain"),
        groups=groups,
    )
    verdict = run("AggregateMultiTenancyIsolation", hosts, vm(tenant_id="t3"))
    assert kept(hosts, verdict) == ["iso2", "open", "plain"]
    assert reasons(hosts, verdict) == {"iso": "host isolated to tenants 't1', 't2', not tenant 't3'"}
    assert kept(hosts, run("AggregateMultiTenancyIsolation", hosts, vm(tenant_id="t1"))) == [
        "iso",
        "iso2",
        "open",
        "plain",
    ]
    verdict = run("AggregateMultiTenancyIsolation", hosts, vm())
    assert kept(hosts, verdict) == ["open", "plain"]
    assert reasons(hosts, verdict)["iso"] == "host isolated to tenants 't1', 't2', not no tenant"


# -------------------------------------------------------------------------------------- Metrics
def test_metric_names() -> None:
    assert metric_names("cpu.percent=1.0,mem.free=-1") == ["cpu.percent", "mem.free"]
    assert metric_names(" a = 1 , b=2, a=3,junk,=4") == ["a", "b"]
    assert metric_names("") == []


def test_metrics_filter() -> None:
    hosts = table(
        host("all", metrics={"cpu.percent": 12.5, "mem.free": 0.0}),
        host("some", metrics={"cpu.percent": 1.0}),
        host("none"),
    )
    verdict = run("MetricsFilter", hosts, WeightSetting="cpu.percent=1.0,mem.free=-1")
    assert kept(hosts, verdict) == ["all"]
    assert reasons(hosts, verdict) == {
        "some": "metric 'mem.free' not reported",
        "none": "metrics 'cpu.percent', 'mem.free' not reported",
    }
    assert kept(hosts, run("MetricsFilter", hosts)) == ["all", "some", "none"]  # default: nothing weighed


# ------------------------------------------------------------------------------ AvailabilityZone
def test_availability_zone() -> None:
    hosts = grouped(
        host("label1", labels={"availability_zone": "az1"}),
        host("group2", host_groups=["g2"]),
        host("both", labels={"availability_zone": "az3"}, host_groups=["g1"]),
        host("default"),
        groups={"g1": {"availability_zone": "az1"}, "g2": {"availability_zone": "az2,az4"}},
    )
    verdict = run("AvailabilityZoneFilter", hosts, vm(availability_zone="az1"))
    assert kept(hosts, verdict) == ["label1", "both"]
    assert reasons(hosts, verdict) == {
        "group2": "host in zone 'az2', 'az4', requested 'az1'",
        "default": "host in zone 'nova', requested 'az1'",
    }
    assert kept(hosts, run("AvailabilityZoneFilter", hosts, vm(availability_zone="az4, az3"))) == ["group2", "both"]
    assert kept(hosts, run("AvailabilityZoneFilter", hosts, vm(availability_zone="nova"))) == ["default"]
    assert kept(
        hosts, run("AvailabilityZoneFilter", hosts, vm(availability_zone="x"), DefaultAvailabilityZone="x")
    ) == ["default"]
    assert kept(hosts, run("AvailabilityZoneFilter", hosts, vm())) == list(hosts.ids)


# ------------------------------------------------------------------------------------------ Retry
def test_retry() -> None:
    hosts = hosts_n(3)
    verdict = run("RetryFilter", hosts, vm(tried_hosts=["h1", "elsewhere"]))
    assert kept(hosts, verdict) == ["h0", "h2"]
    assert reasons(hosts, verdict) == {"h1": "already tried for this VM (a previous start failed)"}
    assert kept(hosts, run("RetryFilter", hosts, vm(tried_hosts=["h0", "h1", "h2"]))) == []


# -------------------------------------------------------------------------------------- JsonFilter
def test_json_filter_keeps_only_hosts_with_enough_free_ram_and_disk() -> None:
    hosts = table(
        host("a", physical_mem_mb=4096, mem_committed_mb=3000, disk_free_mb=300 * 1024),
        host("b", physical_mem_mb=4096, mem_committed_mb=3100, disk_free_mb=300 * 1024),
        host("c", physical_mem_mb=8192, disk_free_mb=100 * 1024),
    )
    query = ["and", [">=", "$free_ram_mb", 1024], [">=", "$free_disk_mb", 200 * 1024]]
    verdict = run("JsonFilter", hosts, vm(query=query))
    # free_ram_mb: a 1096, b 996, c 8192
    assert kept(hosts, verdict) == ["a"]
    assert reasons(hosts, verdict)["b"].startswith("query ['and', ['>=', '$free_ram_mb', 1024]")


def test_json_filter_real_negation() -> None:
    hosts = table(host("x86"), host("arm", arch="aarch64"))
    query = ["and", ["not", ["=", "$arch", "x86_64"]], [">=", "$cpu_cores", 1]]
    assert kept(hosts, run("JsonFilter", hosts, vm(query=query))) == ["arm"]  # Nova would keep both


def test_json_filter_references() -> None:
    hosts = table(host("a", metrics={"cpu.percent": 10.0}, labels={"rack": "r1"}), host("b", hypervisor_type="KVM"))
    assert (
        kept(hosts, run("JsonFilter", hosts, vm(query=["<", "$metrics.cpu.percent", 50]))) == []
    )  # "cpu" then "percent"
    assert kept(hosts, run("JsonFilter", hosts, vm(query=["=", "$labels.rack", "r1"]))) == ["a"]
    assert kept(hosts, run("JsonFilter", hosts, vm(query=["in", "$hypervisor_type", "KVM", "XEN"]))) == ["b"]
    assert kept(hosts, run("JsonFilter", hosts, vm(query=["=", "$host", "b"]))) == ["b"]
    assert kept(hosts, run("JsonFilter", hosts, vm(query=[]))) == ["a", "b"]


def test_json_filter_service_disabled_is_the_inverse_of_enabled() -> None:
    # Nova's commonest query keeps hosts whose compute service is not disabled.
    hosts = table(host("on", disk_free_mb=300 * 1024), host("off", enabled=False, disk_free_mb=300 * 1024))

    def passing(query: list[Any]) -> list[str]:
        return kept(hosts, run("JsonFilter", hosts, vm(query=query)))

    assert passing(["not", "$service.disabled"]) == ["on"]
    assert passing(["=", "$service.disabled", False]) == ["on"]
    assert passing(["=", "$service.disabled", True]) == ["off"]
    assert passing(
        ["and", [">=", "$free_ram_mb", 1024], [">=", "$free_disk_mb", 200 * 1024], ["not", "$service.disabled"]]
    ) == ["on"]
    assert passing(["=", "$service.host", "off"]) == ["off"]
    assert passing(["=", "$service.no_such_field", 1]) == []  # missing: dropped, one argument left


def test_json_filter_maps_the_variables_nova_documents() -> None:
    hosts = table(host("h1", capabilities={"cpu_info": '{"vendor": "Intel"}'}))
    documented = [
        "free_ram_mb",
        "free_disk_mb",
        "hypervisor_hostname",
        "total_usable_ram_mb",
        "vcpus_total",
        "vcpus_used",
    ]
    for name in [*documented, "service", "failed_builds", "cpu_info"]:
        assert host_attribute(hosts, 0, name) is not None, name
    assert host_attribute(hosts, 0, "service") == {"disabled": False, "host": "h1"}
    assert kept(hosts, run("JsonFilter", hosts, vm(query=["=", "$cpu_info.vendor", "Intel"]))) == ["h1"]
    assert kept(hosts, run("JsonFilter", hosts, vm(query=["<", "$failed_builds", 1]))) == ["h1"]


def test_json_filter_invalid_query_removes_all_with_reason() -> None:
    hosts = hosts_n(2)
    verdict = run("JsonFilter", hosts, vm(query=["xor", 1, 2]))
    assert kept(hosts, verdict) == []
    assert verdict.reasons[0].startswith("invalid JsonFilter query: unknown operator 'xor'")


# ---------------------------------------------------------------------------------- ImageProperties
def test_image_properties() -> None:
    hosts = table(
        host("x86", hypervisor_version=6_001_000),
        host("arm", arch="aarch64"),
        host("xen", hypervisor_type="xapi", arch="AMD64"),
        host("old", hypervisor_version=5_002_000),
    )

    def check(**p: str) -> list[str]:
        return kept(hosts, run("ImagePropertiesFilter", hosts, vm(image_properties=p)))

    assert check() == ["x86", "arm", "xen", "old"]
    assert check(hw_architecture="x86_64") == ["x86", "xen", "old"]
    assert check(architecture="arm64") == ["arm"]  # legacy name, canonicalized
    assert check(img_hv_type="xen") == ["xen"]
    assert check(hypervisor_type="qemu") == ["x86", "arm", "old"]
    # unknown version (0) passes, as in Nova
    assert check(img_hv_requested_version=">=6.0, <7.0") == ["x86", "arm", "xen"]
    verdict = run("ImagePropertiesFilter", hosts, vm(image_properties={"hw_architecture": "s390x"}))
    assert reasons(hosts, verdict)["arm"] == "architecture 'aarch64', image needs 's390x'"
    verdict = run("ImagePropertiesFilter", hosts, vm(image_properties={"img_hv_requested_version": ">= 6.0"}))
    assert reasons(hosts, verdict) == {"old": "hypervisor version 5.2.0, image needs '>= 6.0'"}
    verdict = run("ImagePropertiesFilter", hosts, vm(image_properties={"img_hv_requested_version": "~6"}))
    assert kept(hosts, verdict) == ["arm", "xen"]


def test_version_helpers() -> None:
    assert version_tuple(1_005_003) == (1, 5, 3)
    assert version_satisfies((6, 1, 0), ">=6.0,<7") is True
    assert version_satisfies((6, 0, 0), "==6") is True
    assert version_satisfies((6, 0, 0), "!=6.0.0") is False
    assert version_satisfies((6, 0, 0), ">6") is False
    assert version_satisfies((6, 0, 0), "") is None
    assert version_satisfies((6, 0, 0), "6.0") is None
    assert canonical_arch("AMD64") == "x86_64"
    assert canonical_arch("i386") == "i686"
