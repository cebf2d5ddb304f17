"""Private RabbitMQ nodes never touch the shared node: their names, ports and files are their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmsched_services.tools.servers.rabbit import RabbitCluster, RabbitNode


def test_a_private_node_may_not_take_the_shared_nodes_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shared node"):
        RabbitNode(tmp_path, "rabbit@localhost", "COOKIE")


def test_a_node_reads_only_files_under_its_directory_and_listens_on_its_own_loopback_ports(tmp_path: Path) -> None:
    node = RabbitNode(tmp_path / "n", "vmsched-chaos-x@localhost", "COOKIE")
    env = node.environment()
    assert env["RABBITMQ_NODENAME"] == "vmsched-chaos-x@localhost"
    assert env["RABBITMQ_NODE_PORT"] == str(node.port) != "5672"
    assert env["RABBITMQ_NODE_IP_ADDRESS"] == "127.0.0.1"
    assert int(env["RABBITMQ_CTL_DIST_PORT_MIN"]) <= 65535
    for var in ("RABBITMQ_CONF_ENV_FILE", "RABBITMQ_CONFIG_FILE", "RABBITMQ_ENABLED_PLUGINS_FILE", "HOME"):
        assert Path(env[var]).is_relative_to(tmp_path / "n"), var
    assert (tmp_path / "n" / "enabled_plugins").read_text().strip() == "[]."  # no management plugin
    assert f"127.0.0.1:{node.port}" in (tmp_path / "n" / "rabbitmq.conf").read_text()
    assert (tmp_path / "n" / "home" / ".erlang.cookie").read_text() == "COOKIE"


def test_the_nodes_of_a_cluster_share_a_cookie_and_nothing_else(tmp_path: Path) -> None:
    cluster = RabbitCluster(tmp_path, size=3, tag="t1")
    names = [n.nodename for n in cluster.nodes]
    assert names == ["vmsched-chaos-a-t1@localhost", "vmsched-chaos-b-t1@localhost", "vmsched-chaos-c-t1@localhost"]
    assert len({n.cookie for n in cluster.nodes}) == 1
    assert len({n.port for n in cluster.nodes} | {n.dist_port for n in cluster.nodes}) == 6
    assert len({n.directory for n in cluster.nodes}) == 3
