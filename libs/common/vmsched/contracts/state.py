"""What the engine reports (cluster settings, hosts, VMs) and what the state tracker keeps."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from vmsched.contracts.base import (
    MAX_INT,
    Bool,
    Capabilities,
    Float,
    Id,
    Int,
    Key,
    Message,
    ShortValue,
    Text,
)

#: A host group's (Nova aggregate's) metadata: Nova stores an aggregate's keys and values as String(255).
GroupMetadata = Annotated[dict[Key, ShortValue], Field(max_length=256)]
#: Free huge pages: page size in KiB (a JSON object key, hence a string on the wire) -> pages.
HugePageSize = Annotated[int, Field(ge=1, le=1 << 24)]


class HostStatus(StrEnum):
    UP = "up"
    MAINTENANCE = "maintenance"
    DOWN = "down"
    NON_RESPONSIVE = "non_responsive"


class VmStatus(StrEnum):
    #: Placed, being started by the engine: still pending on its host.
    STARTING = "starting"
    RUNNING = "running"
    MIGRATING = "migrating"
    DOWN = "down"
    #: The start (or migration) failed: its pending record is dropped.
    FAILED = "failed"


class ClusterReport(Message):
    """Cluster-wide settings the engine owns (oVirt keeps these on the cluster, not the policy)."""

    cluster_id: Id
    #: Memory overcommit: max scheduling memory = physical x this / 100 (oVirt: 100, 150 or 200).
    memory_overcommit_pct: Int = Field(100, ge=1, le=1000)
    #: Count host threads, not cores, as CPUs (oVirt "Count Threads As Cores").
    count_threads_as_cores: Bool = False
    #: Host groups (Nova aggregates) and their metadata: cpu_allocation_ratio, ram_allocation_ratio,
    #: disk_allocation_ratio, max_instances_per_host, max_io_ops_per_host, filter_tenant_id,
    #: availability_zone, ... Hosts name the groups they belong to (HostReport.host_groups).
    host_groups: dict[Id, GroupMetadata] = Field(default_factory=dict, max_length=10_000)
    reported_at: datetime | None = None


class HostReport(Message):
    """One host's capacity and usage, as measured by the engine. Routing key state.host.<cluster>."""

    cluster_id: Id
    host_id: Id
    status: HostStatus
    cpu_sockets: Int = Field(1, ge=0, le=1024)
    #: Total physical cores; 0 means the topology is unknown (the CPU filter then removes the host).
    cpu_cores: Int = Field(ge=0, le=100_000)
    cpu_threads: Int = Field(0, ge=0, le=200_000)
    cpu_usage_pct: Float = Field(0.0, ge=0, le=100)
    physical_mem_mb: Int = Field(ge=0, le=1 << 40)
    mem_free_mb: Int = Field(ge=0, le=1 << 40)
    swap_total_mb: Int = Field(0, ge=0, le=1 << 40)
    swap_free_mb: Int = Field(0, ge=0, le=1 << 40)
    #: Memory the host keeps for itself (oVirt "reserved memory", default 321 MB).
    reserved_mem_mb: Int = Field(321, ge=0, le=1 << 40)
    networks: list[Id] = Field(default_factory=list, max_length=4096)
    is_spm: Bool = False
    #: The host's compute service is enabled (Nova ComputeFilter); a disabled host takes no VM.
    enabled: Bool = True
    arch: str = Field("x86_64", max_length=64)
    hypervisor_type: str = Field("QEMU", max_length=64)
    hypervisor_version: Int = Field(0, ge=0, le=MAX_INT)
    #: CPU models the host can offer a VM (oVirt cluster CPU level / Nova cpu_info).
    cpu_models: list[Annotated[str, Field(max_length=128)]] = Field(default_factory=list, max_length=256)
    #: Machine types the host's emulator supports (oVirt emulated machine, e.g. pc-q35-rhel9.2.0).
    emulated_machines: list[Annotated[str, Field(max_length=128)]] = Field(default_factory=list, max_length=256)
    #: Free static huge pages by page size in KiB (e.g. {2048: 512, 1048576: 4}).
    hugepages_free: dict[HugePageSize, Annotated[Int, Field(ge=0, le=1 << 40)]] = Field(
        default_factory=dict, max_length=16
    )
    disk_total_mb: Int = Field(0, ge=0, le=1 << 40)
    disk_free_mb: Int = Field(0, ge=0, le=1 << 40)
    #: Instances doing I/O-heavy work right now (build, resize, snapshot): Nova num_io_ops.
    num_io_ops: Int = Field(0, ge=0, le=1_000_000)
    #: Free-form labels: availability_zone, rack, ... (Nova AZ is the label "availability_zone").
    labels: dict[Key, ShortValue] = Field(default_factory=dict, max_length=256)
    #: Host groups (aggregates) the host belongs to; their metadata is in ClusterReport.host_groups.
    host_groups: list[Id] = Field(default_factory=list, max_length=256)
    #: Nested capabilities for extra-spec matching (capabilities:cpu_info:features ...); bounded in
    #: depth, nodes and string length (vmsched.contracts.base).
    capabilities: Capabilities = Field(default_factory=dict, max_length=256)
    #: Named numeric metrics (Nova MetricsFilter/MetricsWeigher), e.g. {"cpu.percent": 12.5}.
    metrics: dict[Key, Float] = Field(default_factory=dict, max_length=256)
    reported_at: datetime | None = None


class VmReport(Message):
    """One VM's placement, size and usage. Routing key state.vm.<cluster>.

    A report of RUNNING on the host the VM was placed on (or FAILED/DOWN anywhere) clears that VM's
    pending-resource record.
    """

    cluster_id: Id
    vm_id: Id
    status: VmStatus
    host_id: Id | None = None
    mem_mb: Int = Field(ge=1, le=1 << 34)
    overhead_mb: Int = Field(64, ge=0, le=1 << 20)
    vcpus: Int = Field(ge=1, le=4096)
    #: The VM's vCPUs are pinned exclusively (dedicated CPU policy).
    exclusive_cpus: Bool = False
    cpu_usage_pct: Float = Field(0.0, ge=0, le=100)
    mem_usage_pct: Float = Field(0.0, ge=0, le=100)
    ha: Bool = False
    #: The VM may be live-migrated (oVirt migration support): the balancer never picks one that may not.
    migratable: Bool = True
    #: Networks the VM's interfaces use (a migration target must have them).
    networks: list[Id] = Field(default_factory=list, max_length=256)
    reported_at: datetime | None = None


class HostRemoved(Message):
    """Hosts taken out of a cluster for good (`vmsched hosts remove`). Routing key state.host-removed.<cluster>.

    The state tracker drops their records and the VMs counted on them, as one new state version:
    workers' caches drop the hosts when they catch up. A removed host that reports again is back.
    Ids the cluster does not have are ignored.
    """

    cluster_id: Id
    host_ids: list[Id] = Field(min_length=1, max_length=100_000)
    reason: Text = ""
    removed_at: datetime | None = None


class ClusterRemoved(Message):
    """A cluster taken out of vmsched (`vmsched clusters remove`). Routing key state.cluster-removed.<cluster>.

    The state tracker deletes its state (hosts, VMs, settings, change stream) and pending resources;
    the cluster is then unknown until it is reported again. Its policy link (PostgreSQL) and its
    stored decisions (until they expire) stay.
    """

    cluster_id: Id
    reason: Text = ""
    removed_at: datetime | None = None


class HostState(Message):
    """A host as the scheduler sees it: the last report plus what its VMs add up to."""

    report: HostReport
    vm_count: Int = Field(0, ge=0, le=MAX_INT)
    #: Sum of memory + overhead of the VMs on the host (oVirt mem_commited).
    mem_committed_mb: Int = Field(0, ge=0, le=MAX_INT)
    vcpus_committed: Int = Field(0, ge=0, le=MAX_INT)
    #: Physical CPUs exclusively pinned by the host's VMs.
    cpus_pinned: Int = Field(0, ge=0, le=MAX_INT)
    ha_vm_count: Int = Field(0, ge=0, le=MAX_INT)
    #: The VMs counted on the host (affinity, Same/DifferentHost), sorted.
    vm_ids: list[Id] = Field(default_factory=list, max_length=100_000)
    #: Recent CPU load reports as (unix time, percent), oldest first, bounded: CPUOverloaded asks
    #: "over X% for the last Y minutes" for whatever X and Y a policy sets.
    cpu_samples: list[tuple[Float, Float]] = Field(default_factory=list, max_length=100_000)
    #: Failed VM starts on this host since its last successful one (Nova BuildFailureWeigher).
    build_failures: Int = Field(0, ge=0, le=MAX_INT)


class ClusterState(Message):
    """A snapshot of one cluster at one version (the reply to a state request)."""

    cluster_id: Id
    version: Int = Field(ge=0, le=MAX_INT)
    settings: ClusterReport
    #: vmsched is built for clusters of up to 10,000 hosts; these bounds leave room.
    hosts: list[HostState] = Field(max_length=100_000)
    vms: list[VmReport] = Field(max_length=2_000_000)
