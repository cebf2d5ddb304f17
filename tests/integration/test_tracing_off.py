"""With tracing off, a process that runs the services and decides imports no opentelemetry module
of its own accord: none beyond those the client drivers load themselves (redis-py 8 imports the
OpenTelemetry metrics SDK whenever it is installed, for an observability it leaves off until asked)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vmsched.db import migrate
from vmsched.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def test_with_tracing_off_a_process_that_decides_imports_no_opentelemetry(
    settings: Settings, database: str, unique: str, delete_after: list[Settings]
) -> None:
    cfg = settings.model_copy(
        update={"postgres_url": database, "amqp_prefix": f"{settings.amqp_prefix}off-{unique}.", "tracing_endpoint": ""}
    )
    delete_after.append(cfg)
    await migrate(database)
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        import aio_pika, asyncpg, redis.asyncio
        drivers = {m for m in sys.modules if m.startswith("opentelemetry")}
        from tests import factories
        from tests.integration.conftest import services
        from vmsched.client import SchedulerClient
        from vmsched.settings import Settings

        async def main() -> None:
            cfg = Settings(**json.loads(sys.argv[1]))
            async with services(cfg, "state-tracker", "filter-worker", "selector"):
                async with SchedulerClient(cfg) as client:
                    await factories.make_cluster(client, "off", 1, cpu_cores=8, physical_mem_mb=8192,
                                                 mem_free_mb=8192, reserved_mem_mb=0)
                    decision = await client.schedule("off", factories.vm_spec("vm-off", mem_mb=512, vcpus=1))
            ours = sorted(m for m in sys.modules if m.startswith("opentelemetry") and m not in drivers)
            print(json.dumps({"status": decision.status.value, "otel": ours}))

        asyncio.run(main())
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VMSCHED_TRACING"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "libs" / "common"), str(ROOT / "services")])
    values = cfg.model_dump(mode="json")
    run = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, json.dumps(values)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"status": "placed", "otel": []}
