"""A schedule request, the decision that answers it, and what explains the decision."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import Field, model_validator

from vmsched.contracts.base import (
    MAX_EXTRA_SPECS,
    MAX_INT,
    Bool,
    Float,
    Id,
    ImagePropertyValue,
    Int,
    Key,
    Message,
    Name,
    Query,
    ShortValue,
    Text,
)

#: Hosts a cluster may have, with room: every host list (candidates, ranked hosts, filtered hosts)
#: is at most this long. vmsched is built for clusters of up to 10,000 hosts.
MAX_HOSTS = 100_000


class AffinityRule(Message):
    #: True: keep together (VMs on one host / VM on these hosts); False: keep apart.
    positive: Bool
    #: Hard (a filter: never broken) or soft (a weight: broken only when it must be).
    enforcing: Bool


class AffinityGroup(Message):
    """An oVirt affinity group (or a Nova server group) the VM belongs to, as the engine knows it."""

    group_id: Id
    #: The group's VMs (the VM being placed may be among them).
    vms: list[Id] = Field(default_factory=list, max_length=10_000)
    #: VM to VM rule, if the group has one.
    vm_rule: AffinityRule | None = None
    #: The group's hosts, for the VM to host rule.
    hosts: list[Id] = Field(default_factory=list, max_length=10_000)
    host_rule: AffinityRule | None = None
    #: Soft groups of higher priority weigh more when they would be broken.
    priority: Float = Field(1.0, ge=0, le=1_000_000)


class VmSpec(Message):
    """The VM to place, with everything the filters and weights look at (Nova: the RequestSpec)."""

    vm_id: Id
    mem_mb: Int = Field(ge=1, le=1 << 34)
    #: Guest overhead added to the memory need (oVirt computes ~64 MB + video RAM).
    overhead_mb: Int = Field(64, ge=0, le=1 << 20)
    vcpus: Int = Field(ge=1, le=4096)
    cpu_sockets: Int = Field(1, ge=1, le=1024)
    #: The vCPUs are pinned exclusively (dedicated CPU policy): they use up physical CPUs.
    exclusive_cpus: Bool = False
    #: Expected CPU load of the VM in percent of its vCPUs (0 for a new VM).
    cpu_usage_pct: Float = Field(0.0, ge=0, le=100)
    networks: list[Id] = Field(default_factory=list, max_length=256)
    #: Hosts the VM is pinned to (PinToHost); empty means any.
    pinned_hosts: list[Id] = Field(default_factory=list, max_length=4096)
    #: The host the VM runs on now; set for a migration (the Migration filter removes it).
    current_host: Id | None = None
    ha: Bool = False
    #: May run on hosts with swap in use (the Memory filter then counts free swap).
    use_swap: Bool = True
    #: Backed by static huge pages: swap never counts toward its memory.
    hugepages: Bool = False
    #: Huge page size in KiB when `hugepages` (2048 or 1048576 on x86_64).
    hugepage_size_kb: Int = Field(2048, ge=4, le=1 << 24)
    cpu_cores_per_socket: Int = Field(1, ge=1, le=4096)
    cpu_threads_per_core: Int = Field(1, ge=1, le=64)
    #: Machine type and CPU model the VM needs (oVirt emulated machine / CPU level).
    emulated_machine: str | None = Field(None, max_length=128)
    cpu_model: str | None = Field(None, max_length=128)
    disk_mb: Int = Field(0, ge=0, le=1 << 40)
    affinity_groups: list[AffinityGroup] = Field(default_factory=list, max_length=256)
    #: Hosts to prefer when they fit (oVirt PreferredHosts).
    preferred_hosts: list[Id] = Field(default_factory=list, max_length=4096)
    #: Flavor extra specs (Nova ComputeCapabilities / aggregate extra specs), e.g. {"hw:cpu_policy": "..."}.
    extra_specs: dict[Key, ShortValue] = Field(default_factory=dict, max_length=MAX_EXTRA_SPECS)
    #: Image properties: hw_architecture, img_hv_type, hw_vm_mode, ...
    image_properties: dict[Key, ImagePropertyValue] = Field(default_factory=dict, max_length=256)
    tenant_id: Id | None = None
    availability_zone: str | None = Field(None, max_length=255)
    #: Scheduler hints: place on a host running one of these VMs / on none of their hosts.
    same_host: list[Id] = Field(default_factory=list, max_length=10_000)
    different_host: list[Id] = Field(default_factory=list, max_length=10_000)
    #: Hosts already tried for this VM (a retry after a failed start): the Retry filter removes them.
    tried_hosts: list[Id] = Field(default_factory=list, max_length=10_000)
    #: Nova JsonFilter query (a JSON list, e.g. ["and", [">=", "$free_ram_mb", 1024], ...]).
    #: Bounded (vmsched.contracts.base: depth, nodes, string length): it is evaluated on every host.
    query: Query | None = None


class RequestKind(StrEnum):
    RUN = "run"
    MIGRATE = "migrate"


class ScheduleRequest(Message):
    """Where should this VM run? RPC `schedule`; the reply is a ScheduleDecision."""

    request_id: UUID
    cluster_id: Id
    vm: VmSpec
    kind: RequestKind = RequestKind.RUN
    #: Only these hosts are candidates (a migration's balance targets); None means all Up hosts.
    whitelist: list[Id] | None = Field(None, max_length=MAX_HOSTS)
    #: Never these hosts (already tried for this request: the Retry idea).
    blacklist: list[Id] = Field(default_factory=list, max_length=MAX_HOSTS)
    max_alternates: Int = Field(3, ge=0, le=50)
    #: A request still queued after this instant is not placed (status `expired`).
    deadline: datetime | None = None
    #: Among requests waiting for the same cluster, higher is decided first; waiting raises it by one
    #: per VMSCHED_PRIORITY_AGING_S so no request starves; then earlier deadline, smaller VM, arrival.
    priority: Int = Field(0, ge=-1000, le=1000)
    #: Include the per-unit, per-host score table in the decision. Off unless asked: at 1,000 hosts
    #: and 19 weight units the table is ~40,000 numbers, serialized for the decision store, the
    #: decision event and the reply, which cost more than the decision itself.
    explain_scores: Bool = False
    #: Include every removed host with its filter and reason in a placed decision's explanation.
    #: Off unless asked: the summary already counts the removals per filter, and an unplaceable
    #: decision always lists every host with its reason.
    explain_hosts: Bool = False
    #: More VMs placed together with `vm`, in order, all or none (oVirt batch start, Nova
    #: multi-instance): each is filtered and weighed after the earlier ones virtually consumed
    #: their hosts, so they spread (or stack) and honour affinity among themselves.
    batch: list[VmSpec] = Field(default_factory=list, max_length=1000)

    @model_validator(mode="after")
    def _migration_has_source(self) -> ScheduleRequest:
        if self.kind is RequestKind.MIGRATE and self.vm.current_host is None:
            raise ValueError("a migrate request needs vm.current_host (the source host)")
        ids = [self.vm.vm_id, *(v.vm_id for v in self.batch)]
        if len(set(ids)) != len(ids):
            raise ValueError("every VM of a request needs its own vm_id")
        return self

    @property
    def vms(self) -> list[VmSpec]:
        return [self.vm, *self.batch]


class DecisionStatus(StrEnum):
    PLACED = "placed"
    #: No host passed the filters (the explanation says why, per host).
    UNPLACEABLE = "unplaceable"
    #: The deadline passed before the request could be placed.
    EXPIRED = "expired"
    #: The request could not be evaluated (unknown cluster, invalid policy, ...): see `error`.
    ERROR = "error"


class FilteredHost(Message):
    host_id: Id
    #: The filter that removed the host.
    filter: Name
    #: Why, with numbers: "free memory 487 MB < required 1088 MB".
    reason: Text


class UnitScores(Message):
    """One weight unit's column of the score table (aligned with ScoreTable.hosts)."""

    unit: Name
    factor: Float
    raw: list[Float] = Field(max_length=MAX_HOSTS)
    #: What the selector made of the raw weight: rank points (RankSelector) or a normalized value.
    points: list[Float] = Field(max_length=MAX_HOSTS)


class ScoreTable(Message):
    """The selection step, inspectable: hosts in final order, best first."""

    selector: Name
    hosts: list[Id] = Field(max_length=MAX_HOSTS)
    units: list[UnitScores] = Field(max_length=256)
    totals: list[Float] = Field(max_length=MAX_HOSTS)


class ErrorInfo(Message):
    code: Name
    message: Text


class Explanation(Message):
    #: "3/50 hosts available: 30 Memory (insufficient free memory), 17 Network (missing network)".
    summary: Text
    candidates: Int = Field(ge=0, le=MAX_INT)
    #: The filter chain that ran, in order (a host removed by one is not seen by the next).
    filters: list[Name] = Field(default_factory=list, max_length=256)
    filtered: list[FilteredHost] = Field(default_factory=list, max_length=MAX_HOSTS)
    scores: ScoreTable | None = None


class Placement(Message):
    """Where one VM of the request goes."""

    vm_id: Id
    host_id: Id
    alternates: list[Id] = Field(default_factory=list, max_length=50)
    #: The aggregate line of this VM's filtering ("9/10 hosts available: 1 Memory (...)").
    summary: Text = ""


class ScheduleDecision(Message):
    """The answer to a ScheduleRequest; also published as event `decision.<cluster>`."""

    request_id: UUID
    cluster_id: Id
    vm_id: Id
    status: DecisionStatus
    host_id: Id | None = None
    #: Next-best hosts, best first (the engine tries them if the start on host_id fails).
    alternates: list[Id] = Field(default_factory=list, max_length=50)
    #: One entry per VM of the request, in request order (the first is host_id/alternates).
    placements: list[Placement] = Field(default_factory=list, max_length=1001)
    policy: Name | None = None
    state_version: Int = Field(0, ge=0, le=MAX_INT)
    #: The lock acquisition this decision was made under (its pending record carries it).
    fencing_token: Int = Field(0, ge=0, le=MAX_INT)
    explanation: Explanation
    error: ErrorInfo | None = None
    #: True when the request was retried once after waiting for pending resources to change.
    retried: Bool = False
    decided_at: datetime
    #: Time from receiving the request to the decision, in milliseconds.
    elapsed_ms: Float = Field(0.0, ge=0)


class PendingEntry(Message):
    """Resources of a VM placed on a host but not yet reported running there."""

    vm_id: Id
    host_id: Id
    mem_mb: Int = Field(ge=0, le=1 << 40)
    vcpus: Int = Field(ge=0, le=1 << 20)
    cpus_pinned: Int = Field(0, ge=0, le=1 << 20)
    request_id: UUID
    fencing_token: Int = Field(ge=0, le=MAX_INT)
    #: Unix time after which the record no longer counts.
    expires_at: Float
