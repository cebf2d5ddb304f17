"""CSV workloads: one row per host, VM event, affinity group, policy line or setting.

`kind` says what a row is; a row fills the columns its kind uses and leaves the others empty
(docs/simulating.md lists them with an example). Lists (networks, affinity_groups, pinned_hosts, a
setting's load_curve) are separated by ";", labels are `key=value;key=value`. A policy is the rows
of kind `policy` with its name in `id`: `role` says what each adds (filter, weight, balance,
property, selector, description), `name` the unit or property, `factor` a weight's factor, `value`
a property's value, the description or the selector, `position` a filter's place (first, last).
The result is a raw workload, validated by the caller like a YAML one.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from vmsched.errors import InvalidRequest
from vmsched.simulation.workload import Workload

CSV_COLUMNS: tuple[str, ...] = (
    "kind",  # host | arrival | departure | failure | maintenance | group | policy | setting
    "id",  # the host's id (host, failure, maintenance), the VM's (arrival, departure), the group's,
    # the policy's name, a setting's name
    "at_s",  # arrival, departure, failure; maintenance: its start
    "end_s",  # maintenance: its end
    "count",
    "cpu_cores",
    "cpu_threads",
    "mem_mb",
    "reserved_mem_mb",
    "is_spm",
    "labels",  # host: key=value;key=value
    "vcpus",
    "ha",
    "cpu_usage_pct",
    "networks",
    "affinity_groups",
    "pinned_hosts",
    "lifetime_s",
    "repair_s",
    "positive",  # group: true keeps its VMs together, false apart
    "enforcing",  # group: true is a hard rule
    "role",  # policy: filter | weight | balance | property | selector | description
    "name",  # policy: the unit's name, or the property's
    "factor",  # policy: a weight's factor
    "position",  # policy: a filter's position (first, any, last)
    "value",  # setting; policy: a property's value, the selector, the description
)
#: Settings a CSV row may set: the workload's scalar fields, and these mappings' entries.
_SETTING_MAPS = frozenset({"cluster", "policy_properties", "policy_defaults"})
_FIELDS: dict[str, tuple[str, dict[str, str]]] = {
    # kind -> (the workload's list, column -> field)
    "host": (
        "hosts",
        {
            "id": "id",
            "count": "count",
            "cpu_cores": "cpu_cores",
            "cpu_threads": "cpu_threads",
            "mem_mb": "mem_mb",
            "reserved_mem_mb": "reserved_mem_mb",
            "is_spm": "is_spm",
            "labels": "labels",
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
    "group": ("affinity_groups", {"id": "id", "positive": "positive", "enforcing": "enforcing"}),
}
_LISTS = frozenset({"networks", "affinity_groups", "pinned_hosts"})
_ROLES = ("filter", "weight", "balance", "property", "selector", "description")
#: Fields filled by rows of their own kind (hosts, arrivals, policies, ...).
_SECTIONS = frozenset({section for section, _ in _FIELDS.values()} | {"policies"})


def csv_workload(text: str, source: str) -> dict[str, Any]:
    """The raw workload of a CSV file (validated by the caller like any other)."""
    reader = csv.DictReader(io.StringIO(text))
    unknown = sorted(set(reader.fieldnames or ()) - set(CSV_COLUMNS))
    if not reader.fieldnames or "kind" not in reader.fieldnames or unknown:
        raise InvalidRequest(
            f"{source}: a CSV workload needs a header with 'kind' and columns among {', '.join(CSV_COLUMNS)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    raw: dict[str, Any] = {"name": source.rsplit("/", 1)[-1]}
    policies: dict[str, dict[str, Any]] = {}
    for line, row in enumerate(reader, start=2):
        kind = (row.get("kind") or "").strip()
        where = f"{source}: line {line}"
        if kind == "setting":
            _setting(raw, _cell(row, "id"), _cell(row, "value"), where)
            continue
        if kind == "policy":
            _policy_row(policies, row, where)
            continue
        if kind not in _FIELDS:
            kinds = ", ".join([*_FIELDS, "policy", "setting"])
            raise InvalidRequest(f"{where}: kind {kind!r} is not one of {kinds}")
        section, fields = _FIELDS[kind]
        entry: dict[str, Any] = {}
        for column, field in fields.items():
            if value := _cell(row, column):
                entry[field] = _value(column, value, where)
        raw.setdefault(section, []).append(entry)
    if policies:
        raw["policies"] = list(policies.values())
    return raw


def _cell(row: dict[str, str | None], column: str) -> str:
    return (row.get(column) or "").strip()


def _value(column: str, value: str, where: str) -> Any:
    if column in _LISTS:
        return [v.strip() for v in value.split(";") if v.strip()]
    if column == "labels":
        labels: dict[str, str] = {}
        for pair in (p.strip() for p in value.split(";") if p.strip()):
            key, eq, val = pair.partition("=")
            if not eq or not key.strip():
                raise InvalidRequest(f"{where}: labels {value!r}: write them key=value;key=value")
            labels[key.strip()] = val.strip()
        return labels
    return value


def _policy_row(policies: dict[str, dict[str, Any]], row: dict[str, str | None], where: str) -> None:
    name, role, unit, value = _cell(row, "id"), _cell(row, "role"), _cell(row, "name"), _cell(row, "value")
    if not name:
        raise InvalidRequest(f"{where}: a policy row names its policy in 'id'")
    doc = policies.setdefault(name, {"name": name})
    if role not in _ROLES:
        raise InvalidRequest(f"{where}: policy role {role!r} is not one of {', '.join(_ROLES)}")
    if role in ("filter", "weight", "balance", "property") and not unit:
        raise InvalidRequest(
            f"{where}: a policy {role} row names its {'property' if role == 'property' else 'unit'} in 'name'"
        )
    if role == "filter":
        entry = {"unit": unit} | ({"position": p} if (p := _cell(row, "position")) else {})
        doc.setdefault("filters", []).append(entry)
    elif role == "weight":
        doc.setdefault("weights", []).append(
            {"unit": unit} | ({"factor": _number(f)} if (f := _cell(row, "factor")) else {})
        )
    elif role == "balance":
        doc["balance"] = unit
    elif role == "property":
        doc.setdefault("properties", {})[unit] = value
    else:  # selector, description
        doc[role] = value


def _number(text: str) -> Any:
    """A factor as the number it is (a policy document's factors are numbers, not text); else the text,
    for validation to refuse."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _setting(raw: dict[str, Any], name: str, value: str, where: str) -> None:
    top, _, key = name.partition(".")
    if key and top in _SETTING_MAPS:
        raw.setdefault(top, {})[key] = value
    elif not key and top in Workload.model_fields and top not in _SECTIONS | _SETTING_MAPS:
        raw[top] = [v.strip() for v in value.split(";") if v.strip()] if top == "load_curve" else value
    else:
        raise InvalidRequest(
            f"{where}: setting {name!r} is not a workload setting (a top-level field such as start_delay_s, "
            f"or {', '.join(sorted(_SETTING_MAPS))} with a dot and a key)"
        )


__all__ = ["CSV_COLUMNS", "csv_workload"]
