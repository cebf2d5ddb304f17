"""A schedule request, the decision that answers it, and what explains the decision."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import AwareDatetime, Field, model_validator

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
    PropertyValue,
    Query,
    ShortValue,
    Text,
)

#: Hosts a cluster may have, with room: every host list (candidates, ranked hosts, filtered hosts)
#: is at most this long. vmsched is built for clusters of up to 10,000 hosts.
MAX_HOSTS = 100_000


class AffinityRule(Message):
    """How an affinity group's members are placed relative to each other (or to its hosts)."""

    positive: Bool = Field(description="True: keep together (VMs on one host / VM on these hosts); False: keep apart.")
    enforcing: Bool = Field(
        description="True: hard (a filter: never broken); False: soft (a weight: broken only when it must be)."
    )


class AffinityGroup(Message):
    """An oVirt affinity group (or a Nova server group) the VM belongs to, as the engine knows it."""

    group_id: Id = Field(description="The group's id.")
    vms: list[Id] = Field(
        default_factory=list,
        max_length=10_000,
        description="The group's VMs (ids; the VM being placed may be among them).",
    )
    vm_rule: AffinityRule | None = Field(None, description="The VM to VM rule, if the group has one.")
    hosts: list[Id] = Field(
        default_factory=list, max_length=10_000, description="The group's hosts (ids), for the VM to host rule."
    )
    host_rule: AffinityRule | None = Field(None, description="The VM to host rule, if the group has one.")
    priority: Float = Field(
        1.0,
        ge=0,
        le=1_000_000,
        description="Weight of a soft group (unitless): soft groups of higher priority weigh more when they would "
        "be broken.",
    )


class VmSpec(Message):
    """The VM to place, with everything the filters and weights look at (Nova: the RequestSpec)."""

    vm_id: Id = Field(description="The VM's id, unique within its cluster.")
    mem_mb: Int = Field(ge=1, le=1 << 34, description="The VM's memory, MB (MiB: 2^20 bytes).")
    overhead_mb: Int = Field(
        64,
        ge=0,
        le=1 << 20,
        description="Guest overhead added to the memory need, MB (oVirt computes ~64 MB + video RAM).",
    )
    vcpus: Int = Field(ge=1, le=4096, description="Virtual CPUs (count).")
    cpu_sockets: Int = Field(1, ge=1, le=1024, description="Virtual CPU sockets (count).")
    exclusive_cpus: Bool = Field(
        False,
        description="The vCPUs are pinned exclusively (dedicated CPU policy): each uses up a host CPU.",
    )
    cpu_usage_pct: Float = Field(
        0.0, ge=0, le=100, description="Expected CPU load of the VM, percent (0-100) of its vCPUs (0 for a new VM)."
    )
    networks: list[Id] = Field(
        default_factory=list, max_length=256, description="Networks the VM needs (ids); a host must have them all."
    )
    pinned_hosts: list[Id] = Field(
        default_factory=list, max_length=4096, description="Hosts the VM is pinned to (PinToHost); empty means any."
    )
    current_host: Id | None = Field(
        None,
        description="The host the VM runs on now; required for a migration (the Migration filter removes it).",
    )
    ha: Bool = Field(False, description="Highly available (the HA reservation keeps room to restart it).")
    use_swap: Bool = Field(
        True, description="May run on hosts with swap in use (the Memory filter then counts free swap)."
    )
    hugepages: Bool = Field(False, description="Backed by static huge pages: swap never counts toward its memory.")
    hugepage_size_kb: Int = Field(
        2048,
        ge=4,
        le=1 << 24,
        description="Huge page size, KiB, when `hugepages` (2048 or 1048576 on x86_64).",
    )
    cpu_cores_per_socket: Int = Field(1, ge=1, le=4096, description="Virtual cores per socket (count).")
    cpu_threads_per_core: Int = Field(1, ge=1, le=64, description="Virtual threads per core (count).")
    emulated_machine: str | None = Field(
        None,
        max_length=128,
        description="Machine type the VM needs (oVirt emulated machine, e.g. pc-q35-rhel9.2.0); null: any.",
    )
    cpu_model: str | None = Field(
        None, max_length=128, description="CPU model the VM needs (oVirt CPU level / Nova cpu_model); null: any."
    )
    disk_mb: Int = Field(0, ge=0, le=1 << 40, description="Local disk the VM needs on its host, MB.")
    affinity_groups: list[AffinityGroup] = Field(
        default_factory=list, max_length=256, description="Affinity groups (or server groups) the VM belongs to."
    )
    preferred_hosts: list[Id] = Field(
        default_factory=list, max_length=4096, description="Hosts to prefer when they fit (oVirt PreferredHosts)."
    )
    extra_specs: dict[Key, ShortValue] = Field(
        default_factory=dict,
        max_length=MAX_EXTRA_SPECS,
        description="Flavor extra specs (Nova ComputeCapabilities / aggregate extra specs), strings, e.g. "
        '{"hw:cpu_policy": "dedicated"}.',
    )
    image_properties: dict[Key, ImagePropertyValue] = Field(
        default_factory=dict,
        max_length=256,
        description="Image properties, strings: hw_architecture, img_hv_type, hw_vm_mode, "
        "img_hv_requested_version, ...",
    )
    tenant_id: Id | None = Field(None, description="The VM's tenant (project), for tenant-isolated host groups.")
    availability_zone: str | None = Field(
        None, max_length=255, description="The availability zone asked for (the hosts' label availability_zone)."
    )
    same_host: list[Id] = Field(
        default_factory=list,
        max_length=10_000,
        description="Scheduler hint: place on a host running one of these VMs (ids).",
    )
    different_host: list[Id] = Field(
        default_factory=list,
        max_length=10_000,
        description="Scheduler hint: place on none of the hosts running these VMs (ids).",
    )
    tried_hosts: list[Id] = Field(
        default_factory=list,
        max_length=10_000,
        description="Hosts already tried for this VM (a retry after a failed start): the Retry filter removes them.",
    )
    query: Query | None = Field(
        None,
        description='Nova JsonFilter query, a JSON list such as ["and", [">=", "$free_ram_mb", 1024], ...]; at '
        "most 16 levels deep, 256 nodes, strings of 255 characters (it is evaluated on every host).",
    )


class RequestKind(StrEnum):
    """`run`: place a VM that is not running; `migrate`: move a running VM (vm.current_host is its source)."""

    RUN = "run"
    MIGRATE = "migrate"


class ScheduleRequest(Message):
    """Where should this VM run? RPC `schedule`; the reply is a ScheduleDecision."""

    request_id: UUID = Field(
        description="Names the request: the same id asked again gets the same decision (idempotent), and the "
        "decision carries it.",
    )
    cluster_id: Id = Field(description="The cluster to place the VM in.")
    vm: VmSpec = Field(description="The VM to place.")
    kind: RequestKind = Field(RequestKind.RUN, description="Run a new VM, or migrate a running one.")
    whitelist: list[Id] | None = Field(
        None,
        max_length=MAX_HOSTS,
        description="Only these hosts are candidates (a migration's balance targets); null means every up host.",
    )
    blacklist: list[Id] = Field(
        default_factory=list,
        max_length=MAX_HOSTS,
        description="Never these hosts (already tried for this request: the Retry idea).",
    )
    max_alternates: Int = Field(
        3, ge=0, le=50, description="How many next-best hosts the decision lists as alternates (count)."
    )
    deadline: AwareDatetime | None = Field(
        None,
        description="A request still queued after this instant is not placed (status `expired`): ISO 8601 "
        "date-time with a UTC offset.",
    )
    priority: Int = Field(
        0,
        ge=-1000,
        le=1000,
        description="Among requests waiting for the same cluster, higher is decided first; waiting raises it by one "
        "per VMSCHED_PRIORITY_AGING_S seconds so no request starves; then earlier deadline, smaller VM, arrival.",
    )
    explain_scores: Bool = Field(
        False,
        description="Include the per-unit, per-host score table in the decision. Off unless asked: at 1,000 hosts "
        "and 19 weight units it is ~40,000 numbers, which cost more to send than the decision itself.",
    )
    explain_hosts: Bool = Field(
        False,
        description="Include every removed host with its filter and reason in a placed decision's explanation "
        "(an unplaceable decision always lists them).",
    )
    batch: list[VmSpec] = Field(
        default_factory=list,
        max_length=1000,
        description="More VMs placed together with `vm`, in order, all or none (oVirt batch start, Nova "
        "multi-instance): each is placed after the earlier ones virtually consumed their hosts.",
    )

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
    """`placed`: host_id has the VM; `unplaceable`: no host passed the filters (the explanation says
    why, per host); `expired`: the deadline passed first; `error`: the request could not be
    evaluated (unknown cluster, invalid policy, ...: see `error`)."""

    PLACED = "placed"
    #: No host passed the filters (the explanation says why, per host).
    UNPLACEABLE = "unplaceable"
    #: The deadline passed before the request could be placed.
    EXPIRED = "expired"
    #: The request could not be evaluated (unknown cluster, invalid policy, ...): see `error`.
    ERROR = "error"


class FilteredHost(Message):
    """A host a filter removed, and why."""

    host_id: Id = Field(description="The host removed.")
    filter: Name = Field(description="The filter that removed it.")
    reason: Text = Field(description='Why, with numbers: "free memory 487 MB < required 1088 MB".')


class UnitScores(Message):
    """One weight unit's column of the score table (aligned with ScoreTable.hosts)."""

    unit: Name = Field(description="The weight unit.")
    factor: Float = Field(description="The policy's factor for the unit (unitless multiplier).")
    raw: list[Float] = Field(
        max_length=MAX_HOSTS,
        description="The unit's raw weight per host, in the unit's own scale (oVirt units: lower is better; Nova "
        "weighers: higher is better).",
    )
    points: list[Float] = Field(
        max_length=MAX_HOSTS,
        description="What the selector made of each raw weight: rank points (RankSelector) or a normalized value.",
    )


class ScoreTable(Message):
    """The selection step, inspectable: hosts in final order, best first."""

    selector: Name = Field(description="The selector that ranked the hosts (e.g. RankSelector).")
    hosts: list[Id] = Field(max_length=MAX_HOSTS, description="The hosts, best first.")
    units: list[UnitScores] = Field(max_length=256, description="One column per weight unit.")
    totals: list[Float] = Field(
        max_length=MAX_HOSTS,
        description="Each host's total points (aligned with hosts); how they compare depends on the selector.",
    )


class ErrorInfo(Message):
    """Why a decision has status `error`."""

    code: Name = Field(description="A stable error code (asyncapi.json x-vmsched-error-codes lists them).")
    message: Text = Field(description="What went wrong, for people.")


class Explanation(Message):
    """Why a decision came out as it did."""

    summary: Text = Field(
        description='One line, e.g. "3/50 hosts available: 30 Memory (insufficient free memory), 17 Network '
        '(missing network)".'
    )
    candidates: Int = Field(ge=0, le=MAX_INT, description="Hosts the filters started from (count).")
    filters: list[Name] = Field(
        default_factory=list,
        max_length=256,
        description="The filter chain that ran, in order (a host removed by one is not seen by the next).",
    )
    filtered: list[FilteredHost] = Field(
        default_factory=list,
        max_length=MAX_HOSTS,
        description="The hosts removed, with their filter and reason (always for unplaceable; when asked otherwise).",
    )
    scores: ScoreTable | None = Field(None, description="The score table, when the request asked for it.")


class Placement(Message):
    """Where one VM of the request goes."""

    vm_id: Id = Field(description="The VM.")
    host_id: Id = Field(description="The host chosen for it.")
    alternates: list[Id] = Field(default_factory=list, max_length=50, description="Next-best hosts for it, best first.")
    summary: Text = Field(
        "", description='The aggregate line of this VM\'s filtering ("9/10 hosts available: 1 Memory (...)").'
    )


class ScheduleDecision(Message):
    """The answer to a ScheduleRequest; also published as event `decision.<cluster>`."""

    request_id: UUID = Field(description="The request answered.")
    cluster_id: Id = Field(description="The request's cluster.")
    vm_id: Id = Field(description="The request's VM (vm.vm_id).")
    status: DecisionStatus = Field(description="What came of the request.")
    host_id: Id | None = Field(None, description="Where the VM goes, when status is `placed`.")
    alternates: list[Id] = Field(
        default_factory=list,
        max_length=50,
        description="Next-best hosts, best first (the engine tries them if the start on host_id fails).",
    )
    placements: list[Placement] = Field(
        default_factory=list,
        max_length=1001,
        description="One entry per VM of the request, in request order (the first is host_id/alternates).",
    )
    policy: Name | None = Field(None, description="The cluster policy the decision was made with.")
    policy_version: Int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="The stored version of that policy the decision was made with (none when no policy was read: "
        "an error before one was).",
    )
    policy_properties: dict[Name, PropertyValue] = Field(
        default_factory=dict,
        max_length=256,
        description="The properties the policy's units ran with: the policy's own, with the cluster's overrides "
        "(`vmsched policy attach --set`) merged over them.",
    )
    state_version: Int = Field(0, ge=0, le=MAX_INT, description="The cluster state version the decision was made at.")
    fencing_token: Int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="The lock acquisition this decision was made under (its pending record carries it).",
    )
    explanation: Explanation = Field(description="Why the decision came out as it did.")
    error: ErrorInfo | None = Field(None, description="Why the request could not be evaluated (status `error`).")
    retried: Bool = Field(
        False, description="The request was retried once after waiting for pending resources to change."
    )
    decided_at: datetime = Field(description="When the decision was made: ISO 8601 date-time, UTC.")
    elapsed_ms: Float = Field(0.0, ge=0, description="From receiving the request to the decision, milliseconds.")


class PendingEntry(Message):
    """Resources of a VM placed on a host but not yet reported running there."""

    vm_id: Id = Field(description="The VM placed.")
    host_id: Id = Field(description="The host it was placed on.")
    mem_mb: Int = Field(ge=0, le=1 << 40, description="Memory it holds on the host (memory + overhead), MB.")
    vcpus: Int = Field(ge=0, le=1 << 20, description="vCPUs it holds on the host (count).")
    cpus_pinned: Int = Field(0, ge=0, le=1 << 20, description="Host CPUs it pins exclusively (count).")
    request_id: UUID = Field(description="The schedule request that placed it.")
    fencing_token: Int = Field(ge=0, le=MAX_INT, description="The lock acquisition the placement was made under.")
    expires_at: Float = Field(description="When the record stops counting, unix seconds.")
