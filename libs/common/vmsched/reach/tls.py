"""The client side of TLS for every server, built in this one place from the VMSCHED_*_TLS_* settings.

aio-pika and asyncpg take an SSLContext (`TlsFiles.context`); redis-py builds its own from file names
(`TlsFiles.redis_options`), which carry the same files and the same checks. The server's certificate is
always verified: against the CA file when one is set, else against the system's CAs.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from typing import Any, Literal

from vmsched.settings import Settings

Server = Literal["amqp", "redis", "postgres"]


@dataclass(frozen=True)
class TlsFiles:
    """The CA, client certificate and key (PEM file names, "" for none) for one server."""

    #: The settings' common prefix, for messages (VMSCHED_REDIS_TLS).
    prefix: str
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def of(cls, settings: Settings, server: Server) -> TlsFiles:
        return cls(
            prefix=f"VMSCHED_{server.upper()}_TLS",
            ca_file=getattr(settings, f"{server}_tls_ca_file"),
            cert_file=getattr(settings, f"{server}_tls_cert_file"),
            key_file=getattr(settings, f"{server}_tls_key_file"),
        )

    def context(self, *, check_hostname: bool = True) -> ssl.SSLContext:
        """A client SSLContext: the server's certificate verified (and its host name, unless told not
        to), the client certificate offered if one is set. Built once per set of files."""
        return _context(self.ca_file, self.cert_file, self.key_file, check_hostname)

    def redis_options(self) -> dict[str, Any]:
        """The same files and checks as redis-py's connection options (it takes no SSLContext)."""
        return {
            "ssl_ca_certs": self.ca_file or None,
            "ssl_certfile": self.cert_file or None,
            "ssl_keyfile": self.key_file or None,
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": True,
        }

    def checked_against(self) -> str:
        """What the server's certificate is checked against, for messages."""
        if self.ca_file:
            return f"the CA in {self.ca_file} ({self.prefix}_CA_FILE)"
        return f"the system's CAs ({self.prefix}_CA_FILE is not set)"


@functools.lru_cache(maxsize=16)
def _context(ca_file: str, cert_file: str, key_file: str, check_hostname: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file or None)
    context.check_hostname = check_hostname
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def postgres_sslmode(dsn: str) -> str | None:
    """The sslmode a PostgreSQL URL asks for (its last `sslmode=` query parameter), else None."""
    _, _, query = dsn.partition("?")
    modes = [p.partition("=")[2] for p in query.split("&") if p.startswith("sslmode=")]
    return modes[-1] if modes else None


def postgres_context(dsn: str, files: TlsFiles) -> ssl.SSLContext | None:
    """The SSLContext for a PostgreSQL URL that asks for TLS (sslmode require, verify-ca or verify-full),
    else None (the driver's own handling of the other modes). "require" is verified too, as verify-full:
    the certificate is always checked; verify-ca leaves out the host name."""
    mode = postgres_sslmode(dsn)
    if mode not in ("require", "verify-ca", "verify-full"):
        return None
    return files.context(check_hostname=mode != "verify-ca")


__all__ = ["Server", "TlsFiles", "postgres_context", "postgres_sslmode"]
