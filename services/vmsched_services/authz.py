"""Who may do what: the sender of the message being handled, as the broker vouches for it.

RabbitMQ refuses a publish whose AMQP user_id property is not the user the publisher connected as,
so `vmsched.bus.caller()` (that property, set by the dispatcher around each handler) names the
RabbitMQ user that really sent the request or event. Administration (policy changes, removals,
requeueing dead letters) needs one named in VMSCHED_ADMIN_USERS; the state tracker also takes
removals from VMSCHED_POLICY_ADMIN_USER, which publishes them on an administrator's behalf.

The api service (an administrator's RabbitMQ user, VMSCHED_API_USERS) says for whom it asks: the
name of the HTTP token in the request's x-vmsched-on-behalf-of header. The audit log then names both,
"vmsched-api for alice" (`actor`); the header from any other sender is ignored and logged, so no
client can write someone else's name into the audit log.
"""

from __future__ import annotations

from collections.abc import Collection

from vmsched.bus import caller, on_behalf_of
from vmsched.errors import NotAuthorized
from vmsched.logging import get_logger
from vmsched.settings import Settings

log = get_logger("vmsched.authz")

#: What each kind of administration is called in a refusal ("... needs a user named in ...").
POLICY_CHANGES = "policy changes need"
REMOVING_CLUSTERS = "removing a cluster needs"
REMOVING_HOSTS = "removing hosts needs"
REQUEUEING = "requeueing dead letters needs"


def require_admin(settings: Settings, what: str) -> str:
    """Who the audit log names for the request being handled (`actor`), when its sender is an
    administrator; else NotAuthorized saying who asked and what to do. `what` names the action with
    its verb (POLICY_CHANGES, ...)."""
    return actor(settings, require_one_of(settings.admin_user_names, what, "VMSCHED_ADMIN_USERS"))


def actor(settings: Settings, sender: str) -> str:
    """`sender` (broker-vouched), or "<sender> for <name>" when the request says it is sent on behalf
    of `name` and `sender` is trusted to say so (VMSCHED_API_USERS). Another sender's claim is ignored
    and logged: it may not put a name of its choosing in the audit log."""
    name = on_behalf_of()
    if name is None:
        return sender
    if sender in settings.api_user_names:
        return f"{sender} for {name}"
    log.warning(
        "ignored an on-behalf-of header from a sender not in VMSCHED_API_USERS", sender=sender, claimed=name[:64]
    )
    return sender


def require_one_of(allowed: Collection[str], what: str, setting: str, *, message: str = "request") -> str:
    """The sender of the `message` (request, event) being handled, when it is in `allowed`; else
    NotAuthorized. A requeued dead letter names none: the requeuer does not vouch for its sender."""
    who = caller()
    if who is None:
        raise NotAuthorized(
            f"the {message} names no sender (AMQP user_id): {what} a user named in {setting}; send it with a "
            "vmsched client, which sets it to the user it connected as"
        )
    if who not in allowed:
        raise NotAuthorized(f"AMQP user {who!r} is not an administrator: {what} a user named in {setting}")
    return who


__all__ = [
    "POLICY_CHANGES",
    "REMOVING_CLUSTERS",
    "REMOVING_HOSTS",
    "REQUEUEING",
    "actor",
    "require_admin",
    "require_one_of",
]
