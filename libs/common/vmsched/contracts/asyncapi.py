"""Generate `contracts/`: the AsyncAPI 3.0 document and one JSON Schema per message.

Everything is derived from the message models and vmsched.constants, so the documents cannot drift
from the code; `vmsched contracts --check` (and a test) fail when the committed files differ.
Operations are described from vmsched's side: it *receives* requests and reports, and *sends*
replies and decisions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from vmsched import constants as c
from vmsched import errors
from vmsched.bus.amqp import DLQ_MAX_LENGTH, REPLY_TO
from vmsched.bus.codec import CONTENT_TYPE
from vmsched.bus.dispatch import HEADER_ATTEMPTS, HEADER_DEADLINE, HEADER_ORIGINAL_SIZE, HEADER_TRUNCATED
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
from vmsched.contracts.state import ClusterReport, ClusterState, HostReport, VmReport
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
from vmsched.settings import Settings

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


def message_schemas() -> dict[str, dict[str, Any]]:
    """One self-contained JSON Schema (draft 2020-12) per message model."""
    out: dict[str, dict[str, Any]] = {}
    for model in ALL_MODELS:
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://vmsched.dev/contracts/schemas/{model.__name__}.json"
        out[model.__name__] = schema
    return out


#: What the AMQP binding objects of this document follow.
_BINDING = "0.3.0"
#: The RabbitMQ virtual host the names below live in.
_VHOST = "/"

INTERNAL_MEANING = (
    "an unexpected error in the service: the message carries only a reference id, which names the full "
    "error in that service's log"
)


# ---------------------------------------------------------------------------------------------- error codes
def _subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
    out: list[type[BaseException]] = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


_TREE_ENTRY = re.compile(r"^[\s│]*[├└]── (\w+)(?:\s+(.*))?$")
_TREE_MORE = re.compile(r"^[\s│]+(\S.*)$")
#: The tree notes which exceptions are also a builtin one; that is Python's business, not the wire's.
_PYTHON_NOTE = re.compile(r"\s*\(also an? \w+\)")


def _tree_meanings(doc: str) -> dict[str, str]:
    """Class name -> its one-line meaning, from the exception tree drawn in vmsched.errors' docstring."""
    meanings: dict[str, str] = {}
    last: str | None = None
    for line in doc.splitlines():
        if (entry := _TREE_ENTRY.match(line)) is not None:
            last = entry.group(1)
            meanings[last] = (entry.group(2) or "").strip()
        elif last is not None and "──" not in line and (more := _TREE_MORE.match(line)) is not None:
            meanings[last] = f"{meanings[last]} {more.group(1).strip()}".strip()
        elif not line.strip():
            last = None
    return meanings


def error_codes() -> dict[str, str]:
    """Every `code` an ErrorReply (or a decision's ErrorInfo) can carry, with what it means.

    Read from vmsched.errors: each exception's `code`, and its line in the module's exception tree
    (or its docstring), so a new exception is documented by adding it there.
    """
    tree = _tree_meanings(errors.__doc__ or "")
    codes = {"internal": INTERNAL_MEANING}
    for cls in _subclasses(errors.VmschedError):
        if cls.__module__ != errors.__name__:
            continue  # vmsched raises only the tree's own (a subclass elsewhere is a test's or a tool's)
        code = cls.__dict__.get("code")
        if not isinstance(code, str) or code in codes:
            continue  # a subclass that keeps its parent's code (PropertyTooLong is an invalid_property)
        doc = (cls.__doc__ or "").strip().splitlines()
        codes[code] = _PYTHON_NOTE.sub("", tree.get(cls.__name__) or (doc[0] if doc else ""))
    return dict(sorted(codes.items()))


# ---------------------------------------------------------------------------------------------- wire rules
def _header(type_: str, description: str, set_by: str = "vmsched") -> dict[str, Any]:
    """One header's schema; `x-vmsched-set-by` says who sets it: the message's publisher, or vmsched only."""
    return {"type": type_, "description": description, "x-vmsched-set-by": set_by}


_ATTEMPTS = _header(
    "integer",
    "Set by vmsched on the copy of a message it puts back on its queue after a transient failure (a "
    "dependency such as Redis was away): how many attempts failed so far. Publishers never set it.",
)
_ORIGINAL_KEY = _header(
    "string",
    "Set by vmsched on a retry copy (whose own routing key is then the queue's name) and on a dead letter: "
    "the routing key the message was first published with.",
)

#: The application headers (the AMQP `headers` table) of each kind of message, by message trait.
_TRAITS: dict[str, dict[str, Any]] = {
    "rpcRequest": {
        "summary": "An RPC request.",
        "description": "Publish on the RPC exchange with the route as routing key, `mandatory` set (a request "
        "no service's queue is bound for comes back as basic.return: no service serves the route), and these "
        f"properties: content_type {CONTENT_TYPE}; type = the request's message name; reply_to = {REPLY_TO} "
        "(RabbitMQ direct reply-to: consume it in no-ack mode on the same channel *before* publishing, or the "
        "broker refuses the request by closing the channel); correlation_id = a unique id the reply carries "
        "back; expiration = the call's timeout in milliseconds (the broker drops a request no service took in "
        f"time into the dead-letter exchange); delivery_mode 1. Header {HEADER_DEADLINE} makes a service that "
        "takes the request late drop it unanswered. Requests are strict: an unknown field, a wrong type or a "
        "value out of bounds is answered with ErrorReply code invalid_request (with `location`).",
        "headers": {
            "type": "object",
            "properties": {
                HEADER_DEADLINE: _header(
                    "integer",
                    "Unix time in integer milliseconds after which the caller no longer waits: a service that "
                    "takes the request later dead-letters it unanswered. Optional; an integer, never a float "
                    "(AMQP tables may carry floats as 32-bit).",
                    set_by="publisher",
                ),
                HEADER_ATTEMPTS: _ATTEMPTS,
                c.HEADER_DLX_ROUTING_KEY: _ORIGINAL_KEY,
            },
        },
        "correlationId": {
            "location": "$message.header#/correlation_id",
            "description": "The AMQP correlation_id property: chosen by the caller, unique per call.",
        },
        "bindings": {"amqp": {"bindingVersion": _BINDING}},
        "x-vmsched-amqp-properties": {
            "content_type": CONTENT_TYPE,
            "type": "required: the request's message name (bindings.amqp.messageType)",
            "reply_to": REPLY_TO,
            "correlation_id": "required: unique per call, chosen by the caller",
            "expiration": "optional: the call's timeout, milliseconds",
            "delivery_mode": 1,
        },
    },
    "rpcReply": {
        "summary": "An RPC reply.",
        "description": "Sent by the serving service through the default exchange to the request's reply_to, "
        "with the request's correlation_id, content_type "
        f"{CONTENT_TYPE}, type = the reply's message name (ErrorReply for a failure) and delivery_mode 1. "
        f"Header {c.HEADER_ERROR} marks a failure: the body is then an ErrorReply, whatever the operation's "
        "reply model. A request that cannot be decoded is answered with an ErrorReply (and dead-lettered).",
        "headers": {
            "type": "object",
            "properties": {
                c.HEADER_ERROR: _header(
                    "integer",
                    "1 on a reply whose body is an ErrorReply (see x-vmsched-error-codes); absent otherwise.",
                ),
            },
        },
        "correlationId": {
            "location": "$message.header#/correlation_id",
            "description": "The request's correlation_id, copied.",
        },
        "bindings": {"amqp": {"bindingVersion": _BINDING}},
        "x-vmsched-amqp-properties": {
            "content_type": CONTENT_TYPE,
            "type": "the reply's message name: the operation's reply model, or ErrorReply",
            "correlation_id": "the request's",
            "delivery_mode": 1,
        },
    },
    "event": {
        "summary": "An event.",
        "description": "Publish on the events exchange with the channel's routing key, content_type "
        f"{CONTENT_TYPE}, type = the message name (required: a queue taking several kinds, such as the state "
        "tracker's, picks the model by it; an event without it, or with a type that queue does not take, is "
        "dead-lettered, and the publisher hears nothing: events have no reply) and delivery_mode 2 "
        "(persistent). A routing key ending in a cluster id must name the cluster the body names "
        "(x-vmsched-cluster-keyed): one that names another is dead-lettered with both in the reason.",
        "headers": {
            "type": "object",
            "properties": {HEADER_ATTEMPTS: _ATTEMPTS, c.HEADER_DLX_ROUTING_KEY: _ORIGINAL_KEY},
        },
        "bindings": {"amqp": {"bindingVersion": _BINDING}},
        "x-vmsched-amqp-properties": {
            "content_type": CONTENT_TYPE,
            "type": "required: the message name (bindings.amqp.messageType)",
            "delivery_mode": 2,
        },
    },
}

_DEAD_LETTER_HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "A dead letter keeps the refused message's properties (type, correlation_id, content_type) "
    "and headers, except the deadline, plus these. A message rejected by the broker instead (expired, or "
    "refused when even the dead-letter copy could not be published) carries RabbitMQ's own x-death header.",
    "properties": {
        c.HEADER_DLX_REASON: _header("string", "Why the message was refused, for people (at most 2000 characters)."),
        c.HEADER_DLX_SERVICE: _header("string", "The service that refused it (selector, state-tracker, ...)."),
        c.HEADER_DLX_ROUTING_KEY: _header("string", "The routing key the message was published with."),
        HEADER_ORIGINAL_SIZE: _header(
            "integer",
            "Present when the body was cut to VMSCHED_DEAD_LETTER_MAX_BODY_BYTES: its size before, in bytes.",
        ),
        HEADER_TRUNCATED: _header("boolean", "True when the body was cut (see the original size)."),
    },
}


def _setting_default(name: str) -> Any:
    """A setting's default, never the environment's value: the document must not depend on where it is built."""
    return Settings.model_fields[name].default


def _exchanges() -> dict[str, dict[str, Any]]:
    declared = "every vmsched process, on connecting (AmqpBus.start)"
    return {
        "rpc": {
            "name": c.RPC_EXCHANGE,
            "type": "direct",
            "durable": True,
            "autoDelete": False,
            "vhost": _VHOST,
            "declaredBy": declared,
            "carries": "RPC requests; the routing key is the route (the operation's channel address).",
        },
        "events": {
            "name": c.EVENTS_EXCHANGE,
            "type": "topic",
            "durable": True,
            "autoDelete": False,
            "vhost": _VHOST,
            "declaredBy": declared,
            "carries": "Events, in and out; routing keys are the event channels' addresses.",
        },
        "deadLetter": {
            "name": c.DEAD_LETTER_EXCHANGE,
            "type": "topic",
            "durable": True,
            "autoDelete": False,
            "vhost": _VHOST,
            "declaredBy": declared,
            "carries": "Every message a vmsched service refused (x-vmsched-dead-letters).",
        },
    }


def _binding_exchange(exchange: dict[str, Any]) -> dict[str, Any]:
    """An exchange as the AMQP channel binding describes it (that object takes its own fields only)."""
    return {k: exchange[k] for k in ("name", "type", "durable", "autoDelete", "vhost")}


def _queues() -> list[dict[str, Any]]:
    """Every queue vmsched names: who declares it, with which arguments, bound how."""
    dlx_argument = {"x-dead-letter-exchange": c.DEAD_LETTER_EXCHANGE}
    queues: list[dict[str, Any]] = []
    served = {key: server for _, key, _, _, server, _ in RPCS}
    for route, name in c.RPC_QUEUES.items():
        server = served.get(route, "its service")
        queues.append(
            {
                "name": name,
                "durable": True,
                "exclusive": False,
                "autoDelete": False,
                "arguments": dlx_argument,
                "bindings": [{"exchange": c.RPC_EXCHANGE, "routingKey": route}],
                "declaredBy": f"{server}, when it starts serving `{route}`",
                "consumedBy": f"every {server} process (competing consumers)",
                "description": f"Requests for route `{route}`. Until a {server} has started once, a request "
                "for the route is unroutable (returned to a publisher that set `mandatory`).",
            }
        )
    queues.append(
        {
            "name": c.STATE_EVENTS_QUEUE,
            "durable": True,
            "exclusive": False,
            "autoDelete": False,
            "arguments": dlx_argument,
            "bindings": [{"exchange": c.EVENTS_EXCHANGE, "routingKey": c.STATE_EVENTS_BINDING}],
            "declaredBy": "state-tracker, when it starts",
            "consumedBy": "every state-tracker process, in order",
            "description": "Every engine state report (ClusterReport, HostReport, VmReport). Reports wait here "
            "while no state tracker runs; before one has started once, reports are unroutable and lost "
            "(an engine can declare the queue passively to see it exists).",
        }
    )
    queues.append(
        {
            "name": c.DEAD_LETTER_QUEUE,
            "durable": True,
            "exclusive": False,
            "autoDelete": False,
            "arguments": {
                "x-max-length": DLQ_MAX_LENGTH,
                "x-max-length-bytes": _setting_default("dead_letter_queue_max_bytes"),
                "x-overflow": "drop-head",
            },
            "x-vmsched-arguments-from": {"x-max-length-bytes": "VMSCHED_DEAD_LETTER_QUEUE_MAX_BYTES"},
            "bindings": [{"exchange": c.DEAD_LETTER_EXCHANGE, "routingKey": "#"}],
            "declaredBy": "every vmsched process, on connecting (an existing one with other arguments is used as "
            "it is)",
            "consumedBy": "nobody: operators read it (`vmsched dead-letters`); the oldest are dropped first",
            "description": "Every refused message, with the reason in its headers (x-vmsched-dead-letters).",
        }
    )
    return queues


def _names() -> dict[str, Any]:
    exchanges = [c.RPC_EXCHANGE, c.EVENTS_EXCHANGE, c.DEAD_LETTER_EXCHANGE]
    queues = [*c.RPC_QUEUES.values(), c.STATE_EVENTS_QUEUE, c.DEAD_LETTER_QUEUE]
    return {
        "description": "Every exchange and queue name in this document is shown without the deployment's "
        "prefix. The prefix is the setting VMSCHED_AMQP_PREFIX (default empty; tests use one per run) and "
        "is put in front of each exchange name and each vmsched queue name as it is, with no separator "
        "added (prefix `t1.` makes vmsched.rpc t1.vmsched.rpc), and in front of the x-dead-letter-exchange "
        "argument of vmsched's queues. It is never applied to routing keys (RPC routes, event keys, "
        "bindings), to message type names, to header names, to the direct reply-to pseudo-queue "
        f"{REPLY_TO} or to server-named queues. An engine uses the same prefix as the services it talks to.",
        "setting": "VMSCHED_AMQP_PREFIX",
        "default": _setting_default("amqp_prefix"),
        "separator": "",
        "prefixedExchanges": exchanges,
        "prefixedQueues": queues,
        "notPrefixed": [
            "routing keys and binding patterns",
            "message type names (the AMQP type property)",
            "header names",
            REPLY_TO,
            "server-named queues (a subscriber's own)",
        ],
    }


def _engine() -> dict[str, Any]:
    return {
        "description": "What an engine (the program vmsched schedules for) must do, and must not.",
        "declares": [
            "Nothing vmsched owns but, at most, the three exchanges of x-vmsched-exchanges, with exactly the "
            "parameters given (durable, not auto-delete; or passively): every vmsched process declares them too.",
            "Its own server-named, exclusive queue for the events it follows, bound on the events exchange with "
            "the event channels' addresses ({clusterId} or * for every cluster).",
        ],
        "mustNot": [
            "Declare vmsched's named queues (x-vmsched-queues): a declaration with other arguments is refused "
            "(PRECONDITION_FAILED closes the channel), and a queue declared first without vmsched's "
            "arguments keeps the services from starting.",
            "Publish on the dead-letter exchange.",
        ],
        "reports": "Publish ClusterReport, HostReport and VmReport as events (message trait `event`) on "
        "state.cluster.<cluster>, state.host.<cluster> and state.vm.<cluster>. The state tracker applies them "
        "in the order published; the `state` RPC shows what it has.",
        "calls": "Call `schedule` (and `state`, `ha-check`) as RPCs (message trait `rpcRequest`); the reply "
        "(message trait `rpcReply`) is the operation's reply model, or an ErrorReply when the reply carries "
        f"header {c.HEADER_ERROR}. A ScheduleDecision with status `error` is an answer too, its `error` says why.",
        "follows": "Decisions (decision.<cluster>), migrations, power advice and HA alerts are events it may "
        "subscribe to.",
        "limits": {
            "maxMessageBytes": _setting_default("max_message_bytes"),
            "maxMessageBytesSetting": "VMSCHED_MAX_MESSAGE_BYTES",
            "description": "A message body larger than this is refused (RPC: invalid_request; event: dead letter).",
        },
        "unknownFields": "Events an engine publishes (ClusterReport, HostReport, VmReport: schemas with "
        "additionalProperties true) may carry fields this version does not know: they are ignored, and "
        "logged once per message type and field by each service. Every other message, RPC requests "
        "included, refuses unknown fields.",
    }


def _dead_letters() -> dict[str, Any]:
    return {
        "exchange": c.DEAD_LETTER_EXCHANGE,
        "queue": c.DEAD_LETTER_QUEUE,
        "description": "A service never drops a message it cannot process: it publishes a copy on the "
        "dead-letter exchange (routing key: the name of the queue it came from, prefixed), waits for the "
        "broker's confirm, then acks the original. What lands there: an undecodable or invalid message "
        "(bad JSON, wrong fields, over the size limit; an RPC request's caller also gets an ErrorReply); an "
        "event without a `type`, or of a type its queue does not take; an event whose routing key and body "
        "name different clusters; a message whose handler failed; one that failed transiently "
        f"(VMSCHED_TRANSIENT_ATTEMPTS times, default {_setting_default('transient_attempts')}); an RPC request "
        "that arrived after its deadline; and, through the queues' x-dead-letter-exchange argument, a "
        "request that expired in its queue and a message that could not be settled otherwise.",
        "headers": _DEAD_LETTER_HEADERS,
    }


def _message(model: type[Message], traits: list[str]) -> dict[str, Any]:
    doc = (model.__doc__ or model.__name__).strip()
    message: dict[str, Any] = {
        "name": model.__name__,
        "title": model.__name__,
        "summary": doc.splitlines()[0],
        "description": " ".join(line.strip() for line in doc.splitlines()),
        "contentType": CONTENT_TYPE,
        "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
        "bindings": {"amqp": {"messageType": model.__name__, "bindingVersion": _BINDING}},
        "traits": [{"$ref": f"#/components/messageTraits/{t}"} for t in traits],
        # EngineEvent's models keep unknown fields for the bus decoder to drop (vmsched.bus.codec).
        "x-vmsched-unknown-fields": "ignored" if model.model_config.get("extra") == "allow" else "refused",
    }
    if model is ErrorReply:
        message["x-vmsched-error-codes"] = {"$ref": "#/x-vmsched-error-codes"}
    return message


def _traits_by_model() -> dict[type[Message], list[str]]:
    traits: dict[type[Message], list[str]] = {m: [] for m in ALL_MODELS}
    for _, _, req, rep, _, _ in RPCS:
        traits[req].append("rpcRequest")
        traits[rep].append("rpcReply")
    traits[ErrorReply].append("rpcReply")
    for *_, model, _, _ in EVENTS:
        traits[model].append("event")
    return {m: sorted(set(t), key=list(_TRAITS).index) for m, t in traits.items()}


def _rpc_channels(exchange: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for name, key, req, rep, server, description in RPCS:
        queue = c.RPC_QUEUES[key]
        channels[name] = {
            "address": key,
            "description": f"{description} Served by {server} from queue {queue}.",
            "messages": {req.__name__: {"$ref": f"#/components/messages/{req.__name__}"}},
            "bindings": {"amqp": {"is": "routingKey", "exchange": exchange, "bindingVersion": _BINDING}},
            "x-vmsched-queue": queue,
        }
        channels[f"{name}Reply"] = {
            "address": None,
            "description": f"Reply to `{name}`, sent to the request's reply_to ({REPLY_TO}) with its "
            f"correlation_id. The body is an ErrorReply when header {c.HEADER_ERROR} is set.",
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
            "bindings": {"amqp": {"deliveryMode": 1, "mandatory": True, "bindingVersion": _BINDING}},
            # The AMQP binding has no reply-to field (AsyncAPI 3 moved replies to `reply`): the value is here.
            "x-vmsched-reply-to": REPLY_TO,
            "reply": {
                "channel": {"$ref": f"#/channels/{name}Reply"},
                "address": {
                    "location": "$message.header#/reply_to",
                    "description": f"The request's reply_to property: {REPLY_TO} (RabbitMQ direct reply-to).",
                },
                "messages": [
                    {"$ref": f"#/channels/{name}Reply/messages/{rep.__name__}"},
                    {"$ref": f"#/channels/{name}Reply/messages/ErrorReply"},
                ],
            },
        }
    return channels, operations


def _event_binding(action: str) -> dict[str, Any]:
    """Events are persistent; `mandatory` is a publisher's field, and the publisher is the engine on `receive`."""
    binding: dict[str, Any] = {"deliveryMode": 2, "bindingVersion": _BINDING}
    if action == "receive":
        binding["mandatory"] = False
    return binding


def _event_channels(exchange: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for name, address, model, action, description in EVENTS:
        channel: dict[str, Any] = {
            "address": address,
            "description": description,
            "messages": {model.__name__: {"$ref": f"#/components/messages/{model.__name__}"}},
            "bindings": {"amqp": {"is": "routingKey", "exchange": exchange, "bindingVersion": _BINDING}},
        }
        if "{clusterId}" in address:
            channel["parameters"] = {
                "clusterId": {
                    "description": "The cluster's id, as the body's cluster_id says (a key naming another "
                    "cluster is refused); subscribe with * for every cluster."
                }
            }
        if address.startswith(c.STATE_EVENTS_BINDING.removesuffix("#")):
            channel["x-vmsched-queue"] = c.STATE_EVENTS_QUEUE
        channels[name] = channel
        operations[f"{action}{name[0].upper()}{name[1:]}"] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{name}"},
            "summary": description,
            "messages": [{"$ref": f"#/channels/{name}/messages/{model.__name__}"}],
            "bindings": {"amqp": _event_binding(action)},
        }
    return channels, operations


def _dead_letter_channel() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The dead-letter queue as a channel, its message and the operation that fills it."""
    message = {
        "name": "DeadLetter",
        "title": "DeadLetter",
        "summary": "A copy of a message a service refused, with why in its headers.",
        "description": "The body is the refused message's, as it came (cut when larger than "
        "VMSCHED_DEAD_LETTER_MAX_BODY_BYTES): any of this document's messages, or not even JSON.",
        "headers": _DEAD_LETTER_HEADERS,
        "payload": {},
    }
    channel = {
        "address": None,
        "description": f"Queue {c.DEAD_LETTER_QUEUE}, bound to exchange {c.DEAD_LETTER_EXCHANGE} with #.",
        "messages": {"DeadLetter": {"$ref": "#/components/messages/DeadLetter"}},
        "bindings": {
            "amqp": {
                "is": "queue",
                "queue": {
                    "name": c.DEAD_LETTER_QUEUE,
                    "durable": True,
                    "exclusive": False,
                    "autoDelete": False,
                    "vhost": _VHOST,
                },
                "bindingVersion": _BINDING,
            }
        },
    }
    operation = {
        "action": "send",
        "channel": {"$ref": "#/channels/deadLetters"},
        "summary": "A service refused a message (x-vmsched-dead-letters says which and why).",
        "messages": [{"$ref": "#/channels/deadLetters/messages/DeadLetter"}],
    }
    return channel, message, operation


def _cluster_keyed() -> dict[str, Any]:
    return {
        "description": "Events whose routing key is <prefix>.<the body's cluster_id>, by message type. A "
        "subscriber refuses (dead-letters) one whose routing key says otherwise, with the key's cluster and "
        "the body's in the reason.",
        "events": {t: f"{prefix}.{{cluster_id}}" for t, prefix in c.CLUSTER_KEYED_EVENTS.items()},
    }


def asyncapi() -> dict[str, Any]:
    _, top = models_json_schema([(m, "validation") for m in ALL_MODELS], ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = dict(sorted(top.get("$defs", {}).items()))
    traits = _traits_by_model()
    messages = {m.__name__: _message(m, traits[m]) for m in ALL_MODELS}
    exchange = _exchanges()
    channels, operations = _rpc_channels(_binding_exchange(exchange["rpc"]))
    event_channels, event_operations = _event_channels(_binding_exchange(exchange["events"]))
    channels |= event_channels
    operations |= event_operations
    channels["deadLetters"], messages["DeadLetter"], operations["sendDeadLetter"] = _dead_letter_channel()
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "vmsched",
            "version": f"{c.SCHEMA_VERSION}.0.0",
            "description": "VM scheduling over RabbitMQ (AMQP 0-9-1). Every message is JSON (content_type "
            f"{CONTENT_TYPE}); every model has schema_version {c.SCHEMA_VERSION}. Every field's description "
            "gives its unit; MB are MiB (2^20 bytes), times are ISO 8601 date-times unless a field says unix "
            "seconds or milliseconds. The wire rules are in the message traits (rpcRequest, rpcReply, event), "
            "the AMQP bindings, and these extensions: x-vmsched-names (the VMSCHED_AMQP_PREFIX rule), "
            "x-vmsched-exchanges, x-vmsched-queues (which must exist and who declares them), "
            "x-vmsched-engine (what an engine does and must not do), x-vmsched-cluster-keyed (routing key "
            "and body agree on the cluster), x-vmsched-dead-letters and x-vmsched-error-codes.",
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "local": {"host": "127.0.0.1:5672", "protocol": "amqp", "protocolVersion": "0.9.1"},
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": schemas,
            "messageTraits": _TRAITS,
        },
        "x-vmsched-names": _names(),
        "x-vmsched-exchanges": exchange,
        "x-vmsched-queues": _queues(),
        "x-vmsched-engine": _engine(),
        "x-vmsched-cluster-keyed": _cluster_keyed(),
        "x-vmsched-dead-letters": _dead_letters(),
        "x-vmsched-error-codes": error_codes(),
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
