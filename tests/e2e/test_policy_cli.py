"""An operator's day with `vmsched policy`, only the CLI, against service processes: clone a
built-in, export it, edit the YAML, apply it (dry run first), attach it, see the next decision use
it, roll it back; and a broken file refused with every problem named and nothing stored."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests import factories
from tests.e2e.cli import vmsched
from vmsched.client import SchedulerClient
from vmsched.settings import Settings
from vmsched_services.tools.procs import ServiceStack

pytestmark = pytest.mark.e2e


async def test_an_operator_edits_a_policy_in_yaml_applies_attaches_and_rolls_back(
    stack: ServiceStack, service_settings: Settings, tmp_path: Path, unique: str
) -> None:
    await stack.start("state-tracker", "filter-worker", "selector", "policy-admin")
    cluster, name = f"ops-{unique}", f"ops-{unique}"
    async with SchedulerClient(service_settings) as client:
        await factories.make_cluster(client, cluster, 3, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)

    code, out, err = await vmsched(service_settings, "policy", "clone", "none", name)
    assert code == 0, err
    assert f"policy {name}: created from none (version 1)" in out

    file = tmp_path / "policies.yaml"
    code, _, err = await vmsched(service_settings, "policy", "export", name, "-o", str(file))
    assert code == 0, err
    data = yaml.safe_load(file.read_text())
    [policy] = data["policies"]
    assert "Swap" in policy["filters"]  # filters in list order are plain names
    policy["filters"].remove("Swap")
    policy["properties"]["HighUtilization"] = "75"
    data["clusters"] = [{"cluster_id": cluster, "policy": name}]
    file.write_text(yaml.safe_dump(data))

    code, out, err = await vmsched(service_settings, "policy", "apply", "-f", str(file), "--dry-run")
    assert code == 0, err
    assert f"policy {name}: update" in out
    assert "- filter Swap" in out
    assert "+ property HighUtilization = '75'" in out
    assert "2 change(s) would apply" in out

    code, out, err = await vmsched(service_settings, "policy", "apply", "-f", str(file))
    assert code == 0, err
    assert f"policy {name}: update (version 2)" in out
    code, out, _ = await vmsched(service_settings, "policy", "apply", "-f", str(file))
    assert "0 change(s) did apply; 2 unchanged" in out  # idempotent

    async with SchedulerClient(service_settings) as client:
        d = await client.schedule(cluster, factories.vm_spec(f"{unique}-a", mem_mb=512, vcpus=1))
        assert d.policy == name
        assert "Swap" not in d.explanation.filters

        code, out, err = await vmsched(service_settings, "policy", "rollback", name)
        assert code == 0, err
        assert f"policy {name}: update (version 3)" in out
        d = await client.schedule(cluster, factories.vm_spec(f"{unique}-b", mem_mb=512, vcpus=1))
        assert "Swap" in d.explanation.filters

    code, out, _ = await vmsched(service_settings, "policy", "history", name)
    assert [line.split()[1] for line in out.splitlines() if line.startswith("version ")] == ["1", "2", "3"]
    code, out, _ = await vmsched(service_settings, "policy", "list")
    assert any(line.startswith(name) and cluster in line for line in out.splitlines())


async def test_a_broken_file_is_refused_with_every_problem_and_nothing_stored(
    stack: ServiceStack, service_settings: Settings, tmp_path: Path, unique: str
) -> None:
    await stack.start("policy-admin")
    name = f"broken-{unique}"
    file = tmp_path / "broken.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "policies": [
                    {
                        "name": name,
                        "filters": ["Memroy", "CPU"],
                        "weights": [{"unit": "OptimalForEvenCpuDistribution", "factor": 2}],
                        "properties": {"HighUtilization": "120", "CpuOverCommitDurationMinute": "3"},
                    }
                ]
            }
        )
    )
    code, out, err = await vmsched(service_settings, "policy", "apply", "-f", str(file))
    assert code == 3
    assert "Traceback" not in err
    assert "invalid_policy" in err
    assert "unknown filter unit 'Memroy'; did you mean 'Memory'?" in err
    assert "HighUtilization must be a whole number from 50 to 99 (default 80), not '120'" in err
    assert "'CpuOverCommitDurationMinute' is not read by any unit of the policy; did you mean" in err

    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("policies:\n  - name: x\n    filters: [Memory\n")
    code, _, err = await vmsched(service_settings, "policy", "apply", "-f", str(bad_yaml))
    assert code == 2
    assert "not valid YAML" in err
    bad_field = tmp_path / "field.yaml"
    bad_field.write_text(
        yaml.safe_dump({"policies": [{"name": "x", "weights": [{"unit": "RAMWeigher", "factor": "lots"}]}]})
    )
    code, _, err = await vmsched(service_settings, "policy", "apply", "-f", str(bad_field))
    assert code == 2
    assert "policies.0.weights.0.factor" in err

    code, out, _ = await vmsched(service_settings, "policy", "list")
    assert name not in out
