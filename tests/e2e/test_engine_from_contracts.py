"""The proof that contracts/ is complete: an engine written from it alone gets a VM placed.

tests/e2e/contract_engine.py (aio-pika, jsonschema and the JSON files; no vmsched import, no vmsched
wire name spelt out) is copied with contracts/ into a scratch directory and run there as a
subprocess in which vmsched cannot even be imported, against the service processes, under the
run's AMQP prefix. If the engine needs to know something contracts/ does not say, this fails: say
it in asyncapi.json (vmsched_services.tools.asyncapi), not in the engine.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import run_program
from tests.e2e.conftest import ServiceStack
from vmsched import constants as c
from vmsched.bus import dispatch
from vmsched.bus.amqp import REPLY_TO
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.asyncapi import asyncapi

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENGINE = Path(__file__).with_name("contract_engine.py")
#: Run in the subprocess before the engine: vmsched is installed in this interpreter, so make sure
#: the engine cannot lean on it, even by accident.
NO_VMSCHED = (
    "import runpy, sys; sys.modules.update(dict.fromkeys(['vmsched', 'vmsched_services', 'tests'])); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
ENGINE_TIMEOUT_S = 120.0


def _wire_names() -> set[str]:
    """Every name vmsched puts on the wire: the engine must read each from contracts/, not spell it.

    The document's own channel and operation names (`schedule`, `hostReport`) are how the engine
    finds its way in asyncapi.json, not wire names, even where a route has the same spelling.
    """
    names = {*c.RPC_EXCHANGES, c.EVENTS_EXCHANGE, c.DEAD_LETTER_EXCHANGE, c.DEAD_LETTER_QUEUE, c.STATE_EVENTS_QUEUE}
    names |= set(c.RPC_QUEUES) | set(c.RPC_QUEUES.values()) | set(c.CLUSTER_KEYED_EVENTS.values())
    names |= {REPLY_TO, c.POLICY_CHANGED, c.STATE_EVENTS_BINDING}
    for module in (c, dispatch):
        names |= {v for k, v in vars(module).items() if k.startswith("HEADER_") and isinstance(v, str)}
    doc = asyncapi()
    return names - set(doc["channels"]) - set(doc["operations"])


def test_the_engine_uses_only_aio_pika_jsonschema_and_the_standard_library() -> None:
    tree = ast.parse(ENGINE.read_text())
    imported = {
        (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported - set(sys.stdlib_module_names) == {"aio_pika", "jsonschema"}


def test_the_engine_spells_no_wire_name_of_its_own() -> None:
    strings = {
        node.value
        for node in ast.walk(ast.parse(ENGINE.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    # A name ends where a longer one cannot go on: x-vmsched-error-codes is a document key, not the header.
    spelt = {name for name in _wire_names() for s in strings if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", s)}
    assert spelt == set(), f"the engine must read these from contracts/: {sorted(spelt)}"


async def _make_redis_forget(settings: Settings, cluster: str, loss_dir: Path, engine: asyncio.Task[Any]) -> None:
    """Once the engine's VM runs, delete the cluster's Redis keys and its decision: what a restart
    without data does."""
    while not (loss_dir / "placed").exists():
        if engine.done():
            return
        await asyncio.sleep(0.05)
    redis = connect_redis(settings)
    try:
        k = Keys.from_settings(settings)
        decided = (loss_dir / "placed").read_text()
        await redis.delete(*k.of_cluster(cluster), k.generation(cluster), k.decision(cluster, decided))
        for pattern in k.cluster_patterns(cluster):
            async for key in redis.scan_iter(match=pattern):
                await redis.delete(key)
    finally:
        await redis.aclose()
    (loss_dir / "forgotten").write_text("")


async def test_an_engine_written_from_contracts_alone_gets_a_vm_placed(
    stack: ServiceStack, tmp_path: Path, unique: str
) -> None:
    await stack.start("state-tracker", "filter-worker", "weigher", "selector")
    scratch = tmp_path / "engine"
    shutil.copytree(ROOT / "contracts", scratch / "contracts")
    shutil.copy(ENGINE, scratch / "engine.py")
    cluster = f"from-contracts-{unique}"

    settings = stack.settings
    loss_dir = tmp_path / "loss"
    loss_dir.mkdir()
    engine = asyncio.create_task(
        run_program(
            sys.executable,
            "-I",
            "-c",
            NO_VMSCHED,
            "engine.py",
            "contracts",
            settings.amqp_url,
            settings.amqp_prefix,
            cluster,
            str(loss_dir),
            cwd=scratch,
            timeout=ENGINE_TIMEOUT_S,
        )
    )
    await _make_redis_forget(settings, cluster, loss_dir, engine)
    code, out, err = await engine
    assert code == 0, err[-4000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])

    hosts = [f"{cluster}-h{i}" for i in range(3)]
    assert result["hosts"] == hosts  # the host with a field from a newer engine is among them
    assert result["reply_type"] == "ScheduleDecision"
    decision = result["decision"]
    assert decision["status"] == "placed", decision["explanation"]["summary"]
    assert decision["host_id"] in hosts
    assert decision["cluster_id"] == cluster
    assert result["event"] == decision  # the decision event is the reply, as published

    # Redis forgot the cluster: refused (retryable) until the engine's full report, then decided;
    # the request decided before the loss is not placed a second time.
    loss = result["loss"]
    assert loss["refused"]["status"] == "error"
    assert loss["refused"]["error"]["code"] == "state_resyncing"
    assert loss["asked"]["cluster_id"] == cluster
    assert loss["after"]["status"] == "placed", loss["after"]
    assert loss["replay"]["error"]["code"] == "decision_lost"
    assert {"state_resyncing", "decision_lost"} <= set(result["error_codes"])

    error = result["error"]
    assert error["failed"] is True
    assert error["schema_refuses"] is True
    assert error["code"] == "invalid_request"
    assert error["code"] in result["error_codes"]
    assert error["location"] == "vm.mem_mb"
