"""Full Redis key names: the configured prefix plus the KEY_* suffixes of vmsched.constants.

Every per-cluster key ends in the cluster id, so `{prefix}:*:{cluster}` finds one cluster's keys.
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


class Keys:
    """Builds key names under one prefix (tests vary the prefix to stay isolated)."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        if not prefix:
            raise ValueError("the Redis key prefix must not be empty")
        self.prefix = prefix

    @classmethod
    def from_settings(cls, settings: Settings) -> Keys:
        return cls(settings.redis_prefix)

    def _key(self, suffix: str, name: str) -> str:
        return f"{self.prefix}:{suffix}:{name}"

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

    def decision(self, request_id: UUID | str) -> str:
        return self._key(KEY_DECISION, str(request_id))

    def decision_history(self, cluster: str) -> str:
        return self._key(KEY_DECISION_HISTORY, cluster)

    def lease(self, role: str, cluster: str) -> str:
        return self._key(KEY_LEASE, f"{role}:{cluster}")

    def cooldown(self, cluster: str, vm_id: str) -> str:
        return self._key(KEY_COOLDOWN, f"{cluster}:{vm_id}")

    def tried(self, cluster: str, vm_id: str) -> str:
        return self._key(KEY_TRIED, f"{cluster}:{vm_id}")

    def ha_state(self, cluster: str) -> str:
        return self._key(KEY_HA_STATE, cluster)

    def unit_catalogue(self, service: str, instance: str) -> str:
        """One running service instance's policy units (vmsched.store.catalogues)."""
        return self._key(KEY_UNITS, f"{service}:{instance}")

    def unit_catalogue_index(self) -> str:
        return f"{self.prefix}:{KEY_UNITS_INDEX}"

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
            self.decision_history(cluster),
            *(self.lease(role, cluster) for role in LEASE_ROLES),
        ]

    def cluster_patterns(self, cluster: str) -> list[str]:
        """SCAN patterns of one cluster's per-VM keys (migration cool-downs, failed hosts)."""
        return [self._key(KEY_COOLDOWN, f"{cluster}:*"), self._key(KEY_TRIED, f"{cluster}:*")]

    def __repr__(self) -> str:
        return f"Keys({self.prefix!r})"
