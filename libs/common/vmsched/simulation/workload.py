"""What a simulation replays: a cluster's hosts and what happens to it over time.

A workload is plain data, written by hand (YAML or JSON), by the generator, or shipped as a
built-in scenario. Times are seconds from the workload's start; the simulated clock is
`start` plus them, so units that judge time (CPU overload duration) see ordinary unix times.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vmsched import bounded_text
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
    idle_watts: float | None = Field(
        None, ge=0, le=100_000, description="Power drawn idle, W (default: by the host's size, see docs/simulating.md)."
    )
    max_watts: float | None = Field(
        None, ge=0, le=100_000, description="Power drawn at 100 % CPU, W (linear between; default: by size)."
    )

    def ids(self) -> list[str]:
        return _host_ids(self.id, self.count)


def _host_ids(prefix: str, count: int) -> list[str]:
    if count == 1:
        return [prefix]
    width = len(str(count))
    return [f"{prefix}{n:0{width}d}" for n in range(1, count + 1)]


#: Hosts a workload may have, counts expanded (the simulator's target is 10,000): a few KB of
#: `count: 100000` entries must not become millions of host ids.
MAX_HOSTS = 100_000


def _reference_problem(
    hosts: Sequence[tuple[str, int]],
    groups: Sequence[str],
    arrivals: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    departures: Sequence[str],
    failures: Sequence[str],
    maintenance: Sequence[str],
) -> str | None:
    """What is wrong with a workload's ids and the references between them, and where, or None: a
    host id or vm_id that repeats, or names no host, VM or affinity group (arrivals: vm_id, pinned
    hosts, affinity groups). Plain values, so that a raw workload is checked before it is validated."""
    if sum(count for _, count in hosts) > MAX_HOSTS:
        return f"hosts: more than {MAX_HOSTS:,} hosts (counts expanded); a workload has at most {MAX_HOSTS:,}"
    known: set[str] = set()
    for n, (prefix, count) in enumerate(hosts):
        for host in _host_ids(prefix, count):
            if host in known:
                return f"hosts.{n}: host id {host!r} repeats (after expanding counts)"
            known.add(host)
    for name, refs in (("failures", failures), ("maintenance", maintenance)):
        for n, host in enumerate(refs):
            if host not in known:
                return f"{name}.{n}: unknown host {host!r}"
    return _arrival_problem(known, set(groups), arrivals, departures)


def _arrival_problem(
    hosts: set[str],
    groups: set[str],
    arrivals: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    departures: Sequence[str],
) -> str | None:
    vms: set[str] = set()
    for n, (vm, pinned, in_groups) in enumerate(arrivals):
        if vm in vms:
            return f"arrivals.{n}: vm_id {vm!r} repeats"
        vms.add(vm)
        if unknown := [h for h in pinned if h not in hosts]:
            return f"arrivals.{n}.pinned_hosts: unknown host {unknown[0]!r}"
        if unknown := [g for g in in_groups if g not in groups]:
            return f"arrivals.{n}.affinity_groups: unknown affinity group {unknown[0]!r}"
    for n, vm in enumerate(departures):
        if vm not in vms:
            return f"departures.{n}: unknown VM {vm!r}"
    return None


def _early_reference_problem(raw: dict[str, Any]) -> str | None:
    """_reference_problem of a raw workload (parsed, not validated), or None, also when it is not
    well-formed enough to tell (validation then says what is wrong). Validating 450,000 arrivals
    takes seconds and hundreds of MB; this pass, a fraction of a second, so that one bad reference
    deep in a big file is said at once."""

    def entries(key: str) -> list[dict[str, Any]]:
        value = raw.get(key) or []
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise TypeError(key)
        return value

    def ids(values: Any) -> list[str]:
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise TypeError(values)
        return values

    try:
        hosts = [(str(h["id"]), int(h.get("count", 1))) for h in entries("hosts")]
        if any(count < 1 for _, count in hosts):
            return None
        return _reference_problem(
            hosts,
            [str(g["id"]) for g in entries("affinity_groups")],
            [
                (str(a["vm_id"]), ids(a.get("pinned_hosts") or []), ids(a.get("affinity_groups") or []))
                for a in entries("arrivals")
            ],
            [str(d["vm_id"]) for d in entries("departures")],
            [str(f["host_id"]) for f in entries("failures")],
            [str(m["host_id"]) for m in entries("maintenance")],
        )
    except (KeyError, TypeError, ValueError):
        return None


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
        problem = _reference_problem(
            [(h.id, h.count) for h in self.hosts],
            [g.id for g in self.affinity_groups],
            [(a.vm_id, a.pinned_hosts, a.affinity_groups) for a in self.arrivals],
            [d.vm_id for d in self.departures],
            [f.host_id for f in self.failures],
            [m.host_id for m in self.maintenance],
        )
        if problem is not None:
            raise ValueError(problem)
        return self

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
    """A workload from YAML or JSON text (vmsched.bounded_text: JSON as JSON, YAML without aliases,
    neither nested deep), or CSV when `source` ends in .csv (CSV_COLUMNS); InvalidRequest names
    `source`, and the line or field. The size of `text` is the caller's to bound."""
    if source.lower().endswith(".csv"):
        raw: Any = _csv_workload(text, source)
    else:
        raw = bounded_text.load(text, source)
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{source}: expected a mapping with 'hosts' and 'arrivals'")
    problem = _early_reference_problem(raw)
    if problem is not None:
        raise InvalidRequest(f"{source}: {problem}")
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
