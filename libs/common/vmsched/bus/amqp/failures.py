"""A failed connection to RabbitMQ named for what it is (BusUnavailable with its `kind` and `hint`):
the login refused, a virtual host or resource refused, TLS refused, nothing listening, another kind of
server at the address, or the broker away (vmsched.reach has the kinds every server shares).
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote, urlsplit

import aiormq

from vmsched.bus.amqp.nodes import amqp_urls
from vmsched.bus.codec import safe_text
from vmsched.errors import BusUnavailable
from vmsched.reach import Diagnosis, Target, TlsFiles, find_cause, no_server, probed, tls_refused
from vmsched.settings import Settings, redacted_url

#: What the broker's refusals to a user look like: the login itself, a virtual host, a resource.
_LOGIN: tuple[type[aiormq.exceptions.AMQPConnectionError], ...] = (
    aiormq.exceptions.ProbableAuthenticationError,
    aiormq.exceptions.AuthenticationError,
)


def target(settings: Settings, url: str) -> Target:
    return Target("amqp", url, TlsFiles.of(settings, "amqp") if url.startswith("amqps:") else None)


def _vhost(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _open_refused(exc: BaseException) -> BaseException | None:
    """aiormq 7 reports the broker closing the connection in answer to Connection.Open (access to the
    virtual host refused, NOT_ALLOWED) as an unexpected frame, without the broker's text."""
    frame = find_cause(exc, aiormq.exceptions.InvalidFrameError)
    text = str(frame) if frame is not None else ""
    return frame if "Connection.OpenOk" in text and "Connection.Close" in text else None


def refusal(t: Target, exc: BaseException) -> Diagnosis | None:
    """The broker's own refusals of the user (`exc`'s chain): its login, its virtual host, a resource."""
    login = find_cause(exc, _LOGIN)
    user = t.user or "guest"
    if login is not None:
        return Diagnosis(
            "login_refused",
            f"{t.where} refused the login of user {user!r}: {safe_text(login, 300)}",
            f"check the user name and password in {t.setting} (`rabbitmqctl authenticate_user USER PASSWORD` "
            "on the broker says whether it takes them)",
        )
    vhost = find_cause(exc, aiormq.exceptions.ConnectionNotAllowed) or _open_refused(exc)
    if vhost is not None:
        said = "NOT_ALLOWED" if isinstance(vhost, aiormq.exceptions.InvalidFrameError) else safe_text(vhost, 300)
        return Diagnosis(
            "permission_refused",
            f"{t.where} refused user {user!r} access to virtual host {_vhost(t.url)!r}: {said} (the user has no "
            "rights there, or the virtual host does not exist)",
            f"grant it: `rabbitmqctl set_permissions -p {_vhost(t.url)} {user} '.*' '.*' '.*'`, or fix the "
            f"virtual host in {t.setting}",
        )
    resource = find_cause(exc, aiormq.exceptions.ChannelAccessRefused)
    if resource is not None:
        return Diagnosis(
            "permission_refused",
            f"{t.where} refused user {user!r} an operation on its exchanges or queues: {safe_text(resource, 300)}",
            f"the user needs configure, write and read permissions on the vmsched exchanges and queues: "
            f"`rabbitmqctl set_permissions -p {_vhost(t.url)} {user} '.*' '.*' '.*'` (or patterns matching "
            "VMSCHED_AMQP_PREFIX)",
        )
    return None


def diagnose(settings: Settings, url: str, exc: BaseException) -> BusUnavailable:
    """`exc`, raised connecting to the broker at `url`, as the BusUnavailable that names what went
    wrong. May ask what answers at the address (blocking, a few seconds at most): run it in a thread."""
    t = target(settings, url)
    found = refusal(t, exc) or tls_refused(t, exc) or no_server(t, exc) or probed(t, exc)
    return BusUnavailable(found.message, kind=found.kind, hint=found.hint)


async def connect_failure(settings: Settings, exc: BaseException) -> BusUnavailable:
    """`exc`, from connecting to the configured broker (the last node of amqp_urls tried), named."""
    urls = amqp_urls(settings)
    found = await asyncio.to_thread(diagnose, settings, urls[-1], exc)
    if len(urls) == 1:
        return found
    tried = ", ".join(redacted_url(u) for u in urls)
    return BusUnavailable(f"{found.message} (tried {tried} in turn)", kind=found.kind, hint=found.hint)


def refused(settings: Settings, url: str, exc: BaseException) -> BusUnavailable | None:
    """`exc` as BusUnavailable if it is the broker refusing the user something, else None (no probing:
    for failures on a connection that was made)."""
    found = refusal(target(settings, url), exc)
    return None if found is None else BusUnavailable(found.message, kind=found.kind, hint=found.hint)


__all__ = ["connect_failure", "diagnose", "refusal", "refused", "target"]
