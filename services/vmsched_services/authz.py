"""Who may do what: the sender of the message being handled, as the broker vouches for it.

RabbitMQ refuses a publish whose AMQP user_id property is not the user the publisher connected as,
so `vmsched.bus.caller()` (that property, set by the dispatcher around each handler) names the
RabbitMQ user that really sent the request or event. Administration (policy changes, removals,
requeueing dead letters) needs one named in VMSCHED_ADMIN_USERS; the state tracker also takes
removals from VMSCHED_POLICY_ADMIN_USER, which publishes them on an administrator's behalf.
"""

from __future__ import annotations

from collections.abc import Collection

from vmsched.bus import caller
from vmsched.errors import NotAuthorized
from vmsched.settings import Settings

#: What each kind of administration is called in a refusal ("... needs a user named in ...").
POLICY_CHANGES = "policy changes need"
REMOVING_CLUSTERS = "removing a cluster needs"
REMOVING_HOSTS = "removing hosts needs"
REQUEUEING = "requeueing dead letters needs"


def require_admin(settings: Settings, what: str) -> str:
    """The sender of the request being handled, when it is an administrator; else NotAuthorized
    saying who asked and what to do. `what` names the action with its verb (POLICY_CHANGES, ...)."""
    return require_one_of(settings.admin_user_names, what, "VMSCHED_ADMIN_USERS")


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
    "require_admin",
    "require_one_of",
]
