"""The Bus on RabbitMQ (aio-pika). See vmsched.bus.base for the contract.

One job per module:
* connection: the robust connection, the topology (exchanges, the bounded dead-letter queue, the
  durable queues' type and arguments), waiting out a recovery, and every broker failure as
  BusUnavailable;
* nodes: connecting to one of a cluster's nodes, and reconnecting to the next one;
* rpc: `call` over direct reply-to (deadlines, re-registering the reply consumer after a
  recovery) and `serve`;
* events: `publish` and `subscribe`;
* consumers: each consumer's channel, the dispatcher's primitives on a delivery (what happens to a
  delivered message is decided by vmsched.bus.dispatch, shared with MemoryBus), cancelling;
* operations: queue depths and the dead-letter queue (read, sent again);
* bus: AmqpBus, which puts them together.
"""

from vmsched.bus.amqp.bus import AmqpBus
from vmsched.bus.amqp.connection import (
    BROKER_ERRORS,
    DLQ_MAX_LENGTH,
    BrokerLink,
    broker_address,
    dead_letter_queue_arguments,
    queue_type_arguments,
    redacted,
    work_queue_arguments,
)
from vmsched.bus.amqp.consumers import CANCEL_TIMEOUT_S
from vmsched.bus.amqp.nodes import amqp_urls
from vmsched.bus.amqp.rpc import REPLY_TO
from vmsched.bus.dispatch import HEADER_DEADLINE, TRANSIENT

__all__ = [
    "BROKER_ERRORS",
    "CANCEL_TIMEOUT_S",
    "DLQ_MAX_LENGTH",
    "HEADER_DEADLINE",
    "REPLY_TO",
    "TRANSIENT",
    "AmqpBus",
    "BrokerLink",
    "amqp_urls",
    "broker_address",
    "dead_letter_queue_arguments",
    "queue_type_arguments",
    "redacted",
    "work_queue_arguments",
]
