"""A failed connection named for what it is, in what every server shares: the TLS handshake refused,
nothing listening, another kind of server at the address, no answer. Each client's own module
(vmsched.bus.amqp.failures, vmsched.store.redis_failures, vmsched.db.failures) tries its server's own
refusals first (a wrong password, missing rights), then these, and makes its error of the Diagnosis.

Messages name the server, the address and the setting to change, never a password.
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from vmsched.errors import ConnectionFailure
from vmsched.reach.probe import CLOSED_AFTER_HANDSHAKE, NAMES, Answer, handshake_refusal, identify
from vmsched.reach.tls import Server, TlsFiles
from vmsched.settings import redacted_url

E = TypeVar("E", bound=BaseException)

#: How deep the chain of causes is followed (drivers wrap what they caught, sometimes twice).
CAUSE_DEPTH = 8

_SERVERS: dict[Server, tuple[str, str, int, str]] = {
    # kind as identify() says it, name, default port, how the URL asks for TLS
    "amqp": ("amqp", "RabbitMQ", 5672, "amqps:// (port 5671)"),
    "redis": ("redis", "Redis", 6379, "rediss://"),
    "postgres": ("postgresql", "PostgreSQL", 5432, "?sslmode=verify-full"),
}
#: TLS refusals that mean the server did not accept (or got no) client certificate.
_CLIENT_CERT_REASONS = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE", "ACCESS_DENIED")
#: TLS failures that mean the other end does not speak TLS at all.
_NOT_TLS_REASONS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_EOF")


@dataclass(frozen=True)
class Diagnosis:
    kind: ConnectionFailure
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class Target:
    """The server a connection was for: which kind, its URL, and its TLS files when the URL asks for TLS."""

    server: Server
    url: str
    tls: TlsFiles | None = None

    @property
    def name(self) -> str:
        return _SERVERS[self.server][1]

    @property
    def setting(self) -> str:
        return f"VMSCHED_{self.server.upper()}_URL"

    @property
    def host(self) -> str:
        try:
            return urlsplit(self.url).hostname or "localhost"
        except ValueError:
            return "localhost"

    @property
    def port(self) -> int:
        try:
            return urlsplit(self.url).port or self.default_port
        except ValueError:
            return self.default_port

    @property
    def default_port(self) -> int:
        if self.server == "amqp" and self.url.startswith("amqps:"):
            return 5671
        return _SERVERS[self.server][2]

    @property
    def user(self) -> str:
        try:
            return urlsplit(self.url).username or ""
        except ValueError:
            return ""

    @property
    def where(self) -> str:
        return f"{self.name} at {self.host}:{self.port}"

    @property
    def shown_url(self) -> str:
        return redacted_url(self.url)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or while handling, and so on."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < CAUSE_DEPTH:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def find_cause(exc: BaseException, kind: type[E] | tuple[type[E], ...]) -> E | None:
    """The first exception of type `kind` in `exc`'s chain of causes."""
    return next((c for c in causes(exc) if isinstance(c, kind)), None)


def _reason(err: ssl.SSLError) -> str:
    if isinstance(err, ssl.SSLCertVerificationError) and err.verify_message:
        return str(err.verify_message)
    return str(err.reason or err.strerror or err)


def tls_refused(target: Target, exc: BaseException) -> Diagnosis | None:
    """A TLS handshake that failed: our check of the server's certificate, the server's refusal of ours
    (or of none), or a server that does not speak TLS at that port."""
    err = find_cause(exc, ssl.SSLError)
    tls = target.tls or TlsFiles(prefix=f"VMSCHED_{target.server.upper()}_TLS")
    if err is None:
        return None
    reason = _reason(err)
    if isinstance(err, ssl.SSLCertVerificationError):
        return Diagnosis(
            "tls_refused",
            f"TLS with {target.where} failed: the server's certificate did not verify ({reason}); it was "
            f"checked against {tls.checked_against()}",
            f"point {tls.prefix}_CA_FILE at the CA that signed the server's certificate, and name the server "
            f"in {target.setting} as its certificate does",
        )
    upper = reason.upper().replace(" ", "_")
    if any(r in upper for r in _CLIENT_CERT_REASONS):
        return _wants_client_certificate(target, tls, reason)
    if any(r in upper for r in _NOT_TLS_REASONS):
        return Diagnosis(
            "tls_refused",
            f"TLS with {target.where} failed ({reason}): the server does not speak TLS at that port",
            f"use the server's TLS port in {target.setting}, or drop TLS from its URL",
        )
    return Diagnosis(
        "tls_refused",
        f"TLS with {target.where} failed: {reason} (certificates checked against {tls.checked_against()})",
        f"check {tls.prefix}_CA_FILE, _CERT_FILE and _KEY_FILE against the server's TLS settings",
    )


def _wants_client_certificate(target: Target, tls: TlsFiles, reason: str) -> Diagnosis:
    given = f"the one in {tls.cert_file}" if tls.cert_file else "none was given"
    return Diagnosis(
        "tls_refused",
        f"{target.where} refused the TLS handshake ({reason}): it wants a client certificate it trusts, and {given}",
        f"set {tls.prefix}_CERT_FILE and {tls.prefix}_KEY_FILE to a certificate signed by a CA the server trusts",
    )


def no_server(target: Target, exc: BaseException) -> Diagnosis | None:
    """Nothing listens at the address (connection refused)."""
    # aiormq re-raises a refused connect as its own error with the errno as first argument.
    if any(isinstance(c, ConnectionRefusedError) or (c.args and c.args[0] == errno.ECONNREFUSED) for c in causes(exc)):
        return _nothing(target)
    return None


def _nothing(target: Target) -> Diagnosis:
    return Diagnosis(
        "no_server",
        f"nothing listens at {target.host}:{target.port} (connection refused), where {target.setting} "
        f"({target.shown_url}) says {target.name} is",
        f"start {target.name}, or point {target.setting} at a running one",
    )


def probed(target: Target, exc: BaseException) -> Diagnosis:
    """A failure the client's exception does not explain (no answer in time, a reply it could not
    read): what answers at the address says. Blocks for up to a few seconds (see vmsched.reach.probe)."""
    found: Answer = identify(target.host, target.port)
    own_kind = _SERVERS[target.server][0]
    if found == "nothing":
        return _nothing(target)
    if found in NAMES and found != own_kind:
        return Diagnosis(
            "wrong_server",
            f"{target.setting} points at {target.host}:{target.port}, where {NAMES[found]} answers, not {target.name}",
            f"fix the address in {target.setting}: {target.name} listens on port {_SERVERS[target.server][2]} "
            "by default",
        )
    if found in ("tls", "unknown") and target.tls is not None and target.server != "postgres":
        # A TLS port, asked over TLS, yet no TLS error came through the client: shake hands again here.
        # "unknown" too: a TLS server may reset the connection on the plain greetings (bytes of ours
        # left unread) before its alert is read.
        refusal = handshake_refusal(target.host, target.port, target.tls.context())
        if refusal == CLOSED_AFTER_HANDSHAKE:
            return _wants_client_certificate(
                target, target.tls, "it dropped the connection once the handshake was done"
            )
        if isinstance(refusal, ssl.SSLError):
            return tls_refused(target, refusal) or generic(target, exc)
    if found == "tls" and target.tls is None:
        return Diagnosis(
            "tls_refused",
            f"{target.where} speaks TLS at that port, and {target.setting} does not ask for TLS",
            f"ask for TLS in {target.setting} ({_SERVERS[target.server][3]}), or use the server's plain port",
        )
    return generic(target, exc)


def generic(target: Target, exc: BaseException) -> Diagnosis:
    """The server is away, or answered late: it may pass."""
    text = str(exc).strip() or "no answer in time" if isinstance(exc, TimeoutError) else str(exc).strip()
    return Diagnosis(
        "away",
        f"{target.where} is unreachable: {type(exc).__name__}: {text[:300] or '(no detail)'}",
        f"start {target.name}, or point {target.setting} at a running one",
    )


__all__ = ["Diagnosis", "Target", "causes", "find_cause", "generic", "no_server", "probed", "tls_refused"]
