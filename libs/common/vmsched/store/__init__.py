"""The Redis layer: key names, the per-cluster lock, pending resources, cluster state, decisions.

redis = connect(settings)
locks = ClusterLock(redis, settings)
pending = PendingStore(redis, settings)
async with locks.hold(cluster_id) as lease:
    version, table = await StateCache(redis, settings).table(cluster_id)
    ...
    await pending.record(cluster_id, entries, lease.token)  # FencedOut if the lock was lost
"""

from vmsched.store.catalogues import UnitCatalogues
from vmsched.store.decisions import DecisionStore
from vmsched.store.keys import Keys
from vmsched.store.lock import ClusterLock, Lease
from vmsched.store.memories import FailedHosts, HaStatus, MigrationCooldowns
from vmsched.store.pending import PendingStore
from vmsched.store.redis import connect
from vmsched.store.state_cache import CacheStats, StateCache
from vmsched.store.state_writer import StateWriter

__all__ = [
    "CacheStats",
    "ClusterLock",
    "DecisionStore",
    "FailedHosts",
    "HaStatus",
    "Keys",
    "Lease",
    "MigrationCooldowns",
    "PendingStore",
    "StateCache",
    "StateWriter",
    "UnitCatalogues",
    "connect",
]
