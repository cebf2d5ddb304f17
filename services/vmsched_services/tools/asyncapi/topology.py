"""What exists on the broker and who owns it: exchanges, queues, the name prefix, an engine's part.

Defaults come from Settings' declarations, never the environment, so the document is the same wherever
it is built.
"""

from __future__ import annotations

import re
from typing import Any

from vmsched import constants as c
from vmsched.bus.amqp import REPLY_TO, dead_letter_queue_arguments, work_queue_arguments
from vmsched.settings import Settings
from vmsched_services.tools.asyncapi.catalogue import RPCS
from vmsched_services.tools.asyncapi.wire import DEAD_LETTER_HEADERS, VHOST


def _setting_default(name: str) -> Any:
    """A setting's default, never the environment's value: the document must not depend on where it is built."""
    return Settings.model_fields[name].default


#: The settings' defaults, never the environment's values (the queues' arguments are built from them).
DEFAULTS = Settings.model_construct()

#: How the durable queues' arguments follow VMSCHED_QUEUE_TYPE (the document shows the default, quorum).
QUEUE_TYPE_NOTE = (
    "Arguments for the default VMSCHED_QUEUE_TYPE=quorum: replicated on the cluster's nodes, dead-lettering at "
    "least once (x-dead-letter-strategy at-least-once, which the broker accepts only with x-overflow "
    "reject-publish). With VMSCHED_QUEUE_TYPE=classic, x-queue-type, x-dead-letter-strategy and x-overflow are "
    "left out. A queue that exists as the other type is used as it is, with a warning. Quorum queues have no "
    "message priorities: vmsched uses none (a request's priority orders it in the selector)."
)


#: The key of each call exchange in exchanges(), by its name.
RPC_EXCHANGE_KEYS = {c.RPC_EXCHANGE: "rpc", c.INTERNAL_EXCHANGE: "internal", c.ADMIN_EXCHANGE: "admin"}


def exchanges() -> dict[str, dict[str, Any]]:
    declared = (
        "every vmsched process, on connecting (AmqpBus.start), unless VMSCHED_AMQP_DECLARE=false; "
        "`vmsched security apply` declares it too"
    )

    def calls(name: str, carries: str) -> dict[str, Any]:
        return {
            "name": name,
            "type": "direct",
            "durable": True,
            "autoDelete": False,
            "vhost": VHOST,
            "declaredBy": declared,
            "carries": f"{carries} The routing key is the route (the operation's channel address).",
        }

    return {
        "rpc": calls(c.RPC_EXCHANGE, "The engine's calls: schedule, state, ha-check."),
        "internal": calls(c.INTERNAL_EXCHANGE, "The services' calls to each other: place, filter, weigh."),
        "admin": calls(
            c.ADMIN_EXCHANGE,
            "Administration: policies, units, removing clusters and hosts, requeueing dead letters, the audit "
            "log. Writes are refused unless the request's AMQP user_id names an administrator.",
        ),
        "events": {
            "name": c.EVENTS_EXCHANGE,
            "type": "topic",
            "durable": True,
            "autoDelete": False,
            "vhost": VHOST,
            "declaredBy": declared,
            "carries": "Events, in and out; routing keys are the event channels' addresses.",
        },
        "deadLetter": {
            "name": c.DEAD_LETTER_EXCHANGE,
            "type": "topic",
            "durable": True,
            "autoDelete": False,
            "vhost": VHOST,
            "declaredBy": declared,
            "carries": "Every message a vmsched service refused (x-vmsched-dead-letters).",
        },
    }


def binding_exchange(exchange: dict[str, Any]) -> dict[str, Any]:
    """An exchange as the AMQP channel binding describes it (that object takes its own fields only)."""
    return {k: exchange[k] for k in ("name", "type", "durable", "autoDelete", "vhost")}


def queues() -> list[dict[str, Any]]:
    """Every queue vmsched names: who declares it, with which arguments, bound how."""
    dlx_argument = work_queue_arguments(DEFAULTS, c.DEAD_LETTER_EXCHANGE)
    from_settings = {"x-queue-type": "VMSCHED_QUEUE_TYPE"}
    out: list[dict[str, Any]] = []
    served = {key: server for _, key, _, _, server, _ in RPCS}
    for route, name in c.RPC_QUEUES.items():
        server = served.get(route, "its service")
        out.append(
            {
                "name": name,
                "durable": True,
                "exclusive": False,
                "autoDelete": False,
                "arguments": dlx_argument,
                "x-vmsched-arguments-from": from_settings,
                "x-vmsched-arguments-note": QUEUE_TYPE_NOTE,
                "bindings": [{"exchange": c.rpc_exchange(route), "routingKey": route}],
                "declaredBy": f"{server}, when it starts serving `{route}`",
                "consumedBy": f"every {server} process (competing consumers)",
                "description": f"Requests for route `{route}`. Until a {server} has started once, a request "
                "for the route is unroutable (returned to a publisher that set `mandatory`).",
            }
        )
    for route, server in c.CATALOGUE_ROUTES.items():
        out.append(
            {
                "name": f"{c.RPC_QUEUES[route]}.<catalogue>",
                "namePattern": f"^{re.escape(c.RPC_QUEUES[route])}\\.[0-9a-f]{{{c.CATALOGUE_HASH_LENGTH}}}$",
                "durable": True,
                "exclusive": False,
                "autoDelete": False,
                "arguments": dlx_argument,
                "x-vmsched-arguments-from": from_settings,
                "x-vmsched-arguments-note": QUEUE_TYPE_NOTE,
                "bindings": [{"exchange": c.rpc_exchange(route), "routingKey": f"{route}.<catalogue>"}],
                "declaredBy": f"each {server}, when it starts serving `{route}` (even with "
                "VMSCHED_AMQP_DECLARE=false: no definitions can know its name)",
                "consumedBy": f"every {server} process whose unit catalogue hashes to <catalogue> "
                "(competing consumers)",
                "description": f"Requests for route `{route}` under a policy some running {server} processes lack "
                f"units of: <catalogue> ({c.CATALOGUE_HASH_LENGTH} hex digits) is the hash of the units and their "
                "origins of the processes that have them all, as each announces it in Redis. Every such process "
                "also consumes the plain queue. An engine never sends here; the selector does.",
            }
        )
    out.append(
        {
            "name": c.STATE_EVENTS_QUEUE,
            "durable": True,
            "exclusive": False,
            "autoDelete": False,
            "arguments": dlx_argument,
            "x-vmsched-arguments-from": from_settings,
            "x-vmsched-arguments-note": QUEUE_TYPE_NOTE,
            "bindings": [{"exchange": c.EVENTS_EXCHANGE, "routingKey": c.STATE_EVENTS_BINDING}],
            "declaredBy": "state-tracker, when it starts",
            "consumedBy": "every state-tracker process, in order",
            "description": "Every engine state report (ClusterReport, HostReport, VmReport, StateReports). Reports "
            "wait here "
            "while no state tracker runs; before one has started once, reports are unroutable and lost "
            "(an engine can declare the queue passively to see it exists).",
        }
    )
    out.append(
        {
            "name": c.ENGINE_EVENTS_QUEUE,
            "durable": True,
            "exclusive": False,
            "autoDelete": False,
            "arguments": dlx_argument,
            "x-vmsched-arguments-from": from_settings,
            "x-vmsched-arguments-note": QUEUE_TYPE_NOTE,
            "bindings": [{"exchange": c.EVENTS_EXCHANGE, "routingKey": k} for k in c.ENGINE_EVENTS_BINDINGS],
            "declaredBy": "`vmsched security` definitions (an administrator), never a vmsched process",
            "consumedBy": "the engine (VMSCHED_AMQP_EVENTS_QUEUE), one consumer per engine connection",
            "description": "Everything vmsched tells an engine that declares nothing: it holds the events while "
            "the engine is away.",
        }
    )
    out.append(
        {
            "name": c.DEAD_LETTER_QUEUE,
            "durable": True,
            "exclusive": False,
            "autoDelete": False,
            "arguments": dead_letter_queue_arguments(DEFAULTS),
            "x-vmsched-arguments-from": {**from_settings, "x-max-length-bytes": "VMSCHED_DEAD_LETTER_QUEUE_MAX_BYTES"},
            "bindings": [{"exchange": c.DEAD_LETTER_EXCHANGE, "routingKey": "#"}],
            "declaredBy": "every vmsched process, on connecting (an existing one with other arguments is used as "
            "it is)",
            "consumedBy": "nobody: operators read it (`vmsched dead-letters`); the oldest are dropped first",
            "description": "Every refused message, with the reason in its headers (x-vmsched-dead-letters).",
        }
    )
    return out


def names() -> dict[str, Any]:
    prefixed_exchanges = [*c.RPC_EXCHANGES, c.EVENTS_EXCHANGE, c.DEAD_LETTER_EXCHANGE]
    prefixed_queues = [*c.RPC_QUEUES.values(), c.STATE_EVENTS_QUEUE, c.ENGINE_EVENTS_QUEUE, c.DEAD_LETTER_QUEUE]
    prefixed_queues += [f"{c.RPC_QUEUES[route]}.<catalogue>" for route in c.CATALOGUE_ROUTES]
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
        "prefixedExchanges": prefixed_exchanges,
        "prefixedQueues": prefixed_queues,
        "notPrefixed": [
            "routing keys and binding patterns",
            "message type names (the AMQP type property)",
            "header names",
            REPLY_TO,
            "server-named queues (a subscriber's own)",
        ],
    }


def engine() -> dict[str, Any]:
    return {
        "description": "What an engine (the program vmsched schedules for) must do, and must not.",
        "declares": [
            "Nothing, in a deployment made with `vmsched security` definitions (x-vmsched-roles): it runs as "
            f"user vmsched-engine, without configure permission, and reads the events it follows from "
            f"{c.ENGINE_EVENTS_QUEUE}, which the definitions bind to {', '.join(c.ENGINE_EVENTS_BINDINGS)}.",
            "Where it may declare (development, one user for everything): at most the exchanges of "
            "x-vmsched-exchanges, with exactly the parameters given, and its own exclusive queue for the events "
            "it follows, bound on the events exchange with the event channels' addresses ({clusterId} or *).",
        ],
        "identity": "Every request and event carries the AMQP user_id property, the user the sender connected "
        "as (RabbitMQ refuses any other value): administration is authorized on it (VMSCHED_ADMIN_USERS).",
        "mustNot": [
            "Declare vmsched's named queues (x-vmsched-queues): a declaration with other arguments is refused "
            "(PRECONDITION_FAILED closes the channel), and a queue declared first without vmsched's "
            "arguments keeps the services from starting.",
            "Publish on the dead-letter exchange.",
            "Publish decisions, migrations, power advice, HA alerts, host or cluster removals: its topic "
            "permissions on the events exchange allow state reports and resync-complete only.",
            "Call the internal or admin exchanges' routes (place, filter, weigh; policy.*, clusters.remove, "
            "hosts.remove, dead-letters.requeue): its write permission is on vmsched.rpc and vmsched.events only.",
        ],
        "reports": "Publish ClusterReport, HostReport and VmReport as events (message trait `event`) on "
        "state.cluster.<cluster>, state.host.<cluster> and state.vm.<cluster>, or many host and VM reports of "
        "a cluster as one StateReports on state.reports.<cluster> (less per report). The state tracker applies "
        "them in the order published; the `state` RPC shows what it has.",
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
        "unknownFields": "Events an engine publishes (ClusterReport, HostReport, VmReport, StateReports: schemas with "
        "additionalProperties true) may carry fields this version does not know: they are ignored, and "
        "logged once per message type and field by each service. Every other message, RPC requests "
        "included, refuses unknown fields.",
    }


def dead_letters() -> dict[str, Any]:
    return {
        "exchange": c.DEAD_LETTER_EXCHANGE,
        "queue": c.DEAD_LETTER_QUEUE,
        "description": "A service never drops a message it cannot process: it publishes a copy on the "
        "dead-letter exchange (routing key: the name of the queue it came from, prefixed), waits for the "
        "broker's confirm, then acks the original. What lands there: an undecodable or invalid message "
        "(bad JSON, wrong fields, over the size limit; an RPC request's caller also gets an ErrorReply); an "
        "event without a `type`, or of a type its queue does not take; an event whose routing key and body "
        "name different clusters; a message whose handler failed; an event that failed transiently "
        f"(VMSCHED_TRANSIENT_ATTEMPTS times, default {_setting_default('transient_attempts')}: a server it "
        "needs was away; an RPC request that fails so is answered with a retryable code such as "
        "redis_unavailable instead, its caller owning the next attempt); an RPC request that arrived "
        "after its deadline; and, through the queues' x-dead-letter-exchange argument, a "
        "request that expired in its queue and a message that could not be settled otherwise.",
        "headers": DEAD_LETTER_HEADERS,
    }


def cluster_keyed() -> dict[str, Any]:
    return {
        "description": "Events whose routing key is <prefix>.<the body's cluster_id>, by message type. A "
        "subscriber refuses (dead-letters) one whose routing key says otherwise, with the key's cluster and "
        "the body's in the reason.",
        "events": {t: f"{prefix}.{{cluster_id}}" for t, prefix in c.CLUSTER_KEYED_EVENTS.items()},
    }
