"""The lock holder of the stale_holder experiment, as its own process:
`python -m vmsched_services.tools.chaos.holder CLUSTER [CLUSTER ...]` (settings from VMSCHED_* variables).

It takes each cluster's lock (vmsched.store.ClusterLock.hold, as the selector does) and prints
`LOCKED <cluster> <token>` per cluster, then waits for a line `WRITE` on stdin. Meanwhile the
experiment SIGSTOPs it past its lease, takes the locks over and writes, then SIGCONTs it and sends
WRITE: the holder tries its fenced pending write (PendingStore.record with its now stale token) for
each cluster and prints `REFUSED <cluster>` (FencedOut) or `WRITTEN <cluster>`, then `DONE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid

from vmsched.contracts import PendingEntry
from vmsched.errors import FencedOut
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import ClusterLock, PendingStore
from vmsched.store.redis import connect

#: The memory a stale write would add: large enough to stand out in any check of the host.
STALE_MEM_MB = 999_999


def stale_vm(cluster: str) -> str:
    """The VM id of the holder's (stale) write for `cluster`: the experiment looks for it afterwards."""
    return f"stale-{cluster}"


async def hold_then_write(clusters: list[str], settings: Settings) -> int:
    redis = connect(settings)
    locks = ClusterLock(
        redis,
        settings,
        owner=f"chaos-holder-{uuid.uuid4().hex[:6]}",
        recover=Recovery.standalone(redis, settings, "chaos holder"),
    )
    pending = PendingStore(redis, settings)
    reported: set[str] = set()
    try:
        async with contextlib.AsyncExitStack() as stack:
            leases = [await stack.enter_async_context(locks.hold(cid)) for cid in clusters]
            for lease in leases:
                print(f"LOCKED {lease.cluster_id} {lease.token}", flush=True)
            line = await asyncio.to_thread(sys.stdin.readline)
            if line.strip() != "WRITE":
                print(f"unexpected input {line!r}", file=sys.stderr, flush=True)
                return 2
            for lease in leases:
                entry = PendingEntry(
                    vm_id=stale_vm(lease.cluster_id),
                    host_id=f"{lease.cluster_id}-h0",
                    mem_mb=STALE_MEM_MB,
                    vcpus=1,
                    request_id=uuid.uuid4(),
                    fencing_token=lease.token,
                    expires_at=time.time() + 300,
                )
                try:
                    await pending.record(lease.cluster_id, [entry], lease.token)
                except FencedOut:
                    print(f"REFUSED {lease.cluster_id}", flush=True)
                else:
                    print(f"WRITTEN {lease.cluster_id}", flush=True)
                reported.add(lease.cluster_id)
    except Exception as exc:
        # A lock that notices it was lost (and stops its holder) before the write is as safe as a
        # refused write; leaving the lock context of a lost lock may complain too: both are reported.
        for cid in clusters:
            if cid not in reported:
                print(f"ABORTED {cid} {type(exc).__name__}", flush=True)
        print(f"holder: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        await redis.aclose()
    print("DONE", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m vmsched_services.tools.chaos.holder CLUSTER [CLUSTER ...]", file=sys.stderr)
        return 2
    return asyncio.run(hold_then_write(argv, Settings()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
