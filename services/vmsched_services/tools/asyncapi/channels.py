"""The document's messages, channels and operations: one channel per RPC (and its reply), per event,
and the dead-letter queue; operations are described from vmsched's side.
"""

from __future__ import annotations

from typing import Any

from vmsched import constants as c
from vmsched.bus.amqp import REPLY_TO
from vmsched.bus.codec import CONTENT_TYPE
from vmsched.contracts.base import Message
from vmsched.contracts.workers import ErrorReply
from vmsched_services.tools.asyncapi.catalogue import ALL_MODELS, EVENTS, RPCS
from vmsched_services.tools.asyncapi.wire import BINDING, DEAD_LETTER_HEADERS, TRAITS, VHOST


def message_entry(model: type[Message], traits: list[str]) -> dict[str, Any]:
    doc = (model.__doc__ or model.__name__).strip()
    message: dict[str, Any] = {
        "name": model.__name__,
        "title": model.__name__,
        "summary": doc.splitlines()[0],
        "description": " ".join(line.strip() for line in doc.splitlines()),
        "contentType": CONTENT_TYPE,
        "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
        "bindings": {"amqp": {"messageType": model.__name__, "bindingVersion": BINDING}},
        "traits": [{"$ref": f"#/components/messageTraits/{t}"} for t in traits],
        # EngineEvent's models keep unknown fields for the bus decoder to drop (vmsched.bus.codec).
        "x-vmsched-unknown-fields": "ignored" if model.model_config.get("extra") == "allow" else "refused",
    }
    if model is ErrorReply:
        message["x-vmsched-error-codes"] = {"$ref": "#/x-vmsched-error-codes"}
    return message


def traits_by_model() -> dict[type[Message], list[str]]:
    traits: dict[type[Message], list[str]] = {m: [] for m in ALL_MODELS}
    for _, _, req, rep, _, _ in RPCS:
        traits[req].append("rpcRequest")
        traits[rep].append("rpcReply")
    traits[ErrorReply].append("rpcReply")
    for *_, model, _, _ in EVENTS:
        traits[model].append("event")
    return {m: sorted(set(t), key=list(TRAITS).index) for m, t in traits.items()}


def rpc_channels(exchanges: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The call channels; `exchanges` are the call exchanges' bindings by exchange name."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for name, key, req, rep, server, description in RPCS:
        queue = c.RPC_QUEUES[key]
        channels[name] = {
            "address": key,
            "description": f"{description} Served by {server} from queue {queue}.",
            "messages": {req.__name__: {"$ref": f"#/components/messages/{req.__name__}"}},
            "bindings": {
                "amqp": {"is": "routingKey", "exchange": exchanges[c.rpc_exchange(key)], "bindingVersion": BINDING}
            },
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
            "bindings": {"amqp": {"deliveryMode": 1, "mandatory": True, "bindingVersion": BINDING}},
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
    binding: dict[str, Any] = {"deliveryMode": 2, "bindingVersion": BINDING}
    if action == "receive":
        binding["mandatory"] = False
    return binding


def event_channels(exchange: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for name, address, model, action, description in EVENTS:
        channel: dict[str, Any] = {
            "address": address,
            "description": description,
            "messages": {model.__name__: {"$ref": f"#/components/messages/{model.__name__}"}},
            "bindings": {"amqp": {"is": "routingKey", "exchange": exchange, "bindingVersion": BINDING}},
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


def dead_letter_channel() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The dead-letter queue as a channel, its message and the operation that fills it."""
    message = {
        "name": "DeadLetter",
        "title": "DeadLetter",
        "summary": "A copy of a message a service refused, with why in its headers.",
        "description": "The body is the refused message's, as it came (cut when larger than "
        "VMSCHED_DEAD_LETTER_MAX_BODY_BYTES): any of this document's messages, or not even JSON.",
        "headers": DEAD_LETTER_HEADERS,
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
                    "vhost": VHOST,
                },
                "bindingVersion": BINDING,
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
