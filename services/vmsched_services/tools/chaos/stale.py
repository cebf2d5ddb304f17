"""The stale_holder experiment: a lock holder frozen past its lease, the lock taken over and written,
the holder resumed to try its fenced write, which must be refused."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from vmsched.contracts import PendingEntry
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.chaos.base import (
    Result,
    experiment_settings,
    run_tag,
    timed,
)
from vmsched_services.tools.chaos.holder import stale_vm
from vmsched_services.tools.procs import settings_env


async def stale_holder(
    base: Settings, log_dir: Path, *, trials: int = 20, per_round: int = 5, hold_s: float | None = None
) -> Result:
    """A lock holder process is SIGSTOPped past its lease; this process takes the lock over and
    writes; the holder is SIGCONTed and tries its fenced pending write: every one is refused.

    `per_round` clusters share one holder process (one stop per round). `hold_s` replaces the
    hold timeout (None: the Settings default); the takeover is awaited, not assumed, so the
    experiment holds for a lock whose hold timeout is its TTL as for a short renewed lease.
    """
    res = Result("stale_holder", {"trials": trials, "per_round": per_round})
    with timed(res):
        overrides = {} if hold_s is None else {"lock_hold_timeout_s": hold_s}
        settings = experiment_settings(base, "stale-holder", **overrides)
        hold = settings.lock_hold_timeout_s
        tag = run_tag("sh")
        await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
        redis = connect_redis(settings)
        taker = _Taker(settings, redis, res.notes)
        try:
            for r in range((trials + per_round - 1) // per_round):
                names = [f"{tag}-r{r}-c{i}" for i in range(min(per_round, trials - r * per_round))]
                await taker.round(names, log_dir / f"holder-{r}.stderr")
        finally:
            await redis.aclose()
        res.figures["refused"] = taker.outcomes["REFUSED"] + taker.outcomes["ABORTED"]
        res.figures["refused_by_fence"] = taker.outcomes["REFUSED"]
        res.figures["aborted_before_write"] = taker.outcomes["ABORTED"]
        res.figures["written"] = taker.outcomes["WRITTEN"]
        res.figures["stale_writes_landed"] = taker.landed
        res.figures["takeover_max_s"] = round(max(taker.takeovers, default=0.0), 3)
        res.figures["hold_timeout_s"] = hold
        res.check("refused", ">=", trials)
        res.check("written", "==", 0)
        res.check("stale_writes_landed", "==", 0)
        res.check_timing("takeover_max_s", "<=", hold + 1.0, short_bound=3 * hold + 5.0)
    return res


@dataclass
class _Taker:
    """stale_holder's side of the lock: per round, it starts a holder process (holder.py) on some
    clusters, stops it once it holds their locks, takes each lock over and writes, resumes the
    holder for its stale write, and counts what became of it. `notes` gets what went wrong here."""

    settings: Settings
    redis: Redis
    notes: list[str]
    #: The holder's reports: REFUSED, WRITTEN, ABORTED (holder.py).
    outcomes: Counter[str] = field(default_factory=Counter)
    #: Seconds from stopping the holder to taking a lock over.
    takeovers: list[float] = field(default_factory=list)
    #: The holder's stale writes found in the pending store.
    landed: int = 0
    locks: ClusterLock = field(init=False)
    pending: PendingStore = field(init=False)

    def __post_init__(self) -> None:
        self.locks = ClusterLock(
            self.redis,
            self.settings,
            owner="chaos-taker",
            recover=Recovery.standalone(self.redis, self.settings, "chaos taker"),
        )
        self.pending = PendingStore(self.redis, self.settings)

    async def round(self, names: list[str], stderr: Path) -> None:
        proc = await start_holder(self.settings, names, stderr)
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            tokens = await read_tokens(proc.stdout, len(names), stderr)
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            await asyncio.gather(*(self._take_over(cid, tokens[cid], stopped) for cid in names))
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write(b"WRITE\n")
            await proc.stdin.drain()
            self.outcomes.update(await read_outcomes(proc.stdout))
            await self._look_for_writes(names)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
            await proc.wait()
        for cid in names:
            await self.redis.delete(*(k for k in _cluster_keys(self.settings, cid)))

    async def _take_over(self, cid: str, holder_token: int, stopped: float) -> None:
        # Waits for the stopped holder's lock to lapse: bounded by its hold timeout.
        lease = await self.locks.acquire(cid, timeout_s=self.settings.lock_hold_timeout_s + 5.0)
        try:
            self.takeovers.append(time.monotonic() - stopped)
            if lease.token <= holder_token:
                raise RuntimeError(f"token {lease.token} after the holder's {holder_token}")
            await self.pending.record(cid, [taker_entry(cid, lease.token)], lease.token)
        finally:
            await self.locks.release(lease)

    async def _look_for_writes(self, names: list[str]) -> None:
        for cid in names:
            if await self.pending.get(cid, stale_vm(cid)) is not None:
                self.landed += 1
            if await self.pending.get(cid, f"taker-{cid}") is None:
                self.notes.append(f"the taker's own write to {cid} is missing")


def taker_entry(cid: str, token: int) -> PendingEntry:
    """The pending record the lock's new holder writes (with its own, valid token) after the takeover."""
    return PendingEntry(
        vm_id=f"taker-{cid}",
        host_id=f"{cid}-h1",
        mem_mb=1024,
        vcpus=1,
        request_id=uuid.uuid4(),
        fencing_token=token,
        expires_at=time.time() + 300,
    )


async def start_holder(settings: Settings, names: list[str], stderr: Path) -> asyncio.subprocess.Process:
    with stderr.open("wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vmsched_services.tools.chaos.holder",
            *names,
            env={**settings_env(settings), "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )


async def read_tokens(stdout: asyncio.StreamReader, clusters: int, stderr: Path) -> dict[str, int]:
    """The holder's fencing token per cluster, from its `LOCKED <cluster> <token>` lines."""
    tokens: dict[str, int] = {}
    async with asyncio.timeout(30):
        while len(tokens) < clusters:
            line = (await stdout.readline()).decode().split()
            if not line:
                raise RuntimeError(f"holder exited before locking; see {stderr}")
            if line[0] == "LOCKED":
                tokens[line[1]] = int(line[2])
    return tokens


async def read_outcomes(stdout: asyncio.StreamReader) -> Counter[str]:
    """What the holder reported of its stale writes, up to its `DONE`."""
    outcomes: Counter[str] = Counter()
    async with asyncio.timeout(30):
        while True:
            line = (await stdout.readline()).decode().split()
            if not line or line[0] == "DONE":
                break
            if line[0] in ("REFUSED", "WRITTEN", "ABORTED"):
                outcomes[line[0]] += 1
    return outcomes


def _cluster_keys(settings: Settings, cid: str) -> list[str]:
    k = Keys.from_settings(settings)
    return [k.lock(cid), k.fence(cid), k.pending(cid), k.pending_version(cid)]
