"""Run one or more services in this process until SIGINT/SIGTERM (`vmsched run`, `vmsched up`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence

from vmsched.bus import Bus
from vmsched.health import Health
from vmsched.health import serve as serve_metrics
from vmsched.logging import configure, get_logger
from vmsched.metrics import set_cluster_label_limit
from vmsched.runtime import DEGRADING_CHECKS, BusRuntime, Runtime
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched.store.catalogues import UnitCatalogues, announce_units
from vmsched_services import BUS_ONLY, SERVICES

log = get_logger("vmsched.runner")

#: Makes the bus the services run on from (settings, service label); the default is RabbitMQ.
BusFactory = Callable[[Settings, str], Bus]


async def run(
    names: Sequence[str],
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    bus: BusFactory | None = None,
) -> None:
    """Start `names` on one Runtime, set `ready`, and run until `stop` is set (or SIGINT/SIGTERM).

    `bus` lets a test run the services on another bus (a MemoryBus on a shared MemoryBroker).
    """
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise SystemExit(f"unknown service(s) {unknown}; known: {', '.join(SERVICES)}")
    label = names[0] if len(names) == 1 else "all"
    configure(settings.log_level, settings.log_format, service=label)
    set_cluster_label_limit(settings.metrics_cluster_labels)
    health = serve_metrics(settings.metrics_port, timeout_s=settings.health_timeout_s, host=settings.metrics_host)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if health is not None:
        health.starting(loop)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    given = bus(settings, label) if bus is not None else None
    if set(names) <= BUS_ONLY:
        # Nothing here reads Redis or PostgreSQL: the bus alone, and no consumer gating on them.
        brt = await BusRuntime.open(settings, service=label, bus=given)
        await _serve(brt, names, stop, ready, health)
        return
    # Plugins are loaded (and any refusal logged) once, before a service can need a unit.
    units = {u.name: u.origin for u in REGISTRY.load(settings).values()}
    rt = await Runtime.open(settings, service=label, bus=given)
    try:
        # Spawned first: its first announcement goes out while the services below connect.
        rt.spawn(announce_units(UnitCatalogues(rt.redis, settings), names, units), "unit-catalogue")
        # Nothing is consumed before the servers the services need are known to answer.
        await rt.bus.pause_consuming()
        for name in (n for n in SERVICES if n in names):  # start order: state-tracker first
            await SERVICES[name](rt)
            log.info("service started", name=name)
        await rt.check_postgres_at_start()
        await rt.gate_consuming()
        rt.spawn(rt.consume_while_ready(), "consume-while-ready")
        if health is not None:
            health.ready(rt.readiness_checks(), degrading=DEGRADING_CHECKS)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("stopping", services=list(names))
    finally:
        if health is not None:
            health.stopping()
        await rt.close()
        _restore_signals(loop)


async def _serve(
    rt: BusRuntime, names: Sequence[str], stop: asyncio.Event, ready: asyncio.Event | None, health: Health | None
) -> None:
    """Run bus-only services (BUS_ONLY) on `rt` until `stop` is set."""
    try:
        for name in names:
            await SERVICES[name](rt)
            log.info("service started", name=name)
        if health is not None:
            health.ready(rt.readiness_checks())
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("stopping", services=list(names))
    finally:
        if health is not None:
            health.stopping()
        await rt.close()
        _restore_signals(asyncio.get_running_loop())


def _restore_signals(loop: asyncio.AbstractEventLoop) -> None:
    # Python's own handlers again: a process that goes on after the services (a test, a
    # command that ran them in-process) must not have its Ctrl-C go to a finished run.
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)
