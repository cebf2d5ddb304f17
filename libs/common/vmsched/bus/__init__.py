"""The message bus: one interface (Bus), a RabbitMQ implementation and an in-memory one."""

from vmsched.bus.base import Bus, DeadLetter, RequeueResult, Subscription
from vmsched.bus.codec import decode, encode
from vmsched.bus.dispatch import acting_for, caller, on_behalf_of
from vmsched.bus.memory import MemoryBroker, MemoryBus
from vmsched.settings import Settings


def connect(settings: Settings, service: str = "client") -> Bus:
    """The RabbitMQ bus (imported lazily so pure-logic users never load aio-pika)."""
    from vmsched.bus.amqp import AmqpBus  # noqa: PLC0415 - see the docstring

    return AmqpBus(settings, service)


__all__ = [
    "Bus",
    "DeadLetter",
    "MemoryBroker",
    "MemoryBus",
    "RequeueResult",
    "Subscription",
    "acting_for",
    "caller",
    "connect",
    "decode",
    "encode",
    "on_behalf_of",
]
