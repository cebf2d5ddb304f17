"""Whom a request is sent for: the header x-vmsched-on-behalf-of.

The api service sends every request for one of its tokens (`acting_for(name)` around the call); the
bus puts the name in the request's headers, and the dispatcher hands it to the handler
(`on_behalf_of()`). The name is a claim, not an identity: only vmsched_services.authz decides
whether the request's broker-vouched sender may make it (VMSCHED_API_USERS).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

#: On a request: the person (an HTTP API token's name) the sender asks for. Believed only from a sender
#: the service trusts to say so (VMSCHED_API_USERS, vmsched_services.authz.actor); from anyone else
#: it is ignored. The sender (user_id) stays the one the broker vouches for either way.
HEADER_ON_BEHALF_OF = "x-vmsched-on-behalf-of"
#: The longest name HEADER_ON_BEHALF_OF may carry (longer ones are not believed).
ON_BEHALF_OF_MAX = 64
#: The HEADER_ON_BEHALF_OF of the request whose handler is running in this context (None: it has
#: none). Owned by Dispatcher.request, like MESSAGE_USER.
MESSAGE_ON_BEHALF_OF: ContextVar[str | None] = ContextVar("vmsched_message_on_behalf_of", default=None)
#: Client side: the name the requests this context sends carry in HEADER_ON_BEHALF_OF (`acting_for`).
ACTING_FOR: ContextVar[str | None] = ContextVar("vmsched_acting_for", default=None)


def on_behalf_of() -> str | None:
    """The name the request being handled says it is sent for, unchecked: only
    vmsched_services.authz decides whether its sender may say so."""
    return MESSAGE_ON_BEHALF_OF.get()


@contextlib.contextmanager
def acting_for(name: str | None) -> Iterator[None]:
    """Requests sent in this block carry `name` in HEADER_ON_BEHALF_OF (the api service: the token's
    name). The receiving service believes it only from a sender it trusts (VMSCHED_API_USERS)."""
    token = ACTING_FOR.set(name)
    try:
        yield
    finally:
        ACTING_FOR.reset(token)


def behalf_headers() -> dict[str, Any]:
    """The header a request sent now carries for `acting_for` (none outside it)."""
    name = ACTING_FOR.get()
    return {HEADER_ON_BEHALF_OF: name} if name else {}


def named_in(headers: Mapping[str, Any]) -> str | None:
    """The name a delivery's headers carry, if it is one (printable, at most ON_BEHALF_OF_MAX)."""
    value = headers.get(HEADER_ON_BEHALF_OF)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not value or len(value) > ON_BEHALF_OF_MAX or not value.isprintable():
        return None
    return value


__all__ = [
    "HEADER_ON_BEHALF_OF",
    "MESSAGE_ON_BEHALF_OF",
    "acting_for",
    "behalf_headers",
    "named_in",
    "on_behalf_of",
]
