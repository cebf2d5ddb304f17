"""The state tracker's intake: reports that wait are applied together, in the order they came.

Each delivery's handler puts its report in a ReportQueue and waits for its outcome; the dispatcher
then acks it (or dead-letters it with the exception it gets back), so a message is acked only once
what it says is in Redis. One drain task takes what waits (at most `max_batch`) and applies it:

* host and VM reports between two others ("barriers": removals, cluster reports, resync ends) go by
  cluster, each cluster's in their order, as one run (`apply_run`). Clusters' states share no key, so
  taking cluster B's reports before cluster A's earlier ones leaves Redis as the order they came in
  would; only a cluster's own reports must keep their order, and they do;
* a barrier is applied alone (`apply_one`) after everything before it and before anything after.

Nothing waits for a batch to fill: the drain takes what arrived while the last batch was applied,
so a lone report is applied at once and batches grow only when reports come faster than they are
applied. `apply_run` says each report's outcome (None or the exception its handler raises), so a
bad report is refused on its own while the rest of its run is applied.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from vmsched.contracts import Message
from vmsched.logging import get_logger

log = get_logger(__name__)

#: The most reports one drain takes: bounds a commit's size (one Lua script's arguments).
MAX_BATCH = 256

#: Applies one report; raises what its handler should raise.
ApplyOne = Callable[[Message], Awaitable[None]]
#: Applies a run of one cluster's reports; returns each report's outcome, in order.
ApplyRun = Callable[[str, Sequence[Message]], Awaitable[Sequence[BaseException | None]]]
#: The cluster whose run a report may join; None for a report applied alone.
RunOf = Callable[[Message], str | None]

_Waiting = tuple[Message, "asyncio.Future[None]"]


class ReportQueue:
    """Applies submitted reports in submission order, those waiting together (module docstring)."""

    def __init__(self, apply_one: ApplyOne, apply_run: ApplyRun, run_of: RunOf, *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._apply_one = apply_one
        self._apply_run = apply_run
        self._run_of = run_of
        self._max_batch = max_batch
        self._waiting: deque[_Waiting] = deque()
        self._drain: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        """Reports waiting to be taken (not those being applied)."""
        return len(self._waiting)

    async def submit(self, report: Message) -> None:
        """Apply `report` after every report submitted before it; returns once it is in Redis, or
        raises what applying it raised. Queued before the first await, so reports are applied in
        the order their handlers were called."""
        # A handler cancelled while waiting (its consumer closing) cancels `done`: the drain skips
        # the report if it has not taken it yet, as a handler waiting for its turn never applied it.
        await self._queue([report])[0]

    async def submit_all(self, reports: Sequence[Message]) -> list[BaseException | None]:
        """Apply `reports` (one message's), in order, after every report submitted before them, as
        `submit` does each; returns each one's outcome once all are settled. A cancellation of the
        caller cancels those not taken yet, as it does a lone report's."""
        waiting = self._queue(reports)
        if not waiting:
            return []
        try:
            await asyncio.wait(waiting)
        except asyncio.CancelledError:
            for done in waiting:
                done.cancel()
            raise
        for done in waiting:
            if done.cancelled():
                raise asyncio.CancelledError("the state tracker is stopping")
        return [done.exception() for done in waiting]

    def _queue(self, reports: Sequence[Message]) -> list[asyncio.Future[None]]:
        if self._closed:
            # The service is stopping: the report is left unacked, for the broker to deliver again.
            raise asyncio.CancelledError("the state tracker is stopping")
        loop = asyncio.get_running_loop()
        waiting: list[asyncio.Future[None]] = []
        for report in reports:
            done: asyncio.Future[None] = loop.create_future()
            self._waiting.append((report, done))
            waiting.append(done)
        if self._drain is None or self._drain.done():
            # A context of its own: not the first handler's (its sender, its log bindings).
            self._drain = asyncio.create_task(self._run(), name="state-reports", context=contextvars.Context())
        return waiting

    def close(self) -> None:
        """Stop applying: the batch being applied is cancelled where it is, and every handler still
        waiting is cancelled (its report unacked: the broker delivers it again, to this tracker's
        successor). Without it, a stopped tracker's drain could apply a report after its successor
        had applied later ones. Synchronous, so a shutdown that cancels its caller cannot cut it short."""
        self._closed = True
        for _, done in self._waiting:
            done.cancel()
        self._waiting.clear()
        if self._drain is not None:
            self._drain.cancel()

    async def _run(self) -> None:
        try:
            while self._waiting and not self._closed:
                batch = [self._waiting.popleft() for _ in range(min(len(self._waiting), self._max_batch))]
                await self._apply(batch)
        except BaseException as exc:
            # Cancelled (the service stopping), or a bug above: no handler may wait for good.
            for _, done in self._waiting:
                _settle(done, exc)
            self._waiting.clear()
            raise

    async def _apply(self, batch: list[_Waiting]) -> None:
        runs: dict[str, list[_Waiting]] = {}
        try:
            for report, done in batch:
                if done.done():
                    continue  # its handler gave up before it was taken
                cluster = self._run_of(report)
                if cluster is not None:
                    runs.setdefault(cluster, []).append((report, done))
                    continue
                await self._runs(runs)
                runs = {}
                try:
                    await self._apply_one(report)
                except Exception as exc:
                    _settle(done, exc)
                else:
                    _settle(done, None)
            await self._runs(runs)
        except BaseException as exc:
            for _, done in batch:
                _settle(done, exc)
            raise

    async def _runs(self, runs: dict[str, list[_Waiting]]) -> None:
        for cluster, run in runs.items():
            reports = [report for report, _ in run]
            try:
                outcomes = await self._apply_run(cluster, reports)
                if len(outcomes) != len(run):
                    raise RuntimeError(f"{len(outcomes)} outcomes for a run of {len(run)} reports")
            except Exception as exc:
                outcomes = [exc] * len(run)
            for (_, done), outcome in zip(run, outcomes, strict=True):
                _settle(done, outcome)


def _settle(done: asyncio.Future[None], outcome: BaseException | None) -> None:
    if done.done():
        return
    if outcome is None:
        done.set_result(None)
    elif isinstance(outcome, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(outcome)


__all__ = ["MAX_BATCH", "ApplyOne", "ApplyRun", "ReportQueue", "RunOf"]
