"""What a simulation replays: a cluster's hosts and what happens to it over time.

A workload is plain data, written by hand (YAML or JSON), by the generator, or shipped as a
built-in scenario. Times are seconds from the workload's start; the simulated clock is
`start` plus them, so units that judge time (CPU overload duration) see ordinary unix times.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from vmsched import bounded_text
from vmsched.contracts.base import Id
from vmsched.contracts.policies import PolicyDocument
from vmsched.errors import InvalidRequest
from vmsched.settings import Settings
from vmsched.simulation.workload_refs import MAX_HOSTS, References, host_names

#: Validation context key: the references were checked as the entries were read (workload_json).
REFERENCES_CHECKED = "references_checked"

#: Bumped when a field changes meaning; a file names the version it was written for.
WORKLOAD_VERSION = 1

#: The balancer service's defaults, so a workload balances as a default deployment does.
_SERVICE: dict[str, Any] = {
    n: f.default
    for n, f in Settings.model_fields.items()
    if n in ("balance_interval_s", "migration_cooldown_s", "migrations_per_cycle", "ha_interval_s")
}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HostSpec(_Model):
    """A host, or `count` identical ones named `id` and a number zero-padded to the width of the last
    (count 8: h1…h8; count 12: h01…h12); a later entry with the same `id` numbers on (h13…)."""

    id: Id = Field(
        description="The host's id; with count > 1 the prefix of its hosts' ids: `id` and a number zero-padded "
        "to the width of the last (id h, count 8: h1…h8; count 12: h01…h12); a later entry with the same id "
        "numbers on from the earlier one's last (h13…). Ids are unique across entries."
    )
    count: int = Field(1, ge=1, le=100_000, description="How many identical hosts this entry stands for.")
    cpu_cores: int = Field(ge=1, le=100_000, description="Physical CPU cores.")
    cpu_threads: int = Field(0, ge=0, le=200_000, description="Hardware threads (0: unknown).")
    mem_mb: int = Field(ge=1, le=1 << 40, description="Physical memory, MB.")
    reserved_mem_mb: int = Field(321, ge=0, le=1 << 40, description="Memory the host keeps for itself, MB.")
    networks: list[Id] = Field(default_factory=list, description="Networks the host is attached to.")
    labels: dict[str, str] = Field(default_factory=dict, description="Host labels (availability_zone, ...).")
    is_spm: bool = Field(False, description="oVirt's Storage Pool Manager (counts as busier).")
    idle_watts: float | None = Field(
        None, ge=0, le=100_000, description="Power drawn idle, W (default: by the host's size, see docs/simulating.md)."
    )
    max_watts: float | None = Field(
        None, ge=0, le=100_000, description="Power drawn at 100 % CPU, W (linear between; default: by size)."
    )

    def ids(self) -> list[str]:
        """This entry's ids alone (Workload.named_hosts numbers on across entries with the same id)."""
        return host_names(self.id, self.count)


class AffinityGroupSpec(_Model):
    """A VM-to-VM affinity group; its members are the arrivals that name it."""

    id: Id
    positive: bool = Field(description="True: keep the members together; False: keep them apart.")
    enforcing: bool = Field(False, description="True: a hard rule (a filter); False: soft (a weight).")


class VmArrival(_Model):
    """A VM asked for at `at_s`; it leaves after `lifetime_s` (never, when null) or at a departure."""

    at_s: float = Field(ge=0, description="When the VM is asked for, seconds from the start.")
    vm_id: Id
    mem_mb: int = Field(ge=1, le=1 << 34, description="The VM's memory, MB.")
    vcpus: int = Field(ge=1, le=4096)
    ha: bool = Field(False, description="Highly available.")
    cpu_usage_pct: float = Field(0.0, ge=0, le=100, description="The VM's CPU load once running, % of its vCPUs.")
    networks: list[Id] = Field(default_factory=list, description="Networks the VM needs.")
    affinity_groups: list[Id] = Field(default_factory=list, description="Ids of affinity groups it belongs to.")
    pinned_hosts: list[Id] = Field(
        default_factory=list, description="Hosts it may run on (PinToHost; a scenario's starting layout)."
    )
    lifetime_s: float | None = Field(None, gt=0, description="Seconds it runs before it leaves; null: it stays.")


class VmDeparture(_Model):
    at_s: float = Field(ge=0)
    vm_id: Id


class HostFailure(_Model):
    """The host goes down at `at_s` and its VMs are lost; it comes back (empty) after `repair_s`."""

    at_s: float = Field(ge=0)
    host_id: Id
    repair_s: float | None = Field(None, gt=0, description="Seconds until it is up again; null: never.")


class MaintenanceWindow(_Model):
    """The host takes no new VMs from `start_s` to `end_s`; its VMs are migrated away when it goes
    into maintenance (those no host takes stay, and are tried again every balancing interval)."""

    host_id: Id
    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> MaintenanceWindow:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s {self.end_s} is not after start_s {self.start_s}")
        return self


class ClusterSettings(_Model):
    memory_overcommit_pct: int = Field(100, ge=1, le=1000)
    count_threads_as_cores: bool = False
    ha_reservation: bool = Field(
        False,
        description="The cluster keeps room to restart any one host's HA VMs: the HA-reservation check runs "
        "every ha_interval_s, and the policy's units see HaReservation=true (as an attached cluster's do).",
    )
    vcpus_per_cpu: float | None = Field(
        None,
        gt=0,
        description="vCPUs a host CPU may carry in the packing bound; null: no limit (the CPU filter limits "
        "only one VM's vCPUs to the host's CPUs).",
    )


class Workload(_Model):
    """A datacenter to replay: hosts, VM arrivals and departures, host failures and maintenance."""

    version: int = Field(WORKLOAD_VERSION, ge=1, le=WORKLOAD_VERSION)
    name: str = Field("workload", min_length=1, max_length=200)
    description: str = ""
    start: datetime = Field(
        datetime(2026, 1, 5, tzinfo=UTC), description="The simulated clock's origin (ISO 8601 with an offset)."
    )
    duration_s: float | None = Field(None, gt=0, description="How long to simulate; null: until the last event.")
    sample_interval_s: float = Field(300.0, gt=0, description="How often the report samples the cluster.")
    balance_interval_s: float = Field(
        _SERVICE["balance_interval_s"], gt=0, description="How often the policy's balance unit runs (if it has one)."
    )
    migration_delay_s: float = Field(30.0, ge=0, description="How long a balancing migration takes to complete.")
    migration_cooldown_s: float = Field(
        _SERVICE["migration_cooldown_s"], ge=0, description="How long a migrated VM rests before it may move again."
    )
    migrations_per_cycle: int = Field(
        _SERVICE["migrations_per_cycle"], ge=0, le=100, description="Most migrations one balancing pass starts."
    )
    start_delay_s: float = Field(
        0.0,
        ge=0,
        le=86_400,
        description="How long a placed VM takes to start; meanwhile it is pending on its host (0: it runs at once).",
    )
    ha_interval_s: float = Field(
        _SERVICE["ha_interval_s"], gt=0, description="How often the HA-reservation check runs (with ha_reservation)."
    )
    power_actions: bool = Field(
        True,
        description="Carry out the balance unit's power advice (power saving's, with "
        "EnableAutomaticHostPowerManagement): a host powered off is down until powered on; false: count it only.",
    )
    power_on_delay_s: float = Field(
        300.0, ge=0, le=86_400, description="How long a host takes to boot once powered on."
    )
    load_curve: list[float] = Field(
        default_factory=list,
        max_length=24,
        description="Diurnal load: 24 factors, one per hour of the day (of the simulated clock, UTC), that "
        "scale every VM's cpu_usage_pct (capped at 100); empty: loads stay as given.",
    )
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    policy_properties: dict[str, str] = Field(
        default_factory=dict,
        description="Policy properties set over every simulated policy's own (a scenario's chosen thresholds).",
    )
    policy_defaults: dict[str, str] = Field(
        default_factory=dict,
        description="Policy properties for every simulated policy that does not set them itself (a generated "
        "workload's power management, say).",
    )
    policies: list[PolicyDocument] = Field(
        default_factory=list,
        max_length=20,
        description="Policies that come with the workload (`vmsched policy` documents), simulated when no "
        "--policy is given and nameable by --policy.",
    )
    hosts: list[HostSpec] = Field(min_length=1)
    affinity_groups: list[AffinityGroupSpec] = Field(default_factory=list)
    arrivals: list[VmArrival] = Field(default_factory=list)
    departures: list[VmDeparture] = Field(default_factory=list)
    failures: list[HostFailure] = Field(default_factory=list)
    maintenance: list[MaintenanceWindow] = Field(default_factory=list)

    @field_validator("load_curve")
    @classmethod
    def _a_day(cls, curve: list[float]) -> list[float]:
        if curve and len(curve) != 24:
            raise ValueError(f"has {len(curve)} factors, not 24 (one per hour of the day)")
        if any(not 0 <= f <= 100 for f in curve):
            raise ValueError("factors must be from 0 to 100")
        return curve

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Workload:
        if (info.context or {}).get(REFERENCES_CHECKED):
            return self  # the reader checked them entry by entry as it read them
        check_references(self)
        return self

    def named_hosts(self) -> list[tuple[HostSpec, list[str]]]:
        """Each host entry with its hosts' ids (numbered on across entries with the same id)."""
        refs = References()
        return [(spec, refs.host(f"hosts.{n}", spec.id, spec.count)) for n, spec in enumerate(self.hosts)]

    def host_ids(self) -> list[str]:
        return [h for _, ids in self.named_hosts() for h in ids]

    def end_s(self) -> float:
        """When the simulation stops: `duration_s`, or the last event."""
        if self.duration_s is not None:
            return self.duration_s
        times = [0.0]
        times += [a.at_s + (a.lifetime_s or 0.0) for a in self.arrivals]
        times += [d.at_s for d in self.departures]
        times += [f.at_s + (f.repair_s or 0.0) for f in self.failures]
        times += [m.end_s for m in self.maintenance]
        return max(times)


def workload_schema() -> dict[str, Any]:
    """The JSON Schema of a workload file (docs/workload.schema.json is this, written out)."""
    schema = Workload.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://vmsched.dev/schemas/workload.schema.json"
    return schema


def schema_text() -> str:
    return json.dumps(workload_schema(), indent=2, sort_keys=True) + "\n"


def check_references(workload: Workload) -> None:
    """ValueError naming the first id that repeats or reference to nothing (workload_refs)."""
    refs = References()
    for n, h in enumerate(workload.hosts):
        refs.host(f"hosts.{n}", h.id, h.count)
    refs.section_done("hosts")
    for n, g in enumerate(workload.affinity_groups):
        refs.group(f"affinity_groups.{n}", g.id)
    refs.section_done("affinity_groups")
    for n, a in enumerate(workload.arrivals):
        refs.arrival(f"arrivals.{n}", a.vm_id, a.pinned_hosts, a.affinity_groups)
    refs.section_done("arrivals")
    for n, d in enumerate(workload.departures):
        refs.departure(f"departures.{n}", d.vm_id)
    for n, f in enumerate(workload.failures):
        refs.host_event(f"failures.{n}", f.host_id)
    for n, m in enumerate(workload.maintenance):
        refs.host_event(f"maintenance.{n}", m.host_id)


def validation_problem(exc: ValidationError, source: str, where: str = "") -> InvalidRequest:
    """InvalidRequest listing a ValidationError's problems, each with its field's path under `where`."""
    lines = []
    for e in exc.errors()[:20]:
        path = ".".join(str(p) for p in (*([where] if where else []), *e["loc"])) or "the top level"
        lines.append(f"  {path}: {e['msg'].removeprefix('Value error, ')}")
    return InvalidRequest(f"{source}: {exc.error_count()} problem(s):\n" + "\n".join(lines))


def parse_workload(text: str, source: str = "workload") -> Workload:
    """A workload from YAML or JSON text (JSON, by name or by its first character, through the
    streaming reader workload_json; YAML through vmsched.bounded_text: without aliases, not nested
    deep), or CSV when `source` ends in .csv (workload_csv); InvalidRequest names `source`, and the
    line or field. The size of `text` is the caller's to bound."""
    # Imported here: the readers build this module's models.
    from vmsched.simulation.workload_csv import csv_workload  # noqa: PLC0415 - they import this module
    from vmsched.simulation.workload_json import read_json_workload, workload_of_raw  # noqa: PLC0415

    if source.lower().endswith(".csv"):
        raw: Any = csv_workload(text, source)
    elif bounded_text.format_of(source, text) == "json":
        return read_json_workload([text], source)
    else:
        raw = bounded_text.load_yaml(text, source)
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{source}: expected a mapping with 'hosts' and 'arrivals'")
    return workload_of_raw(raw, source)


def dump_workload(workload: Workload) -> str:
    """The workload as YAML (what `parse_workload` reads back to an equal workload)."""
    data = workload.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, width=120)


__all__ = [
    "MAX_HOSTS",
    "REFERENCES_CHECKED",
    "WORKLOAD_VERSION",
    "AffinityGroupSpec",
    "ClusterSettings",
    "HostFailure",
    "HostSpec",
    "MaintenanceWindow",
    "VmArrival",
    "VmDeparture",
    "Workload",
    "check_references",
    "dump_workload",
    "parse_workload",
    "schema_text",
    "validation_problem",
    "workload_schema",
]
