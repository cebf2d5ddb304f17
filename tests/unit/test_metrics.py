"""Bounded cluster labels, and per-cluster gauges whose overflow clusters add up under one label."""

from __future__ import annotations

import platform

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from pydantic import ValidationError

from vmsched.contracts import ClusterReport
from vmsched.metrics import OTHER_CLUSTERS, ClusterGauge, ClusterLabels


def test_the_first_clusters_keep_their_own_label_and_later_ones_share_one() -> None:
    labels = ClusterLabels(limit=2)
    assert labels("c1") == "c1"
    assert labels("c2") == "c2"
    assert labels("c3") == OTHER_CLUSTERS
    assert labels("c4") == OTHER_CLUSTERS
    # A cluster keeps its label for good, however many come after it.
    assert labels("c1") == "c1"
    assert labels("c2") == "c2"
    assert labels("c3") == OTHER_CLUSTERS
    assert len(labels) == 2


def test_reset_forgets_the_clusters_seen() -> None:
    labels = ClusterLabels(limit=1)
    assert labels("c1") == "c1"
    assert labels("c2") == OTHER_CLUSTERS
    labels.reset(limit=2)
    assert len(labels) == 0
    assert labels("c2") == "c2"
    assert labels("c3") == "c3"
    assert labels("c1") == OTHER_CLUSTERS


def test_no_cluster_id_can_take_the_overflow_label() -> None:
    # Were it a valid id, that cluster's figures would be mixed into the overflow's.
    with pytest.raises(ValidationError):
        ClusterReport(cluster_id=OTHER_CLUSTERS)


def test_a_limit_of_zero_labels_every_cluster_as_other() -> None:
    labels = ClusterLabels(limit=0)
    assert labels("c1") == OTHER_CLUSTERS
    assert len(labels) == 0


def _gauge() -> tuple[CollectorRegistry, Gauge]:
    registry = CollectorRegistry()
    return registry, Gauge("test_hosts", "hosts", ["cluster", "status"], registry=registry)


def test_a_cluster_gauge_sets_values_per_cluster_and_sums_the_overflow() -> None:
    registry, gauge = _gauge()
    hosts = ClusterGauge(gauge, ClusterLabels(limit=1))

    def value(cluster: str, status: str) -> float | None:
        return registry.get_sample_value("test_hosts", {"cluster": cluster, "status": status})

    hosts.set("c1", 3, "up")
    hosts.set("c2", 5, "up")  # past the limit: under _other
    hosts.set("c3", 7, "up")
    assert value("c1", "up") == 3
    assert value(OTHER_CLUSTERS, "up") == 12
    # A new value replaces the cluster's part only.
    hosts.set("c2", 1, "up")
    hosts.set("c1", 4, "up")
    assert value("c1", "up") == 4
    assert value(OTHER_CLUSTERS, "up") == 8
    hosts.set("c3", 0, "up")
    assert value(OTHER_CLUSTERS, "up") == 1
    # Other label values are kept apart, and a cluster at zero is exported as zero.
    hosts.set("c1", 0, "down")
    assert value("c1", "down") == 0
    assert value("c2", "c2") is None


def test_build_info_names_the_version_and_python() -> None:
    samples = [s for m in REGISTRY.collect() if m.name == "vmsched_build_info" for s in m.samples]
    assert len(samples) == 1
    assert samples[0].value == 1
    assert samples[0].labels["python"] == platform.python_version()
    assert samples[0].labels["version"] not in ("", "unknown")
