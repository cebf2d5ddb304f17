"""What the end-to-end tests do as a user or an operator would: run `vmsched ...` (or any program) as
a child process and read what it printed, and store a policy and attach it to a cluster."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path

from vmsched.db import PolicyRepository
from vmsched.db import connect as connect_pg
from vmsched.scheduling.policy import Policy
from vmsched.settings import Settings
from vmsched_services.tools.procs import settings_env

#: How long a CLI command may take unless the test says otherwise.
CLI_TIMEOUT_S = 60.0


async def run_program(
    *argv: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float
) -> tuple[int, str, str]:
    """Run `argv` to its end; returns its exit code, stdout and stderr. A program still running after
    `timeout` seconds is killed (and the test fails with TimeoutError)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=None if env is None else dict(env),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def vmsched(
    env: Settings | Mapping[str, str], *args: str, timeout: float = CLI_TIMEOUT_S
) -> tuple[int, str, str]:
    """`vmsched ARGS` in a child process, with the environment `env` (or the one that gives it `env`'s
    settings); returns its exit code, stdout and stderr."""
    environ = settings_env(env) if isinstance(env, Settings) else env
    return await run_program(sys.executable, "-m", "vmsched_services.tools.cli", *args, env=environ, timeout=timeout)


async def attach_policy(
    settings: Settings, cluster: str, policy: Policy | str, properties: Mapping[str, str] | None = None
) -> None:
    """Make `policy` the policy of `cluster` (with `properties` over its own), in the database of
    `settings`; a Policy is stored first, a name is one already stored (a built-in)."""
    pool = await connect_pg(settings.postgres_url)
    try:
        repo = PolicyRepository(pool)
        if isinstance(policy, Policy):
            await repo.create(policy)
        await repo.set_cluster_policy(
            cluster, policy.id if isinstance(policy, Policy) else policy, properties=properties
        )
    finally:
        await pool.close()
