"""What the contract covers: every RPC, every event, and the message models they carry.

The document's channels, operations and schemas are all drawn from these lists, so adding an RPC or
an event here is what puts it in contracts/.
"""

from __future__ import annotations

from typing import Any

from vmsched import constants as c
from vmsched.contracts.admin import (
    AuditListing,
    AuditQuery,
    Removal,
    RemoveCluster,
    RemoveHosts,
    RequeueDeadLetters,
    RequeueReport,
)
from vmsched.contracts.balance import (
    MigrationDecision,
    PowerAction,
)
from vmsched.contracts.base import Message
from vmsched.contracts.ha import HaAlert, HaCheckRequest, HaRecovered, HaReport
from vmsched.contracts.maintenance import MaintenancePlan
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
from vmsched.contracts.reads import (
    ClusterListing,
    ClusterQuery,
    DecisionListing,
    DecisionQuery,
    DecisionRef,
    WhatIfReply,
    WhatIfRequest,
)
from vmsched.contracts.resync import ResyncComplete, ResyncRequested
from vmsched.contracts.scheduling import ScheduleDecision, ScheduleRequest
from vmsched.contracts.state import (
    ClusterRemoved,
    ClusterReport,
    ClusterState,
    HostRemoved,
    HostReport,
    StateReports,
    VmReport,
)
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
        "clustersRemove",
        c.RPC_CLUSTERS_REMOVE,
        RemoveCluster,
        Removal,
        "policy-admin",
        "Take a cluster out (administrators only; audited): publishes ClusterRemoved.",
    ),
    (
        "hostsRemove",
        c.RPC_HOSTS_REMOVE,
        RemoveHosts,
        Removal,
        "policy-admin",
        "Take hosts out of a cluster (administrators only; audited): publishes HostRemoved.",
    ),
    (
        "deadLettersRequeue",
        c.RPC_DEAD_LETTERS_REQUEUE,
        RequeueDeadLetters,
        RequeueReport,
        "policy-admin",
        "Send dead letters again where they were first published (administrators only; audited).",
    ),
    ("auditRead", c.RPC_AUDIT, AuditQuery, AuditListing, "policy-admin", "The newest audit log rows."),
    (
        "haCheck",
        c.RPC_HA_CHECK,
        HaCheckRequest,
        HaReport,
        "ha-monitor",
        "Run the HA reservation check for a cluster now.",
    ),
    (
        "whatif",
        c.RPC_WHATIF,
        WhatIfRequest,
        WhatIfReply,
        "selector",
        "Where would this VM go now, and why, host by host? The schedule path under the cluster's, a stored or an "
        "inline policy, without the lock, a pending record, a stored decision or an event.",
    ),
    (
        "clustersList",
        c.RPC_CLUSTERS_LIST,
        ClusterQuery,
        ClusterListing,
        "state-tracker",
        "Every cluster with state: host and VM counts, state version, policy.",
    ),
    (
        "decisionsRecent",
        c.RPC_DECISIONS_RECENT,
        DecisionQuery,
        DecisionListing,
        "state-tracker",
        "A cluster's latest stored decisions, newest first.",
    ),
    (
        "decisionsGet",
        c.RPC_DECISIONS_GET,
        DecisionRef,
        ScheduleDecision,
        "state-tracker",
        "One stored decision by its request id, with its explanation (decision_not_found if none).",
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
        "stateReports",
        c.STATE_REPORTS_PREFIX + ".{clusterId}",
        StateReports,
        "receive",
        "The engine reports several of a cluster's hosts and VMs at once (up to 1,000): applied as the same "
        "reports one by one would be, hosts first, for less per report.",
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
        "resyncRequested",
        c.RESYNC_REQUESTED_PREFIX + ".{clusterId}",
        ResyncRequested,
        "send",
        "Redis forgot the cluster: vmsched asks the engine to report it in full (what that holds is in the "
        "message); until then its requests are answered state_resyncing. Repeated while the cluster waits.",
    ),
    (
        "resyncComplete",
        c.RESYNC_COMPLETE_PREFIX + ".{clusterId}",
        ResyncComplete,
        "receive",
        "The engine's full report is published (after the reports it counts): scheduling resumes once the "
        "state holds that many hosts and VMs.",
    ),
    (
        "decision",
        c.DECISION_PREFIX + ".{clusterId}",
        ScheduleDecision,
        "send",
        "Every schedule decision, as an event: one per stored (placed or unplaceable) decision, its AMQP "
        "message_id the request id, repeated only after a selector crash and then identical (drop repeats "
        "by message_id); an error or expired decision each time one is made, with a message_id of its own.",
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
        "maintenance",
        c.MAINTENANCE_PREFIX + ".{clusterId}",
        MaintenancePlan,
        "send",
        "A host was reported in maintenance: where each of its VMs goes, planned at once (all or nothing), in "
        "steps of at most max_concurrent migrations; each step's MigrationDecisions follow when the previous "
        "step's VMs are reported on their targets. A refused plan names the VMs that fit nowhere, and nothing moves.",
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


def message_schemas() -> dict[str, dict[str, Any]]:
    """One self-contained JSON Schema (draft 2020-12) per message model."""
    out: dict[str, dict[str, Any]] = {}
    for model in ALL_MODELS:
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://vmsched.dev/contracts/schemas/{model.__name__}.json"
        out[model.__name__] = schema
    return out
