"""What a simulation replays: a cluster's hosts and what happens to it over time.

A workload is plain data, written by hand (YAML or JSON), by the generator, or shipped as a
built-in scenario. Times are seconds from the workload's start; the simulated clock is
`start` plus them, so units that judge time (CPU overload duration) see ordinary unix times.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vmsched.contracts.base import Id
from vmsched.contracts.policies import PolicyDocument
from vmsched.errors import InvalidRequest
from vmsched.settings import Settings

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
    """A host, or `count` identical ones named `id` + a zero-padded number (h001, h002, ...)."""

    id: Id = Field(description="The host's id (the prefix when count > 1).")
    count: int = Field(1, ge=1, le=100_000, description="How many identical hosts this entry stands for.")
    cpu_cores: int = Field(ge=1, le=100_000, description="Physical CPU cores.")
    cpu_threads: int = Field(0, ge=0, le=200_000, description="Hardware threads (0: unknown).")
    mem_mb: int = Field(ge=1, le=1 << 40, description="Physical memory, MB.")
    reserved_mem_mb: int = Field(321, ge=0, le=1 << 40, description="Memory the host keeps for itself, MB.")
    networks: list[Id] = Field(default_factory=list, description="Networks the host is attached to.")
    labels: dict[str, str] = Field(default_factory=dict, description="Host labels (availability_zone, ...).")
    is_spm: bool = Field(False, description="oVirt's Storage Pool Manager (counts as busier).")

    def ids(self) -> list[str]:
        if self.count == 1:
            return [self.id]
        width = len(str(self.count))
        return [f"{self.id}{n:0{width}d}" for n in range(1, self.count + 1)]


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
    def _consistent(self) -> Workload:
        host_ids = self.host_ids()
        known = set(host_ids)
        if len(known) != len(host_ids):
            raise ValueError("host ids repeat (after expanding counts)")
        vm_ids = [a.vm_id for a in self.arrivals]
        if len(set(vm_ids)) != len(vm_ids):
            raise ValueError("an arrival's vm_id repeats")
        for where, host in self._host_refs():
            if host not in known:
                raise ValueError(f"{where}: unknown host {host!r}")
        groups = {g.id for g in self.affinity_groups}
        for where, group in self._group_refs():
            if group not in groups:
                raise ValueError(f"{where}: unknown affinity group {group!r}")
        vms = set(vm_ids)
        for n, d in enumerate(self.departures):
            if d.vm_id not in vms:
                raise ValueError(f"departures.{n}: unknown VM {d.vm_id!r}")
        return self

    def _host_refs(self) -> Iterator[tuple[str, str]]:
        for n, f in enumerate(self.failures):
            yield f"failures.{n}", f.host_id
        for n, m in enumerate(self.maintenance):
            yield f"maintenance.{n}", m.host_id
        for n, a in enumerate(self.arrivals):
            for host in a.pinned_hosts:
                yield f"arrivals.{n}.pinned_hosts", host

    def _group_refs(self) -> Iterator[tuple[str, str]]:
        for n, a in enumerate(self.arrivals):
            for g in a.affinity_groups:
                yield f"arrivals.{n}.affinity_groups", g

    def host_ids(self) -> list[str]:
        return [h for spec in self.hosts for h in spec.ids()]

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


#: The columns of a CSV workload: one row per host, event or setting, `kind` saying which; a row
#: fills the columns its kind uses. Lists (networks, affinity_groups, pinned_hosts, a setting's
#: load_curve) are separated by ";". A setting row names a top-level field in `id`, or a nested one
#: with dots (cluster.ha_reservation, policy_properties.HighUtilization), and gives its `value`.
CSV_COLUMNS: tuple[str, ...] = (
    "kind",  # host | arrival | departure | failure | maintenance | setting
    "id",  # the host's id (host, failure, maintenance), the VM's (arrival, departure), a setting's name
    "at_s",  # arrival, departure, failure; maintenance: its start
    "end_s",  # maintenance: its end
    "count",
    "cpu_cores",
    "cpu_threads",
    "mem_mb",
    "vcpus",
    "ha",
    "cpu_usage_pct",
    "networks",
    "affinity_groups",
    "pinned_hosts",
    "lifetime_s",
    "repair_s",
    "value",  # setting
)
#: Settings a CSV row may set: the workload's scalar fields, and these mappings' entries.
_CSV_SETTING_MAPS = frozenset({"cluster", "policy_properties", "policy_defaults"})
_CSV_FIELDS: dict[str, tuple[str, dict[str, str]]] = {
    # kind -> (the workload's list, column -> field)
    "host": (
        "hosts",
        {
            "id": "id",
            "count": "count",
            "cpu_cores": "cpu_cores",
            "cpu_threads": "cpu_threads",
            "mem_mb": "mem_mb",
            "networks": "networks",
        },
    ),
    "arrival": (
        "arrivals",
        {
            "id": "vm_id",
            "at_s": "at_s",
            "mem_mb": "mem_mb",
            "vcpus": "vcpus",
            "ha": "ha",
            "cpu_usage_pct": "cpu_usage_pct",
            "networks": "networks",
            "affinity_groups": "affinity_groups",
            "pinned_hosts": "pinned_hosts",
            "lifetime_s": "lifetime_s",
        },
    ),
    "departure": ("departures", {"id": "vm_id", "at_s": "at_s"}),
    "failure": ("failures", {"id": "host_id", "at_s": "at_s", "repair_s": "repair_s"}),
    "maintenance": ("maintenance", {"id": "host_id", "at_s": "start_s", "end_s": "end_s"}),
}
_CSV_LISTS = frozenset({"networks", "affinity_groups", "pinned_hosts"})
#: Fields filled by rows of their own kind (hosts, arrivals, ...) or not expressible in CSV (policies).
_CSV_FIELDS_SECTIONS = frozenset({section for section, _ in _CSV_FIELDS.values()} | {"policies", "affinity_groups"})


def _csv_workload(text: str, source: str) -> dict[str, Any]:
    """The raw workload of a CSV file (validated by the caller like any other)."""
    reader = csv.DictReader(io.StringIO(text))
    unknown = sorted(set(reader.fieldnames or ()) - set(CSV_COLUMNS))
    if not reader.fieldnames or "kind" not in reader.fieldnames or unknown:
        raise InvalidRequest(
            f"{source}: a CSV workload needs a header with 'kind' and columns among {', '.join(CSV_COLUMNS)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    raw: dict[str, Any] = {"name": source.rsplit("/", 1)[-1]}
    for line, row in enumerate(reader, start=2):
        kind = (row.get("kind") or "").strip()
        if kind == "setting":
            _csv_setting(raw, (row.get("id") or "").strip(), (row.get("value") or "").strip(), f"{source}: line {line}")
            continue
        if kind not in _CSV_FIELDS:
            kinds = ", ".join([*_CSV_FIELDS, "setting"])
            raise InvalidRequest(f"{source}: line {line}: kind {kind!r} is not one of {kinds}")
        section, fields = _CSV_FIELDS[kind]
        entry: dict[str, Any] = {}
        for column, field in fields.items():
            value = (row.get(column) or "").strip()
            if value:
                entry[field] = [v.strip() for v in value.split(";") if v.strip()] if column in _CSV_LISTS else value
        raw.setdefault(section, []).append(entry)
    return raw


def _csv_setting(raw: dict[str, Any], name: str, value: str, where: str) -> None:
    top, _, key = name.partition(".")
    if key and top in _CSV_SETTING_MAPS:
        raw.setdefault(top, {})[key] = value
    elif not key and top in Workload.model_fields and top not in _CSV_FIELDS_SECTIONS | _CSV_SETTING_MAPS:
        raw[top] = [v.strip() for v in value.split(";") if v.strip()] if top == "load_curve" else value
    else:
        raise InvalidRequest(
            f"{where}: setting {name!r} is not a workload setting (a top-level field such as start_delay_s, "
            f"or {', '.join(sorted(_CSV_SETTING_MAPS))} with a dot and a key)"
        )


def parse_workload(text: str, source: str = "workload") -> Workload:
    """A workload from YAML or JSON text (JSON is YAML), or CSV when `source` ends in .csv
    (CSV_COLUMNS); InvalidRequest names `source`, and the line or field."""
    if source.lower().endswith(".csv"):
        raw: Any = _csv_workload(text, source)
    else:
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidRequest(f"{source}: not valid YAML or JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{source}: expected a mapping with 'hosts' and 'arrivals'")
    try:
        return Workload.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or 'the top level'}: {e['msg']}" for e in exc.errors()[:20]]
        raise InvalidRequest(f"{source}: {exc.error_count()} problem(s):\n" + "\n".join(lines)) from None


def dump_workload(workload: Workload) -> str:
    """The workload as YAML (what `parse_workload` reads back to an equal workload)."""
    data = workload.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, width=120)


__all__ = [
    "CSV_COLUMNS",
    "WORKLOAD_VERSION",
    "AffinityGroupSpec",
    "ClusterSettings",
    "HostFailure",
    "HostSpec",
    "MaintenanceWindow",
    "VmArrival",
    "VmDeparture",
    "Workload",
    "dump_workload",
    "parse_workload",
    "schema_text",
    "workload_schema",
]
