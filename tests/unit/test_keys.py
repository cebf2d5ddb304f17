"""Key names: one cluster's keys can be listed, so forgetting a cluster misses none."""

from __future__ import annotations

import inspect

from vmsched.store.keys import LEASE_ROLES, Keys


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
    assert all(k.endswith(":c1") for k in listed)


def test_per_vm_keys_are_matched_by_the_cluster_patterns() -> None:
    keys = Keys("p")
    patterns = keys.cluster_patterns("c1")
    for key in (keys.cooldown("c1", "vm1"), keys.tried("c1", "vm1")):
        assert any(key.startswith(p.rstrip("*")) for p in patterns), key
    assert not any(keys.cooldown("c10", "vm1").startswith(p.rstrip("*")) for p in patterns)
