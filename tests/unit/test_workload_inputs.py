"""Workload inputs: JSON read entry by entry (errors with their place, references checked as they
come, in any section order), host names, errors that name duplicates and list valid ids, CSV with
groups, labels and policies, and the Azure VM table converter on a sample made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmsched.errors import InvalidRequest
from vmsched.simulation.traces import azure_workload
from vmsched.simulation.workload import HostSpec, parse_workload
from vmsched.simulation.workload_json import read_json_workload
from vmsched.simulation.workload_refs import summarize_ids
from vmsched_services.tools.simulate import read_trace, read_workload

HOST = {"cpu_cores": 8, "mem_mb": 16384}


def doc(**sections: object) -> dict[str, object]:
    return {"hosts": [{"id": "h", "count": 8, **HOST}], **sections}


def chunks(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_json_read_in_small_chunks_is_the_json_read_whole() -> None:
    data = doc(
        affinity_groups=[{"id": "g", "positive": False}],
        arrivals=[
            {"vm_id": f"v{n}", "at_s": n * 1.5, "mem_mb": 512, "vcpus": 1, "affinity_groups": ["g"]} for n in range(5)
        ],
        departures=[{"vm_id": "v1", "at_s": 100}],
        sample_interval_s=60,
    )
    text = json.dumps(data, indent=2)
    whole = parse_workload(text, "w.json")
    assert read_json_workload(chunks(text), "w.json") == whole
    assert whole.sample_interval_s == 60
    assert len(whole.arrivals) == 5


def test_host_counts_are_named_as_the_schema_says_and_on_across_entries() -> None:
    w = parse_workload(
        json.dumps(
            {
                "hosts": [
                    {"id": "h", "count": 8, **HOST},
                    {"id": "h", "count": 4, **HOST},
                    {"id": "big", "count": 12, **HOST},
                    {"id": "solo", **HOST},
                ]
            }
        ),
        "w.json",
    )
    assert w.host_ids() == [
        *(f"h{n}" for n in range(1, 9)),
        "h09",
        "h10",
        "h11",
        "h12",
        *(f"big{n:02d}" for n in range(1, 13)),
        "solo",
    ]
    assert HostSpec(id="r", count=12, **HOST).ids()[:2] == ["r01", "r02"]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            doc(arrivals=[{"vm_id": "v3", "at_s": 0, "mem_mb": 1, "vcpus": 1, "pinned_hosts": ["h9"]}]),
            "arrivals.0.pinned_hosts: vm v3 names host h9: no such host; hosts are h1…h8",
        ),
        (
            {
                "arrivals": [{"vm_id": "v3", "at_s": 0, "mem_mb": 1, "vcpus": 1, "pinned_hosts": ["h9"]}],
                "hosts": [{"id": "h", "count": 8, **HOST}],
            },
            "arrivals.0.pinned_hosts: vm v3 names host h9: no such host; hosts are h1…h8",
        ),  # hosts after arrivals
        (
            doc(arrivals=[{"vm_id": "v", "at_s": 0, "mem_mb": 1, "vcpus": 1}] * 2),
            "arrivals.1: vm_id 'v' repeats (arrivals.0 has it too)",
        ),
        (
            {"hosts": [{"id": "h1", **HOST}, {"id": "h", "count": 3, **HOST}]},
            "hosts.1: host id 'h1' repeats (hosts.0 names it too)",
        ),
        (
            doc(departures=[{"vm_id": "x", "at_s": 1}], arrivals=[{"vm_id": "a", "at_s": 0, "mem_mb": 1, "vcpus": 1}]),
            "departures.0: VM x: no such VM; VMs are a",
        ),
        (doc(arrivals=[{"vm_id": "a", "at_s": 0, "mem_mb": 1, "vcpus": "many"}]), "arrivals.0.vcpus"),
        (
            doc(affinity_groups=[{"id": "g", "positive": True}, {"id": "g", "positive": True}]),
            "affinity_groups.1: affinity group 'g' repeats (affinity_groups.0 is it too)",
        ),
    ],
)
def test_json_errors_name_the_entry_the_duplicate_and_the_valid_ids(data: dict[str, object], said: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        read_json_workload(chunks(json.dumps(data), 5), "w.json")
    assert str(err.value).startswith("w.json: ")
    assert said in str(err.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"hosts": [}', "not valid JSON: Expecting value at line 1 column 12"),
        ('{\n "hosts": [{"id": "h", "cpu_cores": 1, "mem_mb": 1}] "x": 1}', "expecting ',' or '}' at line 2"),
        ('{"hosts": [{"id": "h", "cpu_cores": 1, "mem_mb": 1}]} extra', "extra data after the workload"),
        ('{"name": "a", "name": "b"}', "key 'name' repeats"),
        ("[1]", "expected a mapping"),
        ('{"description": ' + "[" * 40 + "]" * 40 + "}", "nested more than 32 levels deep"),
    ],
)
def test_json_syntax_errors_say_where(text: str, said: str) -> None:
    with pytest.raises(InvalidRequest, match=said.replace("(", r"\(").replace("[", r"\[")):
        read_json_workload(chunks(text, 3), "w.json")


def test_ids_are_summarised_in_ranges() -> None:
    assert summarize_ids([f"h{n:03d}" for n in range(1, 9)]) == "h001…h008"
    assert summarize_ids(["a", "b"]) == "a, b"
    assert summarize_ids([f"x{n}y" for n in range(10)], limit=2) == "x0y, x1y and 8 more (10 in all)"
    assert summarize_ids([]) == "none"


def test_a_big_json_file_is_read_from_disk_in_chunks(tmp_path: Path) -> None:
    arrivals = [{"vm_id": f"v{n}", "at_s": n, "mem_mb": 512, "vcpus": 1} for n in range(30_000)]
    file = tmp_path / "w.json"
    file.write_text(json.dumps(doc(arrivals=arrivals)))
    assert file.stat().st_size > 1 << 20  # more than one chunk
    assert len(read_workload(str(file)).arrivals) == 30_000


CSV = """kind,id,count,cpu_cores,mem_mb,labels,vcpus,at_s,affinity_groups,positive,enforcing,role,name,factor,value
host,h,2,16,65536,rack=r1;zone=a,,,,,,,,,
group,web,,,,,,,,false,true,,,,
arrival,vm1,,,4096,,2,0,web,,,,,,
arrival,vm2,,,4096,,2,5,web,,,,,,
policy,mine,,,,,,,,,,filter,Memory,,
policy,mine,,,,,,,,,,weight,OptimalForEvenDistribution,2,
policy,mine,,,,,,,,,,balance,OptimalForEvenDistribution,,
policy,mine,,,,,,,,,,property,HighUtilization,,70
policy,mine,,,,,,,,,,description,,,spread out
"""


def test_csv_declares_groups_labels_and_policies() -> None:
    w = parse_workload(CSV, "w.csv")
    assert [h.labels for h in w.hosts] == [{"rack": "r1", "zone": "a"}]
    assert [(g.id, g.positive, g.enforcing) for g in w.affinity_groups] == [("web", False, True)]
    assert [a.affinity_groups for a in w.arrivals] == [["web"], ["web"]]
    [p] = w.policies
    assert (p.name, p.description, [f.unit for f in p.filters]) == ("mine", "spread out", ["Memory"])
    assert [(x.unit, float(x.factor)) for x in p.weights] == [("OptimalForEvenDistribution", 2.0)]
    assert (p.balance, p.properties) == ("OptimalForEvenDistribution", {"HighUtilization": "70"})


def test_csv_policy_and_label_rows_say_what_is_wrong() -> None:
    with pytest.raises(InvalidRequest, match="line 6: policy role 'filtre' is not one of filter"):
        parse_workload(CSV.replace(",filter,", ",filtre,"), "w.csv")
    with pytest.raises(InvalidRequest, match="line 2: labels 'rack': write them key=value"):
        parse_workload(CSV.replace("rack=r1;zone=a", "rack"), "w.csv")


AZURE = [
    "vmid,subscriptionid,deploymentid,vmcreated,vmdeleted,maxcpu,avgcpu,p95maxcpu,vmcategory,vmcorecountbucket,vmmemorybucket",
    "x/Xs+O4=,sub1,dep1,300,3900,90.5,20.25,70.1,Interactive,2,4",
    "aB3,sub1,dep2,600,2592000,50,10,40,Delay-insensitive,>24,>64",
    "c9,sub2,dep3,0,86400,30,5.5,25,Unknown,8,32",
]


def test_the_azure_vm_table_becomes_arrivals_with_lifetimes_and_sizes() -> None:
    w = azure_workload(AZURE, "vmtable.csv", HostSpec(id="h", count=4, cpu_cores=64, mem_mb=512 * 1024))
    got = [(a.vm_id, a.at_s, a.lifetime_s, a.vcpus, a.mem_mb, a.cpu_usage_pct) for a in w.arrivals]
    assert got == [
        ("c9", 0, 86400, 8, 32 * 1024, 5.5),
        ("x.Xs-O4", 300, 3600, 2, 4 * 1024, 20.25),
        ("aB3", 600, 2592000 - 600, 48, 128 * 1024, 10),
    ]
    assert len(w.host_ids()) == 4
    p95 = azure_workload(AZURE[1:], "t", HostSpec(id="h", cpu_cores=64, mem_mb=1), load="p95")  # no header
    assert [a.cpu_usage_pct for a in p95.arrivals] == [25, 70.1, 40]


def test_a_bad_azure_row_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="line 2: 3 columns, not the Azure VM table's 11"):
        azure_workload([AZURE[0], "a,b,c"], "t.csv", HostSpec(id="h", cpu_cores=1, mem_mb=1))
    file = tmp_path / "vmtable.csv"
    file.write_text("\n".join(AZURE) + "\n")
    assert len(read_trace("azure", str(file), 3, None).arrivals) == 3
