"""A private PostgreSQL: `initdb` (trust authentication, or with `password` scram-sha-256 over TCP)
into a directory of its own, then `postgres` on a free loopback port, for the experiments and tests
that stop PostgreSQL under running services or need password logins.

PostgreSQL refuses to run as root, so under root the cluster's files belong to the `postgres` user
and both programs run as that user. Its files live in a directory of their own under the system's
temporary directory (a test's tmp_path is often closed to other users); `remove()` deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg

from vmsched_services.tools.servers.base import PrivateServer, TlsListener

#: Where the PostgreSQL programs are (a Debian install links them here).
BIN = Path(os.environ.get("VMSCHED_PG_BIN", "/usr/local/bin"))
#: The user PostgreSQL runs as when we are root.
PG_USER = "postgres"


class PrivatePostgres(PrivateServer):
    name = "postgres"

    def __init__(
        self, directory: Path, port: int | None = None, *, tls: TlsListener | None = None, password: str | None = None
    ) -> None:
        super().__init__(directory, port)
        #: The password of PG_USER, asked for over TCP (scram-sha-256); the Unix socket stays trusted.
        self.password = password
        self.home = Path(tempfile.mkdtemp(prefix="vmsched-pg-"))
        self.data = self.home / "data"
        self._owner = pwd.getpwnam(PG_USER) if os.geteuid() == 0 else None
        if self._owner is not None:
            os.chown(self.home, self._owner.pw_uid, self._owner.pw_gid)
        #: ssl=on, and TCP connections only over TLS (pg_hba.conf: hostssl; with `client_cert_required`,
        #: clientcert=verify-ca); the Unix socket stays trusted (start() checks over it).
        self.tls = tls

    @property
    def dsn(self) -> str:
        """The URL of database `vmsched` on this server (created by `vmsched db migrate` / migrate());
        with TLS, sslmode=verify-full."""
        return self.url("vmsched")

    def url(self, database: str) -> str:
        """The URL of `database` on this server, with the password if it has one."""
        auth = f"{PG_USER}:{quote(self.password, safe='')}" if self.password is not None else PG_USER
        tls = "?sslmode=verify-full" if self.tls is not None else ""
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}{tls}"

    def _as_owner(self) -> dict[str, Any]:
        if self._owner is None:
            return {}
        return {"user": self._owner.pw_uid, "group": self._owner.pw_gid, "extra_groups": []}

    def initdb(self) -> None:
        """Create the cluster's files (once): trust authentication, or with a password scram-sha-256
        over TCP; no fsync (it is thrown away)."""
        if (self.data / "PG_VERSION").exists():
            return
        auth = ["-A", "trust"]
        if self.password is not None:
            pwfile = self.home / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._owner is not None:
                os.chown(pwfile, self._owner.pw_uid, self._owner.pw_gid)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        with self.log_path.open("ab") as log:
            subprocess.run(
                [str(BIN / "initdb"), "-D", str(self.data), *auth, "-U", PG_USER, "--no-sync"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                check=True,
                **self._as_owner(),
            )

    def command(self) -> Sequence[str]:
        # -k: the Unix socket in our own directory (not /var/run/postgresql, the shared server's).
        cmd = [
            str(BIN / "postgres"),
            *("-D", str(self.data), "-p", str(self.port), "-k", str(self.home), "-h", "127.0.0.1"),
            *("-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"),
        ]
        if self.tls is not None:
            tls = self.home / "tls"
            cmd += [
                "-c",
                "ssl=on",
                "-c",
                f"ssl_cert_file={tls / 'server.pem'}",
                "-c",
                f"ssl_key_file={tls / 'server.key'}",
            ]
            cmd += ["-c", f"ssl_ca_file={tls / 'ca.pem'}", "-c", f"hba_file={tls / 'pg_hba.conf'}"]
        return cmd

    def _write_tls_files(self) -> None:
        """The certificates, copied where the server's user may read them (a key readable by others is
        refused), and a pg_hba.conf taking TCP connections over TLS only."""
        if self.tls is None:
            return
        tls = self.home / "tls"
        tls.mkdir(exist_ok=True)
        for source, name in ((self.tls.cert, "server.pem"), (self.tls.key, "server.key"), (self.tls.ca, "ca.pem")):
            shutil.copyfile(source, tls / name)
        (tls / "server.key").chmod(0o600)
        client = " clientcert=verify-ca" if self.tls.client_cert_required else ""
        method = "scram-sha-256" if self.password is not None else "trust"
        (tls / "pg_hba.conf").write_text(f"local all all trust\nhostssl all all 127.0.0.1/32 {method}{client}\n")
        if self._owner is not None:
            for path in (tls, *tls.iterdir()):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)

    def spawn(self) -> None:
        self.initdb()
        self._write_tls_files()
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                list(self.command()),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=self.environment(),
                start_new_session=True,
                **self._as_owner(),
            )

    async def start(self, timeout_s: float = 30.0) -> None:
        """Started, and past recovery: the port accepts before the server takes sessions ("the
        database system is starting up"), so a session is opened to know."""
        deadline = time.monotonic() + timeout_s
        await super().start(timeout_s)
        while True:
            try:
                # Over the Unix socket: pg_hba.conf may want TLS and a client certificate over TCP.
                conn = await asyncpg.connect(
                    user=PG_USER, host=str(self.home), port=self.port, database="postgres", timeout=2
                )
            except (OSError, asyncpg.PostgresError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres on port {self.port} takes no sessions: {exc}; {self.tail()}") from exc
                await asyncio.sleep(0.05)
            else:
                await conn.close()
                return

    async def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM is PostgreSQL's "smart" shutdown, which waits for every client to leave: SIGINT
        ("fast") ends their sessions, as an operator's `pg_ctl stop` does."""
        self.thaw()
        self.signal(signal.SIGINT)
        if not await self._reap(timeout_s):
            await self.kill()

    def remove(self) -> None:
        """Delete the cluster's files (after stop or kill)."""
        with contextlib.suppress(OSError):
            shutil.rmtree(self.home)


__all__ = ["PrivatePostgres"]
