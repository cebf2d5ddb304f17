"""Full Redis key names: the configured prefix plus the KEY_* suffixes of vmsched.constants.

Every per-cluster key carries the cluster id as a Redis Cluster hash tag, `{prefix}:lock:{c1}`,
`{prefix}:cooldown:{c1}:vm7`, `{prefix}:decision:{c1}:<request id>`: only the part in braces is
hashed, so all of one cluster's keys live in one slot and every Lua script (which names keys of one
cluster only) runs on Redis Cluster as on one server. The keys shared by all clusters are the
clusters set (one key, touched by no script) and the unit catalogues with their index, which share
the fixed tag `{units}` so the script that announces a catalogue has both in one slot.
"""

from __future__ import annotations

from uuid import UUID

from vmsched.constants import (
    KEY_CLUSTERS,
    KEY_COOLDOWN,
    KEY_DECISION,
    KEY_DECISION_HISTORY,
    KEY_FENCE,
    KEY_GENERATION,
    KEY_HA_STATE,
    KEY_LEASE,
    KEY_LOCK,
    KEY_MAINTENANCE,
    KEY_MIGRATION_BUDGET,
    KEY_PENDING,
    KEY_PENDING_VERSION,
    KEY_RESYNC,
    KEY_STATE_CHANGES,
    KEY_STATE_CLUSTER,
    KEY_STATE_HOSTS,
    KEY_STATE_REMOVED,
    KEY_STATE_VERSION,
    KEY_STATE_VMS,
    KEY_TRIED,
    KEY_UNITS,
    KEY_UNITS_INDEX,
    LEASE_BALANCER,
    LEASE_HA_MONITOR,
)
from vmsched.settings import Settings

#: Every role that leases clusters (the balancer's and the HA monitor's periodic loops).
LEASE_ROLES = (LEASE_BALANCER, LEASE_HA_MONITOR)
#: The hash tag of the unit catalogues and their index (see the module docstring).
UNITS_TAG = "{units}"


def tag(cluster: str) -> str:
    """The hash tag of one cluster's keys."""
    return f"{{{cluster}}}"


class Keys:
    """Builds key names under one prefix (tests vary the prefix to stay isolated)."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        if not prefix:
            raise ValueError("the Redis key prefix must not be empty")
        if "{" in prefix or "}" in prefix:
            # Redis Cluster would hash the prefix's braces instead of the cluster's tag.
            raise ValueError(f"the Redis key prefix must not contain braces: {prefix!r}")
        self.prefix = prefix

    @classmethod
    def from_settings(cls, settings: Settings) -> Keys:
        return cls(settings.redis_prefix)

    def _key(self, suffix: str, cluster: str, rest: str = "") -> str:
        """A per-cluster key: `{prefix}:{suffix}:{{cluster}}` plus `:{rest}` when given."""
        return f"{self.prefix}:{suffix}:{tag(cluster)}" + (f":{rest}" if rest else "")

    def lock(self, cluster: str) -> str:
        return self._key(KEY_LOCK, cluster)

    def fence(self, cluster: str) -> str:
        return self._key(KEY_FENCE, cluster)

    def generation(self, cluster: str) -> str:
        """The cluster's generation marker: which generation its keys belong to, on which server run."""
        return self._key(KEY_GENERATION, cluster)

    def resync(self, cluster: str) -> str:
        """Set while the cluster waits for the engine's full report after Redis forgot it."""
        return self._key(KEY_RESYNC, cluster)

    def pending(self, cluster: str) -> str:
        return self._key(KEY_PENDING, cluster)

    def pending_version(self, cluster: str) -> str:
        return self._key(KEY_PENDING_VERSION, cluster)

    def state_version(self, cluster: str) -> str:
        return self._key(KEY_STATE_VERSION, cluster)

    def state_hosts(self, cluster: str) -> str:
        return self._key(KEY_STATE_HOSTS, cluster)

    def state_vms(self, cluster: str) -> str:
        return self._key(KEY_STATE_VMS, cluster)

    def state_cluster(self, cluster: str) -> str:
        return self._key(KEY_STATE_CLUSTER, cluster)

    def state_changes(self, cluster: str) -> str:
        return self._key(KEY_STATE_CHANGES, cluster)

    def state_removed(self, cluster: str) -> str:
        return self._key(KEY_STATE_REMOVED, cluster)

    def clusters(self) -> str:
        return f"{self.prefix}:{KEY_CLUSTERS}"

    def decision(self, cluster: str, request_id: UUID | str) -> str:
        """Under the cluster's tag: a decision is stored with its cluster's fence and history."""
        return f"{self._key(KEY_DECISION, cluster)}:{request_id}"

    def decision_history(self, cluster: str) -> str:
        return self._key(KEY_DECISION_HISTORY, cluster)

    def lease(self, role: str, cluster: str) -> str:
        return f"{self.prefix}:{KEY_LEASE}:{role}:{tag(cluster)}"

    def cooldown(self, cluster: str, vm_id: str) -> str:
        return self._key(KEY_COOLDOWN, cluster, vm_id)

    def migration_budget(self, cluster: str) -> str:
        """The balancing migrations of the disruption budgets' window (vmsched.store.budgets)."""
        return self._key(KEY_MIGRATION_BUDGET, cluster)

    def tried(self, cluster: str, vm_id: str) -> str:
        return self._key(KEY_TRIED, cluster, vm_id)

    def ha_state(self, cluster: str) -> str:
        return self._key(KEY_HA_STATE, cluster)

    def maintenance(self, cluster: str) -> str:
        """The maintenance plans of the hosts being drained (store.maintenance_plans)."""
        return self._key(KEY_MAINTENANCE, cluster)

    def unit_catalogue(self, service: str, instance: str) -> str:
        """One running service instance's policy units (vmsched.store.catalogues)."""
        return f"{self.prefix}:{KEY_UNITS}:{UNITS_TAG}:{service}:{instance}"

    def unit_catalogue_index(self) -> str:
        return f"{self.prefix}:{KEY_UNITS_INDEX}:{UNITS_TAG}"

    def of_cluster(self, cluster: str) -> list[str]:
        """Every key of one cluster with a fixed name (state, pending, lock, fence, leases, HA status),
        e.g. to forget a cluster. Per-VM keys are matched by cluster_patterns() instead."""
        return [
            self.state_version(cluster),
            self.state_hosts(cluster),
            self.state_vms(cluster),
            self.state_cluster(cluster),
            self.state_changes(cluster),
            self.state_removed(cluster),
            self.pending(cluster),
            self.pending_version(cluster),
            self.fence(cluster),
            self.lock(cluster),
            self.generation(cluster),
            self.resync(cluster),
            self.ha_state(cluster),
            self.maintenance(cluster),
            self.migration_budget(cluster),
            self.decision_history(cluster),
            *(self.lease(role, cluster) for role in LEASE_ROLES),
        ]

    def cluster_patterns(self, cluster: str) -> list[str]:
        """SCAN patterns of one cluster's per-VM keys (migration cool-downs, failed hosts)."""
        return [self._key(KEY_COOLDOWN, cluster, "*"), self._key(KEY_TRIED, cluster, "*")]

    def __repr__(self) -> str:
        return f"Keys({self.prefix!r})"
