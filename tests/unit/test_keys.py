"""Key names: one cluster's keys can be listed, so forgetting a cluster misses none; they share one
Redis Cluster slot, so every Lua script (which names one cluster's keys) runs on Redis Cluster."""

from __future__ import annotations

import inspect
import uuid

import pytest
from redis.crc import key_slot

from vmsched.store.keys import LEASE_ROLES, Keys


def _every_key_of(keys: Keys, cluster: str) -> list[str]:
    """Every key name Keys builds for `cluster`: each builder whose parameters name the cluster."""
    out: list[str] = []
    for name, fn in inspect.getmembers(Keys, inspect.isfunction):
        params = list(inspect.signature(fn).parameters)
        if name.startswith("_") or "cluster" not in params:
            continue
        args = {"cluster": cluster, "role": LEASE_ROLES[0], "vm_id": "vm-7", "request_id": uuid.uuid4()}
        built = getattr(keys, name)(**{p: args[p] for p in params[1:]})
        out += built if isinstance(built, list) else [built]
    return out


def test_of_cluster_lists_every_per_cluster_key() -> None:
    keys = Keys("p")
    listed = set(keys.of_cluster("c1"))
    builders = [
        name
        for name, fn in inspect.getmembers(Keys, inspect.isfunction)
        if not name.startswith("_")
        and name not in ("of_cluster", "cluster_patterns")
        and list(inspect.signature(fn).parameters) == ["self", "cluster"]
    ]
    assert builders, "no per-cluster key builder found"
    for name in builders:
        assert getattr(keys, name)("c1") in listed, name
    for role in LEASE_ROLES:
        assert keys.lease(role, "c1") in listed
    assert all(k.endswith(":{c1}") for k in listed)


def test_per_vm_keys_are_matched_by_the_cluster_patterns() -> None:
    keys = Keys("p")
    patterns = keys.cluster_patterns("c1")
    for key in (keys.cooldown("c1", "vm1"), keys.tried("c1", "vm1")):
        assert any(key.startswith(p.rstrip("*")) for p in patterns), key
    assert not any(keys.cooldown("c10", "vm1").startswith(p.rstrip("*")) for p in patterns)


@pytest.mark.parametrize("cluster", ["c1", "cluster-42", "a.b:c@d", "Z"])
def test_every_key_of_one_cluster_hashes_to_one_slot(cluster: str) -> None:
    keys = Keys("vmsched")
    built = _every_key_of(keys, cluster)
    # The builders of the lead's generation marker and resync flag are among them, as is every decision.
    assert {keys.generation(cluster), keys.resync(cluster), keys.fence(cluster)} <= set(built)
    assert len(built) > 20
    slots = {key_slot(k.encode()) for k in built}
    assert slots == {key_slot(cluster.encode())}, sorted(built)


def test_two_clusters_keys_do_not_share_a_tag() -> None:
    keys = Keys("vmsched")
    assert keys.lock("c1") != keys.lock("c10")
    assert not keys.decision("c10", "r").startswith(keys.decision("c1", ""))


def test_the_unit_catalogues_and_their_index_share_one_slot() -> None:
    keys = Keys("vmsched")
    built = [keys.unit_catalogue_index(), keys.unit_catalogue("selector", "h-1"), keys.unit_catalogue("weigher", "x")]
    assert len({key_slot(k.encode()) for k in built}) == 1


def test_a_prefix_with_braces_is_refused() -> None:
    with pytest.raises(ValueError, match="braces"):
        Keys("vm{sched}")
