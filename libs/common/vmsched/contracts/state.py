"""What the engine reports (cluster settings, hosts, VMs) and what the state tracker keeps."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar, Self

from pydantic import Field, model_validator

from vmsched.contracts.base import (
    MAX_INT,
    Bool,
    Capabilities,
    EngineEvent,
    Float,
    Id,
    Int,
    Key,
    Message,
    ShortValue,
    Text,
)
from vmsched.contracts.scheduling import AffinityGroup, PendingEntry, VmSpec

#: A host group's (Nova aggregate's) metadata: Nova stores an aggregate's keys and values as String(255).
GroupMetadata = Annotated[dict[Key, ShortValue], Field(max_length=256)]
#: Free huge pages: page size in KiB (a JSON object key, hence a string on the wire) -> pages.
HugePageSize = Annotated[int, Field(ge=1, le=1 << 24)]


#: How every report's `reported_at` reads.
REPORTED_AT = (
    "When the engine measured this: ISO 8601 date-time with a UTC offset (one without is taken as "
    "the state tracker's local time). Absent: when the state tracker takes the report."
)


class HostStatus(StrEnum):
    """A host's status as the engine sees it: only `up` hosts are scheduling candidates.
    `maintenance`: being serviced; `down`: off or failed; `non_responsive`: the engine lost contact."""

    UP = "up"
    MAINTENANCE = "maintenance"
    DOWN = "down"
    NON_RESPONSIVE = "non_responsive"


class VmStatus(StrEnum):
    """A VM's status: `starting` (placed, being started: still pending on its host), `running`,
    `migrating` (counted on the host it is reported on), `down`, `failed` (the start or migration
    failed). `running`, `failed` and `down` clear the VM's pending record."""

    #: Placed, being started by the engine: still pending on its host.
    STARTING = "starting"
    RUNNING = "running"
    MIGRATING = "migrating"
    DOWN = "down"
    #: The start (or migration) failed: its pending record is dropped.
    FAILED = "failed"


class ClusterReport(EngineEvent):
    """Cluster-wide settings the engine owns (oVirt keeps these on the cluster, not the policy).
    Routing key state.cluster.<cluster_id>."""

    cluster_id: Id = Field(description="The cluster's id; the routing key must name the same cluster.")
    memory_overcommit_pct: Int = Field(
        100,
        ge=1,
        le=1000,
        description="Memory overcommit, percent: a host's schedulable memory is its physical memory x this / 100 "
        "(oVirt: 100, 150 or 200).",
    )
    count_threads_as_cores: Bool = Field(
        False, description='Count host hardware threads, not cores, as CPUs (oVirt "Count Threads As Cores").'
    )
    host_groups: dict[Id, GroupMetadata] = Field(
        default_factory=dict,
        max_length=10_000,
        description="Host groups (Nova aggregates) by id, each with its metadata (string keys and values): "
        "cpu_allocation_ratio, ram_allocation_ratio, disk_allocation_ratio, max_instances_per_host, "
        "max_io_ops_per_host, filter_tenant_id, availability_zone, ... Hosts name the groups they belong to "
        "(HostReport.host_groups).",
    )
    reported_at: datetime | None = Field(None, description=REPORTED_AT)


class HostReport(EngineEvent):
    """One host's capacity and usage, as measured by the engine. Routing key state.host.<cluster_id>.
    A host's report replaces its previous one whole (a field left out takes its default)."""

    cluster_id: Id = Field(description="The host's cluster; the routing key must name the same cluster.")
    host_id: Id = Field(description="The host's id, unique within its cluster.")
    status: HostStatus = Field(description="The host's status; only `up` hosts are scheduling candidates.")
    cpu_sockets: Int = Field(1, ge=0, le=1024, description="Physical CPU sockets (count).")
    cpu_cores: Int = Field(
        ge=0,
        le=100_000,
        description="Physical CPU cores in total (count); 0 means the topology is unknown (the CPU filter then "
        "removes the host).",
    )
    cpu_threads: Int = Field(
        0, ge=0, le=200_000, description="Hardware threads in total (count); 0 means unknown (cores are used)."
    )
    cpu_usage_pct: Float = Field(0.0, ge=0, le=100, description="CPU load of the whole host now, percent (0-100).")
    physical_mem_mb: Int = Field(ge=0, le=1 << 40, description="Physical memory, MB (MiB: 2^20 bytes).")
    mem_free_mb: Int = Field(ge=0, le=1 << 40, description="Memory free now, MB.")
    swap_total_mb: Int = Field(0, ge=0, le=1 << 40, description="Swap space, MB.")
    swap_free_mb: Int = Field(0, ge=0, le=1 << 40, description="Swap space free now, MB.")
    reserved_mem_mb: Int = Field(
        321, ge=0, le=1 << 40, description='Memory the host keeps for itself, MB (oVirt "reserved memory").'
    )
    networks: list[Id] = Field(
        default_factory=list,
        max_length=4096,
        description="Networks the host is attached to (ids); a VM goes only where all its networks are.",
    )
    is_spm: Bool = Field(False, description="The host is oVirt's Storage Pool Manager (it counts as busier).")
    enabled: Bool = Field(
        True, description="The host's compute service is enabled (Nova ComputeFilter); a disabled host takes no VM."
    )
    arch: str = Field(
        "x86_64", max_length=64, description="CPU architecture (x86_64, aarch64, ...), matched with hw_architecture."
    )
    hypervisor_type: str = Field(
        "QEMU", max_length=64, description="Hypervisor type (QEMU, KVM, ...), matched with img_hv_type."
    )
    hypervisor_version: Int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Hypervisor version as Nova stores it, major x 1,000,000 + minor x 1,000 + patch "
        "(6001000 is 6.1.0); 0 means unknown.",
    )
    cpu_models: list[Annotated[str, Field(max_length=128)]] = Field(
        default_factory=list,
        max_length=256,
        description="CPU models the host can offer a VM (oVirt cluster CPU level / Nova cpu_info).",
    )
    emulated_machines: list[Annotated[str, Field(max_length=128)]] = Field(
        default_factory=list,
        max_length=256,
        description="Machine types the host's emulator supports (oVirt emulated machine, e.g. pc-q35-rhel9.2.0).",
    )
    hugepages_free: dict[HugePageSize, Annotated[Int, Field(ge=0, le=1 << 40)]] = Field(
        default_factory=dict,
        max_length=16,
        description='Free static huge pages: page size in KiB (an object key, so a string such as "2048") -> '
        "free pages (count).",
    )
    disk_total_mb: Int = Field(0, ge=0, le=1 << 40, description="Local disk for instances, MB.")
    disk_free_mb: Int = Field(0, ge=0, le=1 << 40, description="Local disk for instances free now, MB.")
    num_io_ops: Int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Instances doing I/O-heavy work now (build, resize, snapshot), count (Nova num_io_ops).",
    )
    labels: dict[Key, ShortValue] = Field(
        default_factory=dict,
        max_length=256,
        description="Free-form string labels: availability_zone, rack, ... (the Nova availability zone is the "
        "label availability_zone).",
    )
    host_groups: list[Id] = Field(
        default_factory=list,
        max_length=256,
        description="Host groups (aggregates) the host belongs to; their metadata is in ClusterReport.host_groups.",
    )
    capabilities: Capabilities = Field(
        default_factory=dict,
        max_length=256,
        description="Nested capabilities (any JSON) matched by capabilities:a:b extra specs, e.g. cpu_info; at "
        "most 8 levels deep, 4096 nodes, strings of 8192 characters.",
    )
    metrics: dict[Key, Float] = Field(
        default_factory=dict,
        max_length=256,
        description="Named numeric metrics for Nova MetricsFilter/MetricsWeigher, each in the unit its name says "
        '(e.g. {"cpu.percent": 12.5}).',
    )
    reported_at: datetime | None = Field(None, description=REPORTED_AT)


class VmReport(EngineEvent):
    """One VM's placement, size and usage. Routing key state.vm.<cluster_id>.

    A report of RUNNING on the host the VM was placed on (or FAILED/DOWN anywhere) clears that VM's
    pending-resource record.
    """

    cluster_id: Id = Field(description="The VM's cluster; the routing key must name the same cluster.")
    vm_id: Id = Field(description="The VM's id, unique within its cluster.")
    status: VmStatus = Field(description="The VM's status (see VmStatus).")
    host_id: Id | None = Field(None, description="The host the VM is on (or being started on); null when on none.")
    mem_mb: Int = Field(ge=1, le=1 << 34, description="The VM's memory, MB.")
    overhead_mb: Int = Field(
        64, ge=0, le=1 << 20, description="Memory the hypervisor needs for the VM on top of mem_mb, MB."
    )
    vcpus: Int = Field(ge=1, le=4096, description="Virtual CPUs (count).")
    exclusive_cpus: Bool = Field(
        False, description="The VM's vCPUs are pinned exclusively (dedicated CPU policy): each uses a host CPU."
    )
    cpu_usage_pct: Float = Field(0.0, ge=0, le=100, description="CPU load of the VM, percent (0-100) of its vCPUs.")
    mem_usage_pct: Float = Field(0.0, ge=0, le=100, description="Memory use of the VM, percent (0-100) of mem_mb.")
    ha: Bool = Field(False, description="Highly available: the HA reservation check keeps room to restart it.")
    migratable: Bool = Field(
        True,
        description="The VM may be live-migrated (oVirt migration support); the balancer never picks one that may not.",
    )
    networks: list[Id] = Field(
        default_factory=list,
        max_length=256,
        description="Networks the VM's interfaces use (ids); a migration target must have them.",
    )
    affinity_groups: list[AffinityGroup] = Field(
        default_factory=list,
        max_length=256,
        description="Affinity groups (or server groups) the VM belongs to, as the engine knows them: a "
        "migration's target (balancing, a maintenance plan) keeps to them as a new placement does.",
    )
    reported_at: datetime | None = Field(None, description=REPORTED_AT)

    @classmethod
    def running(cls, cluster_id: str, host_id: str, vm: VmSpec) -> VmReport:
        """The engine's report of `vm` started as it was asked (its size, networks, groups, HA) and
        running on `host_id`: what clears its pending record."""
        asked = {name: getattr(vm, name) for name in _AS_ASKED}
        return cls(cluster_id=cluster_id, host_id=host_id, status=VmStatus.RUNNING, **asked)


#: The fields a VM's report shares with the VmSpec it was asked with.
_AS_ASKED = tuple(sorted((set(VmSpec.model_fields) & set(VmReport.model_fields)) - {"schema_version"}))


#: The most reports one StateReports carries (hosts and VMs together).
MAX_STATE_REPORTS = 1000


class StateReports(EngineEvent):
    """Several of one cluster's host and VM reports in one message. Routing key
    state.reports.<cluster_id>.

    Applied as publishing them one by one would be, hosts first (each in its order), then VMs (each
    in its order), for a fraction of the cost per report: one message to route, deliver and
    acknowledge instead of one per report. If the state tracker refuses a report in it, the whole
    message is dead-lettered with that report's reason (its log names each refused one by position,
    hosts[i] or vms[i]); the others are applied.
    """

    #: The fields whose items are events of their own (their unknown fields are dropped too).
    nested_events: ClassVar[tuple[str, ...]] = ("hosts", "vms")

    cluster_id: Id = Field(description="The reports' cluster; the routing key and every report must name the same.")
    hosts: list[HostReport] = Field(
        default_factory=list, max_length=MAX_STATE_REPORTS, description="Host reports, applied first, in order."
    )
    vms: list[VmReport] = Field(
        default_factory=list, max_length=MAX_STATE_REPORTS, description="VM reports, applied after the hosts, in order."
    )

    @model_validator(mode="after")
    def _one_cluster(self) -> Self:
        total = len(self.hosts) + len(self.vms)
        if total == 0:
            raise ValueError("no reports: give at least one host or VM report")
        if total > MAX_STATE_REPORTS:
            raise ValueError(f"{total} reports; at most {MAX_STATE_REPORTS} in one message")
        for i, report in enumerate(self.reports()):
            if report.cluster_id != self.cluster_id:
                where = self.position(i, len(self.hosts))
                raise ValueError(f"{where} names cluster {report.cluster_id!r}, not the message's {self.cluster_id!r}")
        return self

    def reports(self) -> list[HostReport | VmReport]:
        """The reports in the order they are applied."""
        return [*self.hosts, *self.vms]

    @staticmethod
    def position(index: int, hosts: int) -> str:
        """Where the `index`-th report of `reports()` sits in the message (hosts: how many hosts)."""
        return f"hosts[{index}]" if index < hosts else f"vms[{index - hosts}]"


class HostRemoved(Message):
    """Hosts taken out of a cluster for good (`vmsched hosts remove`). Routing key state.host-removed.<cluster_id>.

    The state tracker drops their records and the VMs counted on them, as one new state version:
    workers' caches drop the hosts when they catch up. A removed host that reports again is back.
    Ids the cluster does not have are ignored.
    """

    cluster_id: Id = Field(description="The hosts' cluster; the routing key must name the same cluster.")
    host_ids: list[Id] = Field(min_length=1, max_length=100_000, description="The hosts to remove (ids).")
    reason: Text = Field("", description="Why, for people (kept in the state tracker's log).")
    removed_at: datetime | None = Field(
        None, description="When they were removed: ISO 8601 date-time with a UTC offset. Absent: unknown."
    )


class ClusterRemoved(Message):
    """A cluster taken out of vmsched (`vmsched clusters remove`). Routing key state.cluster-removed.<cluster_id>.

    The state tracker deletes its state (hosts, VMs, settings, change stream) and pending resources;
    the cluster is then unknown until it is reported again. Its policy link (PostgreSQL) and its
    stored decisions (until they expire) stay.
    """

    cluster_id: Id = Field(description="The cluster to remove; the routing key must name the same cluster.")
    reason: Text = Field("", description="Why, for people (kept in the state tracker's log).")
    removed_at: datetime | None = Field(
        None, description="When it was removed: ISO 8601 date-time with a UTC offset. Absent: unknown."
    )


class HostState(Message):
    """A host as the scheduler sees it: the last report plus what its VMs add up to."""

    report: HostReport = Field(description="The host's last report.")
    vm_count: Int = Field(0, ge=0, le=MAX_INT, description="VMs counted on the host (count).")
    mem_committed_mb: Int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Memory plus overhead of the VMs counted on the host, MB (oVirt mem_commited).",
    )
    vcpus_committed: Int = Field(0, ge=0, le=MAX_INT, description="vCPUs of the VMs counted on the host (count).")
    cpus_pinned: Int = Field(
        0, ge=0, le=MAX_INT, description="Host CPUs pinned exclusively by the VMs counted on it (count)."
    )
    ha_vm_count: Int = Field(0, ge=0, le=MAX_INT, description="Highly available VMs counted on the host (count).")
    vm_ids: list[Id] = Field(
        default_factory=list,
        max_length=100_000,
        description="The VMs counted on the host (affinity, Same/DifferentHost), sorted.",
    )
    cpu_samples: list[tuple[Float, Float]] = Field(
        default_factory=list,
        max_length=100_000,
        description="Recent CPU load reports as [unix seconds, percent] pairs, oldest first, bounded: CPUOverloaded "
        'asks "over X% for the last Y minutes" for whatever X and Y a policy sets.',
    )
    build_failures: Int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Failed VM starts on this host since its last successful one, count (Nova BuildFailureWeigher).",
    )


class ClusterState(Message):
    """A snapshot of one cluster at one version (the reply to a state request)."""

    cluster_id: Id = Field(description="The cluster's id.")
    version: Int = Field(
        ge=0, le=MAX_INT, description="The cluster's state version: one more for every report applied."
    )
    settings: ClusterReport = Field(description="The cluster's last ClusterReport (defaults if none came yet).")
    hosts: list[HostState] = Field(
        max_length=100_000,
        description="Every host reported, with what its VMs add up to (vmsched is built for up to 10,000 hosts).",
    )
    vms: list[VmReport] = Field(max_length=2_000_000, description="Every VM's last report.")
    pending: list[PendingEntry] = Field(
        default_factory=list,
        max_length=2_000_000,
        description="Resources held by placements the engine has not reported running yet (the state tracker's "
        "answer to a state request lists them; they count on their hosts until reported or expired).",
    )
