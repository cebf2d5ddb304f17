"""Reaching the three servers: the TLS each URL asks for, and a failed connection named for what it is.

The clients (vmsched.bus.amqp, vmsched.store.redis, vmsched.db.pool) open their own connections;
what they share lives here: `TlsFiles` (one place that turns the VMSCHED_*_TLS_* settings into an
SSLContext, or into redis-py's options), `identify` (which kind of server answers at an address), and
`Target` with the diagnoses every server has in common (TLS refused, nothing listening, another kind of
server, no answer). Each client adds its own refusals (a wrong password, missing rights) beside it.
"""

from vmsched.reach.diagnosis import Diagnosis, Target, causes, find_cause, generic, no_server, probed, tls_refused
from vmsched.reach.probe import Answer, identify
from vmsched.reach.tls import TlsFiles

__all__ = [
    "Answer",
    "Diagnosis",
    "Target",
    "TlsFiles",
    "causes",
    "find_cause",
    "generic",
    "identify",
    "no_server",
    "probed",
    "tls_refused",
]
