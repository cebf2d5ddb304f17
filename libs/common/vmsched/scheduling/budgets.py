"""Disruption budgets every balance unit obeys, in the balancer service and in the simulator alike.

A balance unit says which VM it would move; the budgets say whether the cluster can take the
disruption now. A pass is refused, or a target struck from the unit's candidates, when:

* MigrationsPerHostPerHour: a host already took part (as source or target) in that many
  migrations within the last hour (default 1);
* MigrationsPerClusterPerHour: the cluster already started that many within the last hour
  (default: a quarter of its hosts, at least one, so balancing costs no more than 0.25 migrations
  per host per hour on a cluster of 4 hosts or more);
* ConcurrentMigrations: that many balancing migrations are still in flight (default 2);
* ReturnCooldownMinutes: the VM left that target within the cool-down (default 240): no VM
  goes back to a host it left lately, whichever unit asks.

The budgets are policy properties (the policy's, whatever its balance unit) checked here against
their regexes. The record of recent migrations is a `MigrationLedger`: the simulator keeps one in
memory for its run; the balancer service rebuilds one each pass from Redis
(vmsched.store.budgets.MigrationBudget), where it writes every migration it decides. Maintenance
drains are the operator's moves and are not counted.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final

from vmsched.errors import InvalidProperty
from vmsched.scheduling.units.base import PropertySpec, Props

HOUR_S: Final = 3600.0
#: The budgets' own name where a unit's would be (in InvalidProperty, in the docs).
BUDGETS: Final = "disruption budgets"
#: MigrationsPerClusterPerHour unset: this many per host of the cluster.
CLUSTER_SHARE_PER_HOST: Final = 0.25

_NUMBER = r"^([0-9]+(\.[0-9]+)?)$"
BUDGET_PROPERTIES: Final = {
    "MigrationsPerHostPerHour": PropertySpec(_NUMBER, "1", "balancing migrations a host takes part in per hour"),
    "MigrationsPerClusterPerHour": PropertySpec(
        _NUMBER, None, "balancing migrations a cluster starts per hour; unset: a quarter of its hosts"
    ),
    "ConcurrentMigrations": PropertySpec(r"^([0-9]+)$", "2", "balancing migrations in flight at once"),
    "ReturnCooldownMinutes": PropertySpec(
        r"^([0-9]+)$", "240", "minutes during which a VM never migrates back to a host it left"
    ),
}


@dataclass(frozen=True)
class BudgetLimits:
    per_host_hour: float
    per_cluster_hour: float
    concurrent: int
    return_cooldown_s: float

    @classmethod
    def from_props(cls, props: Props, hosts: int) -> BudgetLimits:
        """The policy's budgets for a cluster of `hosts` hosts; InvalidProperty for a malformed one."""
        values: dict[str, str | None] = {}
        for name, spec in BUDGET_PROPERTIES.items():
            value = props.get(name)
            if value in (None, ""):
                value = spec.default
            elif not spec.matches(value):
                raise InvalidProperty(BUDGETS, name, value, spec.regex)
            values[name] = value
        cluster = values["MigrationsPerClusterPerHour"]
        return cls(
            per_host_hour=float(values["MigrationsPerHostPerHour"] or 0),
            per_cluster_hour=float(cluster) if cluster is not None else max(1.0, CLUSTER_SHARE_PER_HOST * hosts),
            concurrent=int(values["ConcurrentMigrations"] or 0),
            return_cooldown_s=60.0 * int(values["ReturnCooldownMinutes"] or 0),
        )


@dataclass(frozen=True)
class MoveRecord:
    """A balancing migration decided at `at_s` (seconds, the caller's clock)."""

    at_s: float
    vm_id: str
    source: str
    target: str


class MigrationLedger:
    """The balancing migrations of the last hour (per host and per cluster) and of the return
    cool-down (per VM: the hosts it left), kept in decision order."""

    def __init__(self, return_cooldown_s: float, moves: Iterable[MoveRecord] = ()) -> None:
        self.return_cooldown_s = return_cooldown_s
        self._hour: deque[MoveRecord] = deque()
        self._kept: deque[MoveRecord] = deque()
        self._per_host: Counter[str] = Counter()
        self._left: dict[str, dict[str, float]] = {}
        for move in sorted(moves, key=lambda m: m.at_s):
            self.record(move)

    def record(self, move: MoveRecord) -> None:
        self._hour.append(move)
        self._per_host[move.source] += 1
        self._per_host[move.target] += 1
        self._kept.append(move)
        self._left.setdefault(move.vm_id, {})[move.source] = move.at_s

    def prune(self, now_s: float) -> None:
        """Forget what is older than an hour (counts) and than the return cool-down (returns)."""
        while self._hour and self._hour[0].at_s <= now_s - HOUR_S:
            old = self._hour.popleft()
            for host in (old.source, old.target):
                self._per_host[host] -= 1
                if self._per_host[host] <= 0:
                    del self._per_host[host]
        while self._kept and self._kept[0].at_s <= now_s - max(self.return_cooldown_s, HOUR_S):
            old = self._kept.popleft()
            left = self._left.get(old.vm_id)
            if left is not None and left.get(old.source) == old.at_s:
                del left[old.source]
                if not left:
                    del self._left[old.vm_id]

    def in_last_hour(self) -> int:
        return len(self._hour)

    def host_count(self, host: str) -> int:
        return self._per_host.get(host, 0)

    def left_within(self, vm_id: str, now_s: float) -> set[str]:
        """The hosts `vm_id` left less than the return cool-down ago."""
        left = self._left.get(vm_id, {})
        return {h for h, at in left.items() if now_s - at < self.return_cooldown_s}

    def moves(self) -> list[MoveRecord]:
        return list(self._kept)


@dataclass(frozen=True)
class Budget:
    """The budgets as they stand at `now_s`, with `in_flight` balancing migrations not yet done."""

    limits: BudgetLimits
    ledger: MigrationLedger
    now_s: float
    in_flight: int

    def exhausted(self) -> str | None:
        """Why no migration may start at all now (None: some may)."""
        if self.in_flight >= self.limits.concurrent:
            return f"{self.in_flight} migrations in flight, ConcurrentMigrations {self.limits.concurrent}"
        done = self.ledger.in_last_hour()
        if done + 1 > math.floor(self.limits.per_cluster_hour + 1e-9):
            return f"{done} migrations in the last hour, MigrationsPerClusterPerHour {self.limits.per_cluster_hour:g}"
        return None

    def host_full(self, host: str) -> bool:
        return self.ledger.host_count(host) + 1 > math.floor(self.limits.per_host_hour + 1e-9)

    def full_hosts(self, hosts: Collection[str]) -> set[str]:
        return {h for h in hosts if self.host_full(h)}

    def admit(self, vm_id: str, source: str, candidates: Iterable[str]) -> tuple[str, ...]:
        """The candidates the VM may go to: hosts with budget left that it did not leave lately
        (none when the source itself is out of budget)."""
        if self.host_full(source):
            return ()
        left = self.ledger.left_within(vm_id, self.now_s)
        return tuple(h for h in candidates if h not in left and not self.host_full(h))


__all__ = [
    "BUDGETS",
    "BUDGET_PROPERTIES",
    "CLUSTER_SHARE_PER_HOST",
    "HOUR_S",
    "Budget",
    "BudgetLimits",
    "MigrationLedger",
    "MoveRecord",
]
