"""The AsyncAPI 3.0 document, put together from the catalogue, the channels, the wire rules and the
broker topology."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from vmsched import constants as c
from vmsched.bus.codec import CONTENT_TYPE
from vmsched_services.tools.asyncapi import channels, roles, topology
from vmsched_services.tools.asyncapi.catalogue import ALL_MODELS
from vmsched_services.tools.asyncapi.error_codes import error_codes
from vmsched_services.tools.asyncapi.wire import TRAITS


def asyncapi() -> dict[str, Any]:
    _, top = models_json_schema([(m, "validation") for m in ALL_MODELS], ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = dict(sorted(top.get("$defs", {}).items()))
    traits = channels.traits_by_model()
    messages = {m.__name__: channels.message_entry(m, traits[m]) for m in ALL_MODELS}
    exchange = topology.exchanges()
    doc_channels, operations = channels.rpc_channels(
        {name: topology.binding_exchange(exchange[key]) for name, key in topology.RPC_EXCHANGE_KEYS.items()}
    )
    event_channels, event_operations = channels.event_channels(topology.binding_exchange(exchange["events"]))
    doc_channels |= event_channels
    operations |= event_operations
    doc_channels["deadLetters"], messages["DeadLetter"], operations["sendDeadLetter"] = channels.dead_letter_channel()
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
            "x-vmsched-engine (what an engine does and must not do), x-vmsched-roles (the users and their "
            "permissions), x-vmsched-cluster-keyed (routing key "
            "and body agree on the cluster), x-vmsched-dead-letters and x-vmsched-error-codes.",
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "local": {"host": "127.0.0.1:5672", "protocol": "amqp", "protocolVersion": "0.9.1"},
        },
        "channels": doc_channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": schemas,
            "messageTraits": TRAITS,
        },
        "x-vmsched-names": topology.names(),
        "x-vmsched-exchanges": exchange,
        "x-vmsched-queues": topology.queues(),
        "x-vmsched-engine": topology.engine(),
        "x-vmsched-roles": roles.roles(),
        "x-vmsched-cluster-keyed": topology.cluster_keyed(),
        "x-vmsched-dead-letters": topology.dead_letters(),
        "x-vmsched-error-codes": error_codes(),
    }
