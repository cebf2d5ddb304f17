"""Which kind of server answers at an address: asked when a connection failed in a way that does not say
(no answer in time, a reply the client could not read), so the failure can name what is there instead.

Two greetings, on two short connections: `PING\\r\\n\\r\\n`, which Redis answers (+PONG, or -NOAUTH / -ERR),
RabbitMQ answers with its AMQP protocol header, and a TLS server with an alert record; then, if nothing
came back, PostgreSQL's SSLRequest, which PostgreSQL answers with one byte, S or N. Blocking sockets with
short timeouts: callers in an event loop run it in a thread.
"""

from __future__ import annotations

import socket
import ssl
from typing import Final, Literal

#: "nothing": connection refused; "silent": it accepts but says nothing to either greeting; "unknown":
#: it says something none of these would.
Answer = Literal["redis", "amqp", "postgresql", "tls", "nothing", "silent", "unknown"]

#: Eight bytes: RabbitMQ answers only once it has read a whole protocol header; Redis ignores the empty line.
PING = b"PING\r\n\r\n"
#: PostgreSQL's SSLRequest: length 8, code 80877103.
SSL_REQUEST = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")
#: A TLS alert record (content type 21), which a TLS server sends for bytes that are not TLS.
TLS_ALERT = 0x15
#: What a kind of server is called in messages.
NAMES: dict[str, str] = {"redis": "Redis", "amqp": "RabbitMQ (AMQP)", "postgresql": "PostgreSQL"}


def identify(host: str, port: int, timeout_s: float = 1.5) -> Answer:
    """The kind of server at host:port, by its answer to PING and to an SSLRequest."""
    try:
        first = _exchange(host, port, PING, timeout_s)
    except ConnectionRefusedError:
        return "nothing"
    except OSError:
        return "unknown"
    if first is not None and first:
        if first.startswith((b"+PONG", b"-")):
            return "redis"
        if first.startswith(b"AMQP"):
            return "amqp"
        return "tls" if first[0] == TLS_ALERT else "unknown"
    try:
        second = _exchange(host, port, SSL_REQUEST, timeout_s)
    except OSError:
        return "unknown"
    if second in (b"S", b"N"):
        return "postgresql"
    if second:
        return "tls" if second[0] == TLS_ALERT else "unknown"
    return "silent" if first is None and second is None else "unknown"


#: What `handshake_refusal` says of a server that reset or closed the connection once the handshake
#: was done, before we sent a byte: a server that took us would wait for our first bytes, so it
#: refused us. Under TLS 1.3 that is how a refused client certificate (or a missing one) looks when
#: its alert is not read.
CLOSED_AFTER_HANDSHAKE: Final = "closed after the handshake"


def handshake_refusal(
    host: str, port: int, context: ssl.SSLContext, timeout_s: float = 1.5
) -> ssl.SSLError | Literal["closed after the handshake"] | None:
    """The TLS error a handshake with host:port ends in, else None. The read after it matters: under
    TLS 1.3 a server refuses the client's certificate (or its lack) only after the client finished, in
    an alert that a client busy writing its first bytes may never read (it sees the connection reset);
    a reset or close before we sent anything, once the handshake is done, is that refusal too
    (CLOSED_AFTER_HANDSHAKE)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            try:
                tls = context.wrap_socket(raw, server_hostname=host)
            except ssl.SSLError as exc:
                return exc
            with tls:
                return _after_handshake(tls)
    except OSError:  # no answer in time, or nothing there
        return None


def _after_handshake(tls: ssl.SSLSocket) -> ssl.SSLError | Literal["closed after the handshake"] | None:
    """What the server does once the handshake is done and we say nothing: a server that took us
    waits for our first bytes (no answer in time: None)."""
    try:
        got = tls.recv(1)
    except ssl.SSLEOFError:  # closed without a word: not "no TLS here", the handshake went through
        return CLOSED_AFTER_HANDSHAKE
    except ssl.SSLError as exc:  # its alert: the reason, by name
        return exc
    except (ConnectionResetError, BrokenPipeError):
        return CLOSED_AFTER_HANDSHAKE
    except OSError:
        return None
    return CLOSED_AFTER_HANDSHAKE if got == b"" else None


def _exchange(host: str, port: int, greeting: bytes, timeout_s: float) -> bytes | None:
    """What the server sends back to `greeting` (b"" if it just closes), None if nothing in time."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(greeting)
        try:
            return sock.recv(64)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return b""


__all__ = ["CLOSED_AFTER_HANDSHAKE", "NAMES", "SSL_REQUEST", "Answer", "handshake_refusal", "identify"]
