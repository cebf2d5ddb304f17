"""The wire rules every message follows: its AMQP properties and headers, by kind (message traits).

Header names and the reply-to queue are the bus's own constants, so the document says what the bus does.
"""

from __future__ import annotations

from typing import Any

from vmsched import constants as c
from vmsched.bus.amqp import REPLY_TO
from vmsched.bus.behalf import HEADER_ON_BEHALF_OF
from vmsched.bus.codec import CONTENT_TYPE
from vmsched.bus.dispatch import (
    HEADER_ATTEMPTS,
    HEADER_DEADLINE,
    HEADER_ORIGINAL_SIZE,
    HEADER_SENDER,
    HEADER_TRUNCATED,
)

#: What the AMQP binding objects of this document follow.
BINDING = "0.3.0"
#: The RabbitMQ virtual host the names below live in.
VHOST = "/"


def _header(type_: str, description: str, set_by: str = "vmsched") -> dict[str, Any]:
    """One header's schema; `x-vmsched-set-by` says who sets it: the message's publisher, or vmsched only."""
    return {"type": type_, "description": description, "x-vmsched-set-by": set_by}


_ATTEMPTS = _header(
    "integer",
    "Set by vmsched on the copy of a message it puts back on its queue after a transient failure (a "
    "dependency such as Redis was away): how many attempts failed so far. Publishers never set it.",
)
_SENDER = _header(
    "string",
    "Set by vmsched on a retry copy, which it publishes as its own AMQP user: the user_id of the message "
    "it copies (empty: none), believed only on a copy whose user_id is the receiving service's own user. "
    "Publishers never set it; a requeued dead letter goes without it.",
)
_ORIGINAL_KEY = _header(
    "string",
    "Set by vmsched on a retry copy (whose own routing key is then the queue's name) and on a dead letter: "
    "the routing key the message was first published with.",
)
_ORIGINAL_EXCHANGE = _header(
    "string",
    "Set by vmsched on a retry copy and on a dead letter: the exchange the message was first published to "
    '("" for the default exchange), so `vmsched dead-letters requeue` can publish it there again.',
)

#: The application headers (the AMQP `headers` table) of each kind of message, by message trait.
TRAITS: dict[str, dict[str, Any]] = {
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
                HEADER_ON_BEHALF_OF: _header(
                    "string",
                    "Set by vmsched's api service on its requests: the person it asks for (its token's name, "
                    'at most 64 printable characters). policy-admin records its writes as "<sender> for <name>" '
                    "only when the broker-vouched sender is named in VMSCHED_API_USERS; from anyone else it is "
                    "ignored.",
                ),
                HEADER_ATTEMPTS: _ATTEMPTS,
                HEADER_SENDER: _SENDER,
                c.HEADER_DLX_ROUTING_KEY: _ORIGINAL_KEY,
                c.HEADER_DLX_EXCHANGE: _ORIGINAL_EXCHANGE,
            },
        },
        "correlationId": {
            "location": "$message.header#/correlation_id",
            "description": "The AMQP correlation_id property: chosen by the caller, unique per call.",
        },
        "bindings": {"amqp": {"bindingVersion": BINDING}},
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
        "bindings": {"amqp": {"bindingVersion": BINDING}},
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
            "properties": {
                HEADER_ATTEMPTS: _ATTEMPTS,
                HEADER_SENDER: _SENDER,
                c.HEADER_DLX_ROUTING_KEY: _ORIGINAL_KEY,
                c.HEADER_DLX_EXCHANGE: _ORIGINAL_EXCHANGE,
            },
        },
        "bindings": {"amqp": {"bindingVersion": BINDING}},
        "x-vmsched-amqp-properties": {
            "content_type": CONTENT_TYPE,
            "type": "required: the message name (bindings.amqp.messageType)",
            "delivery_mode": 2,
        },
    },
}

DEAD_LETTER_HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "A dead letter keeps the refused message's properties (type, correlation_id, content_type) "
    "and headers, except the deadline, plus these. A message rejected by the broker instead (expired, or "
    "refused when even the dead-letter copy could not be published) carries RabbitMQ's own x-death header.",
    "properties": {
        c.HEADER_DLX_REASON: _header("string", "Why the message was refused, for people (at most 2000 characters)."),
        c.HEADER_DLX_SERVICE: _header("string", "The service that refused it (selector, state-tracker, ...)."),
        c.HEADER_DLX_ROUTING_KEY: _header("string", "The routing key the message was published with."),
        c.HEADER_DLX_EXCHANGE: _header(
            "string", 'The exchange the message was published to ("" for the default exchange).'
        ),
        c.HEADER_DLX_TIME: _header("integer", "When it was dead-lettered: unix time in integer milliseconds."),
        c.HEADER_DLX_ID: _header("string", "A short id naming this dead letter (`vmsched dead-letters show ID`)."),
        HEADER_ORIGINAL_SIZE: _header(
            "integer",
            "Present when the body was cut to VMSCHED_DEAD_LETTER_MAX_BODY_BYTES: its size before, in bytes.",
        ),
        HEADER_TRUNCATED: _header("boolean", "True when the body was cut (see the original size)."),
    },
}
