"""Generate `contracts/`: the AsyncAPI 3.0 document and one JSON Schema per message.

Everything is derived from the message models and vmsched.constants, so the documents cannot drift
from the code; `vmsched contracts --check` (and a test) fail when the committed files differ.
Operations are described from vmsched's side: it *receives* requests and reports, and *sends*
replies and decisions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from vmsched import constants as c
from vmsched.contracts.balance import (
    MigrationDecision,
    PowerAction,
)
from vmsched.contracts.base import Message
from vmsched.contracts.ha import HaAlert, HaCheckRequest, HaRecovered, HaReport
from vmsched.contracts.policies import (
    ApplyPolicies,
    ApplyReport,
    ClonePolicy,
    DetachCluster,
    PolicyHistory,
    PolicyListing,
    PolicyQuery,
    PolicyRef,
    RollbackPolicy,
    StoredPolicy,
    UnitListing,
    UnitQuery,
)
from vmsched.contracts.scheduling import ScheduleDecision, ScheduleRequest
from vmsched.contracts.state import ClusterRemoved, ClusterReport, ClusterState, HostRemoved, HostReport, VmReport
from vmsched.contracts.workers import (
    ErrorReply,
    FilterReply,
    FilterRequest,
    PlaceReply,
    PlaceRequest,
    PolicyChanged,
    StateRequest,
    WeighReply,
    WeighRequest,
)

#: (operation name, routing key, request model, reply model, who serves it, description)
RPCS: list[tuple[str, str, type[Message], type[Message], str, str]] = [
    (
        "schedule",
        c.RPC_SCHEDULE,
        ScheduleRequest,
        ScheduleDecision,
        "selector",
        "Where should this VM run? The engine's entry point.",
    ),
    (
        "place",
        c.RPC_PLACE,
        PlaceRequest,
        PlaceReply,
        "filter-worker",
        "Place a group of one cluster's schedule requests, in order: filter, weigh, select (selector to "
        "filter-worker; the default).",
    ),
    (
        "filter",
        c.RPC_FILTER,
        FilterRequest,
        FilterReply,
        "filter-worker",
        "Run a policy's filter chain over candidate hosts (selector to filter-worker).",
    ),
    (
        "weigh",
        c.RPC_WEIGH,
        WeighRequest,
        WeighReply,
        "weigher",
        "Raw weight of every unit for every host (selector to weigher).",
    ),
    (
        "state",
        c.RPC_STATE,
        StateRequest,
        ClusterState,
        "state-tracker",
        "A cluster's current state snapshot.",
    ),
    (
        "policyRead",
        c.RPC_POLICY_READ,
        PolicyQuery,
        PolicyListing,
        "policy-admin",
        "Stored policies and cluster attachments.",
    ),
    (
        "policyApply",
        c.RPC_POLICY_APPLY,
        ApplyPolicies,
        ApplyReport,
        "policy-admin",
        "Make stored policies and attachments match a set (validated whole; versioned; dry run).",
    ),
    ("policyClone", c.RPC_POLICY_CLONE, ClonePolicy, StoredPolicy, "policy-admin", "Copy a policy under a new name."),
    ("policyDelete", c.RPC_POLICY_DELETE, PolicyRef, ApplyReport, "policy-admin", "Delete an unused policy."),
    ("policyDetach", c.RPC_POLICY_DETACH, DetachCluster, ApplyReport, "policy-admin", "Back to the default policy."),
    ("policyHistory", c.RPC_POLICY_HISTORY, PolicyRef, PolicyHistory, "policy-admin", "A policy's stored versions."),
    (
        "policyRollback",
        c.RPC_POLICY_ROLLBACK,
        RollbackPolicy,
        ApplyReport,
        "policy-admin",
        "Store an earlier version of a policy again, as a new version.",
    ),
    ("unitsList", c.RPC_UNITS_LIST, UnitQuery, UnitListing, "policy-admin", "The units policies can name."),
    (
        "haCheck",
        c.RPC_HA_CHECK,
        HaCheckRequest,
        HaReport,
        "ha-monitor",
        "Run the HA reservation check for a cluster now.",
    ),
]

#: (channel name, address with {clusterId}, model, action from vmsched's side, description)
EVENTS: list[tuple[str, str, type[Message], str, str]] = [
    (
        "clusterReport",
        c.CLUSTER_REPORT_PREFIX + ".{clusterId}",
        ClusterReport,
        "receive",
        "The engine reports cluster settings.",
    ),
    (
        "hostReport",
        c.HOST_REPORT_PREFIX + ".{clusterId}",
        HostReport,
        "receive",
        "The engine reports a host's capacity, usage and status.",
    ),
    (
        "vmReport",
        c.VM_REPORT_PREFIX + ".{clusterId}",
        VmReport,
        "receive",
        "The engine reports a VM's placement and status; RUNNING/FAILED/DOWN clears its pending record.",
    ),
    (
        "hostRemoved",
        c.HOST_REMOVED_PREFIX + ".{clusterId}",
        HostRemoved,
        "receive",
        "Hosts taken out of the cluster for good; the state tracker drops them and the VMs counted on them.",
    ),
    (
        "clusterRemoved",
        c.CLUSTER_REMOVED_PREFIX + ".{clusterId}",
        ClusterRemoved,
        "receive",
        "A cluster taken out of vmsched; the state tracker deletes its state and pending resources.",
    ),
    (
        "decision",
        c.DECISION_PREFIX + ".{clusterId}",
        ScheduleDecision,
        "send",
        "Every schedule decision, as an event.",
    ),
    (
        "policyChanged",
        c.POLICY_CHANGED,
        PolicyChanged,
        "receive",
        "A policy changed; selectors drop cached copies.",
    ),
    (
        "migration",
        c.MIGRATION_PREFIX + ".{clusterId}",
        MigrationDecision,
        "send",
        "The balancer decided to migrate a VM; the engine carries it out and reports the VM's new state.",
    ),
    (
        "power",
        c.POWER_PREFIX + ".{clusterId}",
        PowerAction,
        "send",
        "Power saving decided to power a host on or off; vmsched never executes it.",
    ),
    (
        "haAlert",
        c.HA_ALERT_PREFIX + ".{clusterId}",
        HaAlert,
        "send",
        "The cluster failed the HA reservation check: these hosts' HA VMs could not restart elsewhere.",
    ),
    (
        "haRecovered",
        c.HA_RECOVERED_PREFIX + ".{clusterId}",
        HaRecovered,
        "send",
        "The cluster passes the HA reservation check again.",
    ),
]

ALL_MODELS: list[type[Message]] = sorted(
    {m for _, _, req, rep, _, _ in RPCS for m in (req, rep)} | {m for *_, m, _, _ in EVENTS} | {ErrorReply},
    key=lambda m: m.__name__,
)

_AMQP_HEADERS = {
    "type": "object",
    "description": "AMQP message properties used by vmsched: content_type application/json; "
    "`type` = the message name; RPC requests set correlation_id, reply_to and expiration.",
    "properties": {
        c.HEADER_ERROR: {
            "type": "integer",
            "description": "Present on an RPC reply whose body is an ErrorReply.",
        },
        "x-deadline-ms": {
            "type": "integer",
            "description": "RPC requests: unix time in milliseconds after which the call is abandoned.",
        },
    },
}


def message_schemas() -> dict[str, dict[str, Any]]:
    """One self-contained JSON Schema (draft 2020-12) per message model."""
    out: dict[str, dict[str, Any]] = {}
    for model in ALL_MODELS:
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://vmsched.dev/contracts/schemas/{model.__name__}.json"
        out[model.__name__] = schema
    return out


def asyncapi() -> dict[str, Any]:
    _, top = models_json_schema([(m, "validation") for m in ALL_MODELS], ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = dict(sorted(top.get("$defs", {}).items()))
    messages = {
        m.__name__: {
            "name": m.__name__,
            "title": m.__name__,
            "summary": (m.__doc__ or "").strip().splitlines()[0] if m.__doc__ else m.__name__,
            "contentType": "application/json",
            "headers": _AMQP_HEADERS,
            "payload": {"$ref": f"#/components/schemas/{m.__name__}"},
        }
        for m in ALL_MODELS
    }
    exchange = {
        "rpc": {"name": c.RPC_EXCHANGE, "type": "direct", "durable": True, "autoDelete": False, "vhost": "/"},
        "events": {
            "name": c.EVENTS_EXCHANGE,
            "type": "topic",
            "durable": True,
            "autoDelete": False,
            "vhost": "/",
        },
    }
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for name, key, req, rep, server, description in RPCS:
        channels[name] = {
            "address": key,
            "description": f"{description} Served by {server} from queue {c.RPC_QUEUES[key]}.",
            "messages": {req.__name__: {"$ref": f"#/components/messages/{req.__name__}"}},
            "bindings": {"amqp": {"is": "routingKey", "exchange": exchange["rpc"], "bindingVersion": "0.3.0"}},
        }
        channels[f"{name}Reply"] = {
            "address": None,
            "description": f"Reply to `{name}`, sent to the request's reply_to (RabbitMQ direct reply-to) "
            "with its correlation_id. The body is an ErrorReply when header x-vmsched-error is set.",
            "messages": {
                rep.__name__: {"$ref": f"#/components/messages/{rep.__name__}"},
                "ErrorReply": {"$ref": "#/components/messages/ErrorReply"},
            },
        }
        operations[name] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{name}"},
            "summary": description,
            "messages": [{"$ref": f"#/channels/{name}/messages/{req.__name__}"}],
            "reply": {
                "channel": {"$ref": f"#/channels/{name}Reply"},
                "address": {"location": "$message.header#/reply_to"},
                "messages": [
                    {"$ref": f"#/channels/{name}Reply/messages/{rep.__name__}"},
                    {"$ref": f"#/channels/{name}Reply/messages/ErrorReply"},
                ],
            },
        }
    for name, address, model, action, description in EVENTS:
        channel: dict[str, Any] = {
            "address": address,
            "description": description,
            "messages": {model.__name__: {"$ref": f"#/components/messages/{model.__name__}"}},
            "bindings": {"amqp": {"is": "routingKey", "exchange": exchange["events"], "bindingVersion": "0.3.0"}},
        }
        if "{clusterId}" in address:
            channel["parameters"] = {"clusterId": {"description": "The cluster's id; subscribe with * for all."}}
        channels[name] = channel
        operations[f"{action}{name[0].upper()}{name[1:]}"] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{name}"},
            "summary": description,
            "messages": [{"$ref": f"#/channels/{name}/messages/{model.__name__}"}],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "vmsched",
            "version": f"{c.SCHEMA_VERSION}.0.0",
            "description": "VM scheduling over RabbitMQ. Every message is JSON; every model has "
            f"schema_version {c.SCHEMA_VERSION}. Names shown are without the deployment's optional prefix. "
            f"Refused messages go to exchange {c.DEAD_LETTER_EXCHANGE} (queue {c.DEAD_LETTER_QUEUE}) "
            "with header "
            f"{c.HEADER_DLX_REASON}.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {"host": "127.0.0.1:5672", "protocol": "amqp", "protocolVersion": "0.9.1"},
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def render() -> dict[str, str]:
    """Relative path -> file content, for everything under contracts/."""
    files = {"asyncapi.json": _dump(asyncapi())}
    for name, schema in message_schemas().items():
        files[f"schemas/{name}.json"] = _dump(schema)
    return files


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def write(root: Path) -> list[str]:
    """Write contracts/ under `root`; return the files that changed."""
    changed = []
    for rel, content in render().items():
        path = root / rel
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed.append(rel)
    return changed


def check(root: Path) -> list[str]:
    """Files under `root` that differ from what the models generate (missing, stale or extra)."""
    expected = render()
    problems = [
        rel for rel, content in expected.items() if not (root / rel).exists() or (root / rel).read_text() != content
    ]
    if root.exists():
        present = {str(p.relative_to(root)) for p in root.rglob("*.json")}
        problems += sorted(present - set(expected))
    return problems
