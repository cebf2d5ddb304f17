"""`vmsched policy import-nova` on real nova.conf files: Nova's defaults map onto vmsched's units
(those without one are skipped with a warning), server groups map, decimal multipliers are imported
as they are, allocation ratios and per-host maxima become properties, the selector is Nova's min-max,
and the policy is validated before it is printed (exit 2 with the problems when it is not valid)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vmsched.scheduling.policy_docs import problems
from vmsched.scheduling.units import REGISTRY
from vmsched_services.tools.cli import EXIT_OK, EXIT_USAGE, main
from vmsched_services.tools.nova_import import NOVA_DEFAULT_FILTERS, NovaImport, import_nova
from vmsched_services.tools.policy_commands import read_set

#: Nova's default weighers vmsched has no unit for (their default multipliers are not zero).
UNMAPPED_DEFAULT_WEIGHERS = ("PCIWeigher", "CrossCellWeigher", "HypervisorVersionWeigher")


def imported(tmp_path: Path, text: str) -> NovaImport:
    conf = tmp_path / "nova.conf"
    conf.write_text(text)
    return import_nova(str(conf), "from-nova", REGISTRY)


def weights(result: NovaImport) -> dict[str, float]:
    return {w.unit: w.factor for w in result.document.weights}


def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, *extra: str) -> tuple[int, str, str]:
    conf = tmp_path / "nova.conf"
    conf.write_text(text)
    code = main(["policy", "import-nova", str(conf), "--name", "from-nova", *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_compute_filter_alone_gets_novas_default_weighers_and_skips_those_vmsched_lacks(tmp_path: Path) -> None:
    result = imported(tmp_path, "[filter_scheduler]\nenabled_filters = ComputeFilter\n")
    assert result.problems == []
    assert [f.unit for f in result.document.filters] == ["ComputeFilter"]
    # Nova's multipliers: io_ops -1.0 (fewer wins: a positive factor on vmsched's lower-is-better
    # unit), build failures 1000000.0, num_instances 0.0 (off), the rest 1.0.
    assert weights(result) == {
        "RAMWeigher": 1,
        "CPUWeigher": 1,
        "DiskWeigher": 1,
        "IoOpsWeigher": 1,
        "BuildFailureWeigher": 1_000_000,
        "ServerGroupSoftAffinity": 1,
        "ServerGroupSoftAntiAffinity": 1,
        "MetricsWeigher": 1,
    }
    for name in UNMAPPED_DEFAULT_WEIGHERS:
        assert f"skipped Nova weigher {name} (a default, not written): vmsched has no unit for it" in result.warnings
    assert len(result.warnings) == len(UNMAPPED_DEFAULT_WEIGHERS)


def test_all_weighers_written_out_is_the_default_and_all_filters_skips_what_vmsched_lacks(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[filter_scheduler]\navailable_filters = nova.scheduler.filters.all_filters\n"
        "enabled_filters = nova.scheduler.filters.all_filters\n"
        "weight_classes = nova.scheduler.weights.all_weighers\n",
    )
    assert result.problems == []
    assert "ServerGroupAffinity" in [f.unit for f in result.document.filters]
    assert "skipped Nova filter NUMATopologyFilter (a default, not written): vmsched has no unit for it" in (
        result.warnings
    )
    assert weights(result)["BuildFailureWeigher"] == 1_000_000


def test_no_filter_scheduler_section_is_novas_defaults(tmp_path: Path) -> None:
    result = imported(tmp_path, "[DEFAULT]\ndebug = true\n")
    assert result.problems == []
    assert len(NOVA_DEFAULT_FILTERS) == 5
    assert [f.unit for f in result.document.filters] == [
        "ComputeFilter",
        "ComputeCapabilitiesFilter",
        "ImagePropertiesFilter",
        "ServerGroupAntiAffinity",
        "ServerGroupAffinity",
    ]
    assert "no [filter_scheduler] section: Nova's defaults are imported" in result.warnings


def test_server_group_filters_map_to_vmscheds_affinity_units(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[filter_scheduler]\n"
        "enabled_filters = ComputeFilter,ServerGroupAffinityFilter,ServerGroupAntiAffinityFilter,"
        "SameHostFilter,DifferentHostFilter\n"
        "weight_classes = nova.scheduler.weights.affinity.ServerGroupSoftAntiAffinityWeigher\n"
        "soft_anti_affinity_weight_multiplier = 2.0\n",
    )
    assert result.problems == result.warnings == []
    assert [f.unit for f in result.document.filters] == [
        "ComputeFilter",
        "ServerGroupAffinity",
        "ServerGroupAntiAffinity",
        "SameHost",
        "DifferentHost",
    ]
    assert weights(result) == {"ServerGroupSoftAntiAffinity": 2}


def test_a_filter_vmsched_lacks_written_by_name_refuses_the_import(tmp_path: Path) -> None:
    result = imported(tmp_path, "[filter_scheduler]\nenabled_filters = ComputeFilter,NUMATopologyFilter,RamFiltr\n")
    assert result.problems == [
        "enabled_filters: vmsched has no unit for Nova's NUMATopologyFilter; remove it to import the policy without it",
        "unknown filter unit 'RamFiltr'; did you mean 'RamFilter'?",
    ]


def test_decimal_multipliers_are_imported_as_they_are(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[filter_scheduler]\nenabled_filters = ComputeFilter\n"
        "ram_weight_multiplier = 1.5\nbuild_failure_weight_multiplier = 1000000.0\n"
        "io_ops_weight_multiplier = -0.25\ndisk_weight_multiplier = 0.1\n",
    )
    assert result.problems == []
    got = weights(result)
    # Unscaled; io_ops' negative Nova multiplier (prefer fewer) is a positive factor.
    assert (got["RAMWeigher"], got["CPUWeigher"], got["IoOpsWeigher"], got["DiskWeigher"]) == (1.5, 1, 0.25, 0.1)
    assert got["BuildFailureWeigher"] == 1_000_000
    # Whole factors are ints (written 1000000, not 1000000.0); the rest floats.
    assert type(got["BuildFailureWeigher"]) is int
    assert type(got["RAMWeigher"]) is float
    # Nothing was scaled, clipped or rounded.
    assert not any("scaled" in w or "clipped" in w or "rounded" in w for w in result.warnings), result.warnings


def test_whole_multipliers_stay_whole(tmp_path: Path) -> None:
    result = imported(tmp_path, "[filter_scheduler]\nenabled_filters = ComputeFilter\nram_weight_multiplier = -3\n")
    assert weights(result)["RAMWeigher"] == -3
    assert not any("scaled" in w or "clipped" in w for w in result.warnings)


def test_a_multiplier_past_the_bound_is_clipped_with_a_warning(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[filter_scheduler]\nenabled_filters = ComputeFilter\nweight_classes = RAMWeigher,BuildFailureWeigher\n"
        "ram_weight_multiplier = 1.5\nbuild_failure_weight_multiplier = 5e7\n",
    )
    assert result.problems == []
    assert weights(result) == {"RAMWeigher": 1.5, "BuildFailureWeigher": 1_000_000}
    assert result.warnings == [
        "build_failure_weight_multiplier: factor 50000000 is past vmsched's bound on a factor (1000000), "
        "clipped to 1000000 "
        "(the other weighers' factors sum to 1.5)"
    ]


def test_a_multiplier_with_more_digits_than_a_double_is_rounded_with_a_warning(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[filter_scheduler]\nenabled_filters = ComputeFilter\nweight_classes = RAMWeigher\n"
        "ram_weight_multiplier = 0.12345678901234567890\n",
    )
    assert weights(result) == {"RAMWeigher": 0.12345678901234568}
    assert result.warnings == [
        "ram_weight_multiplier: factor 0.12345678901234567890 has more digits than a double holds, "
        "rounded to 0.12345678901234568"
    ]


def test_the_imported_yaml_carries_the_multipliers_and_reads_back_equal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = "[filter_scheduler]\nram_weight_multiplier = 1.5\nbuild_failure_weight_multiplier = 1000000.0\n"
    code, out, _ = cli(capsys, tmp_path, conf)
    assert code == EXIT_OK
    assert "- unit: RAMWeigher\n    factor: 1.5\n" in out
    assert "- unit: BuildFailureWeigher\n    factor: 1000000\n" in out
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(out)
    assert read_set(str(policy_file)).policies[0] == imported(tmp_path, conf).document


def test_allocation_ratios_and_per_host_maxima_become_properties_when_a_unit_reads_them(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[DEFAULT]\nram_allocation_ratio = 1.0\ncpu_allocation_ratio = 4.0\ndisk_allocation_ratio = 1.0\n\n"
        "[filter_scheduler]\nenabled_filters = ComputeFilter,RamFilter,IoOpsFilter,NumInstancesFilter\n"
        "max_io_ops_per_host = 4\nmax_instances_per_host = 30\n",
    )
    assert result.problems == []
    assert result.document.properties == {
        "RamAllocationRatio": "1.0",
        "CpuAllocationRatio": "4.0",  # CPUWeigher (a default weigher) reads it
        "MaxIoOpsPerHost": "4",
        "MaxInstancesPerHost": "30",
    }
    assert (
        "disk_allocation_ratio = 1.0 not imported: no unit of this policy reads DiskAllocationRatio "
        "(read by AggregateDiskFilter, DiskFilter)"
    ) in result.warnings
    assert problems(result.document, REGISTRY) == []


def test_a_zero_allocation_ratio_is_novas_unset(tmp_path: Path) -> None:
    conf = "[DEFAULT]\ncpu_allocation_ratio = 0.0\n[filter_scheduler]\nenabled_filters = CoreFilter\n"
    result = imported(tmp_path, conf)
    assert "CpuAllocationRatio" not in result.document.properties
    assert "cpu_allocation_ratio = 0.0 is Nova's 'unset': not imported, CpuAllocationRatio's default applies" in (
        result.warnings
    )


def test_a_property_value_the_unit_refuses_is_a_problem(tmp_path: Path) -> None:
    result = imported(tmp_path, "[filter_scheduler]\nenabled_filters = IoOpsFilter\nmax_io_ops_per_host = lots\n")
    assert len(result.problems) == 1
    assert result.problems[0].startswith("MaxIoOpsPerHost must be a whole number of at least 0")


def test_the_selector_is_novas_min_max(tmp_path: Path) -> None:
    assert imported(tmp_path, "[filter_scheduler]\n").document.selector == "MinMaxSelector"


def test_the_command_prints_valid_yaml_and_the_warnings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli(capsys, tmp_path, "[filter_scheduler]\nenabled_filters = ComputeFilter\n")
    assert code == EXIT_OK
    policy = yaml.safe_load(out)["policies"][0]
    assert policy["selector"] == "MinMaxSelector"
    assert {"unit": "ServerGroupSoftAffinity", "factor": 1} in policy["weights"]
    assert "vmsched policy import-nova: warning: skipped Nova weigher PCIWeigher" in err


def test_the_command_refuses_an_invalid_policy_with_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli(capsys, tmp_path, "[filter_scheduler]\nenabled_filters = ComputeFilter,RamFiltr\n")
    assert code == EXIT_USAGE
    assert out == ""
    assert "1 problem(s), nothing imported:\n  unknown filter unit 'RamFiltr'; did you mean 'RamFilter'?" in err


def test_dry_run_asks_the_service_instead_of_printing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens there: --dry-run goes to the policy-admin service (to show what would change),
    # so the command fails to connect rather than printing YAML as if --dry-run were not given.
    monkeypatch.setenv("VMSCHED_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
    code, out, err = cli(capsys, tmp_path, "[filter_scheduler]\nenabled_filters = ComputeFilter\n", "--dry-run")
    assert code != EXIT_OK
    assert "policies:" not in out
    assert "bus_unavailable" in err


def test_a_weigher_vmsched_lacks_written_by_name_refuses_the_import(tmp_path: Path) -> None:
    result = imported(
        tmp_path,
        "[filter_scheduler]\nenabled_filters = ComputeFilter\n"
        "weight_classes = nova.scheduler.weights.ram.RAMWeigher,nova.scheduler.weights.pci.PCIWeigher\n",
    )
    assert result.problems == [
        "weight_classes: vmsched has no unit for Nova's PCIWeigher; remove it to import without it"
    ]
