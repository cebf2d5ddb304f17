"""A failed connection to PostgreSQL named for what it is (DatabaseUnavailable with its `kind` and
`hint`): the login refused (password, role, pg_hba.conf), no right to the database, TLS refused
(including a client certificate the server wants), nothing listening, another kind of server at the
address, or the server away (vmsched.reach has the kinds every server shares).
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from asyncpg import exceptions as pg_errors

from vmsched.errors import DatabaseUnavailable
from vmsched.reach import Diagnosis, Target, TlsFiles, find_cause, generic, no_server, probed, tls_refused

#: What the server says when pg_hba.conf wants a client certificate and got none, or one it refused.
_CLIENT_CERT_TEXT = ("client certificate", "certificate authentication")


def _database(dsn: str) -> str:
    try:
        return unquote(urlsplit(dsn).path.lstrip("/")) or "(the user's own)"
    except ValueError:
        return "(unreadable)"


def refusal(t: Target, exc: BaseException) -> Diagnosis | None:
    """The server's own refusals: the login, the role, pg_hba.conf, a client certificate, the database."""
    user = t.user or "(the login name)"
    refused = find_cause(exc, (pg_errors.InvalidPasswordError, pg_errors.InvalidAuthorizationSpecificationError))
    if refused is not None and any(text in str(refused) for text in _CLIENT_CERT_TEXT):
        tls = t.tls or TlsFiles(prefix="VMSCHED_POSTGRES_TLS")
        given = f"the one in {tls.cert_file}" if tls.cert_file else "none was given"
        return Diagnosis(
            "tls_refused",
            f"{t.where} refused the connection: {refused}; it wants a client certificate it trusts, and {given}",
            f"set {tls.prefix}_CERT_FILE and {tls.prefix}_KEY_FILE to a certificate signed by a CA the server "
            f"trusts, whose name (CN) is the user {user}",
        )
    if refused is not None:
        return Diagnosis(
            "login_refused",
            f"{t.where} refused the login of user {user!r}: {refused}",
            f"check the user name and password in {t.setting} (and that pg_hba.conf lets that user in from "
            "this host, over TLS if the URL asks for it)",
        )
    denied = find_cause(exc, pg_errors.InsufficientPrivilegeError)
    if denied is not None:
        return Diagnosis(
            "permission_refused",
            f"{t.where} refused user {user!r} access to database {_database(t.url)!r}: {denied}",
            f"GRANT CONNECT ON DATABASE {_database(t.url)} TO {user} (and the rights on its tables: "
            "docs/operating.md), or use another user in " + t.setting,
        )
    return None


def diagnose(dsn: str, exc: BaseException, tls: TlsFiles | None) -> DatabaseUnavailable:
    """`exc`, raised connecting to PostgreSQL at `dsn`, as the DatabaseUnavailable that names what went
    wrong. May ask what answers at the address (blocking, a few seconds at most): run it in a thread."""
    t = Target("postgres", dsn, tls)
    found = refusal(t, exc) or tls_refused(t, exc) or no_server(t, exc)
    if found is None:
        # An error of the server's own says PostgreSQL answers: nothing to ask at the address.
        found = generic(t, exc) if find_cause(exc, pg_errors.PostgresError) else probed(t, exc)
    return DatabaseUnavailable(found.message, kind=found.kind, hint=found.hint)


__all__ = ["diagnose", "refusal"]
