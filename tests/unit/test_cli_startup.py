"""`vmsched --help` and the light commands start without loading the services, NumPy or the drivers."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

from vmsched_services import SERVICES, _Starter

HEAVY = ("numpy", "asyncpg", "redis", "aio_pika", "vmsched_services.selector.service")

PROBE = """
import json, sys
from vmsched_services.tools import cli
try:
    cli.main(["--help"])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {"numpy", "asyncpg", "redis", "aio_pika"}
                        or m.startswith("vmsched_services.") and m.endswith(".service"))))
"""


def test_help_loads_no_service_numpy_or_server_driver() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith(HEAVY)] == []


def test_every_service_name_leads_to_its_start_coroutine() -> None:
    for name, starter in SERVICES.items():
        module = importlib.import_module(f"vmsched_services.{name.replace('-', '_')}.service")
        assert inspect.iscoroutinefunction(module.start), name
        assert starter == _Starter(name.replace("-", "_"))
