"""Every file and standard input a `vmsched` command reads is bounded before it is parsed.

A 20 MB policy file once took minutes and gigabytes to be refused, a 50 MB one crashed the command,
a 50 MB workload took 5 minutes to fail on one bad reference. Here: a file over its cap is refused
from its size (the big files are sparse: 1 GB that costs no disk, and would cost a gigabyte of memory
and seconds if it were read), standard input is read at most cap + 1 bytes, JSON is read as JSON,
YAML aliases and deep nesting are refused where they are, and a workload's bad reference is named
before the workload is validated.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from vmsched import bounded_text
from vmsched.bounded_text import MAX_DEPTH
from vmsched.errors import InvalidRequest
from vmsched.simulation.workload import Workload
from vmsched_services.tools.cli import EXIT_USAGE, main
from vmsched_services.tools.inputs import byte_size, human

NOWHERE = {"VMSCHED_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/"}  # nothing listens: a file read first


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that got as far as the bus would fail saying so: these must stop at the file."""
    for name, value in NOWHERE.items():
        monkeypatch.setenv(name, value)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "RabbitMQ" not in err
    return code, err


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk (a hole), for the caps."""
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


GB = 1 << 30


# ------------------------------------------------------------------------------- size caps
def test_a_policy_file_over_its_cap_is_refused_unread_saying_what_where_and_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = sparse(tmp_path / "big.yaml", GB)
    code, err = run(capsys, "policy", "apply", "-f", str(big), "--dry-run")
    assert code == EXIT_USAGE
    assert err == (
        f"vmsched: policy file {big} is 1 GB; policies are at most 1 MB (is this the right file?)\n"
        "  --max-size SIZE reads a bigger one\n"
    )


def test_max_size_raises_the_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "p.yaml"
    file.write_text("policies: []\n# " + "x" * 2000 + "\n")
    code, err = run(capsys, "policy", "apply", "-f", str(file), "--max-size", "1K")
    assert code == EXIT_USAGE
    assert "is 2.0 KB; policies are at most 1 KB" in err
    file.write_text("policies: 5\n# " + "x" * 2000 + "\n")
    code, err = run(capsys, "policy", "apply", "-f", str(file), "--max-size", "1M")
    assert code == EXIT_USAGE
    assert err.startswith(f"vmsched policy: {file}: 1 problem(s):\n  policies:")  # read, then validated


class _Endless(io.RawIOBase):
    """Standard input that never ends; it records how much was asked of it."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        assert size >= 0, "read to the end of an endless stream"
        self.asked.append(size)
        return b"#" * size


def test_standard_input_is_read_at_most_the_cap_and_one_byte(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = _Endless()
    monkeypatch.setattr(sys, "stdin", argparse.Namespace(buffer=stdin))
    code, err = run(capsys, "policy", "apply", "-f", "-", "--max-size", "4K")
    assert code == EXIT_USAGE
    assert err.startswith(
        "vmsched: policy file on standard input is more than 4 KB; policies are at most 4 KB (is this the right file?)"
    )
    assert stdin.asked == [4097]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["schedule", "--cluster", "c1", "--vm", "{}"], "VM file {} is 1 GB; VMs are at most 1 MB"),
        (["policy", "import-nova", "{}", "--name", "n"], "nova.conf {} is 1 GB; nova.conf files are at most 4 MB"),
        (
            ["simulate", "--workload", "{}.json"],
            "workload file {}.json is 1 GB; JSON and CSV workloads are at most 64 MB",
        ),
        (["simulate", "--workload", "{}.yaml"], "workload file {}.yaml is 1 GB; YAML workloads are at most 10 MB"),
        (["simulate", "--vms", "1", "--policy", "{}"], "policy file {} is 1 GB; policies are at most 1 MB"),
    ],
)
def test_every_file_a_command_reads_has_a_cap(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = str(tmp_path / "big")
    argv = [a.replace("{}", base) for a in argv]
    sparse(Path(next(a for a in argv if a.startswith(base))), GB)
    code, err = run(capsys, *argv)
    assert code == EXIT_USAGE
    assert said.replace("{}", base) in err


def test_a_yaml_workload_over_its_cap_is_pointed_at_json_and_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = sparse(tmp_path / "w.yaml", 11 << 20)
    code, err = run(capsys, "simulate", "--workload", str(big))
    assert code == EXIT_USAGE
    assert "write it as JSON (.json, read up to 64 MB), or pass --max-workload-size SIZE" in err
    code, err = run(capsys, "simulate", "--workload", str(big), "--max-workload-size", "1G")
    assert code == EXIT_USAGE
    assert "YAML workloads are at most" not in err  # read, and then found not to be a workload (NUL bytes)


@pytest.mark.parametrize(("text", "n"), [("300", 300), ("4K", 4096), ("1.5 MB", 1572864), ("2g", 2 * GB)])
def test_sizes_are_given_with_k_m_g(text: str, n: int) -> None:
    assert byte_size(text) == n


@pytest.mark.parametrize("text", ["lots", "-1", "0", "1T"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        byte_size(text)


def test_sizes_are_said_as_people_say_them() -> None:
    assert [human(n) for n in (300, 4096, 20 * (1 << 20) + 20000, GB)] == ["300 bytes", "4 KB", "20.0 MB", "1 GB"]


# ------------------------------------------------------------------------------- JSON and YAML
def test_json_is_read_as_json_and_yaml_as_yaml() -> None:
    # 1e3 is a number to JSON and a string to YAML 1.1: which parser read it shows.
    assert bounded_text.load('{"x": 1e3}', "p.json") == {"x": 1000.0}
    assert bounded_text.load('{"x": 1e3}', "-") == {"x": 1000.0}  # standard input that starts as JSON does
    assert bounded_text.load("x: 1e3", "p.yaml") == {"x": "1e3"}
    assert bounded_text.load("{x: 1e3}", "-") == {"x": "1e3"}  # YAML's flow style, not JSON: read as YAML
    with pytest.raises(InvalidRequest, match=r"^p\.json: not valid JSON: .* at line 2 column 3$"):
        bounded_text.load('{"x": 1,\n  y: 2}', "p.json")  # a .json file is JSON only


def test_a_policy_file_in_json_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "p.json"
    file.write_text(json.dumps({"policies": [{"name": "p", "filters": ["Memory"]}]}))
    code, err = run(capsys, "simulate", "--policy", str(file), "--hosts", "2", "--vms", "3", "--hours", "1")
    assert code == 0, err


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{chr(c)}: &{chr(c)} [{', '.join([f'*{chr(c - 1)}'] * 9)}]\n" for c in range(ord("c"), ord("j"))
)


def test_yaml_aliases_are_refused_where_they_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "laughs.yaml"
    file.write_text(BILLION_LAUGHS)
    code, err = run(capsys, "policy", "apply", "-f", str(file))
    assert code == EXIT_USAGE
    assert err == f"vmsched policy: {file}: line 2 column 8: an alias (*a): aliases and anchors are not accepted\n"


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("p.yaml", "policies:\n  - " + "[" * 40 + "]" * 40, f"line 2 column {4 + MAX_DEPTH - 1}"),
        ("p.json", '{"policies":\n' + "[" * 40 + "]" * 40 + "}", f"line 2 column {MAX_DEPTH}"),
        ("p.json", "[" * 100_000 + "]" * 100_000, f"line 1 column {MAX_DEPTH + 1}"),  # past json's own recursion
    ],
)
def test_deep_nesting_is_refused_where_it_is(name: str, text: str, where: str, tmp_path: Path) -> None:
    file = tmp_path / name
    file.write_text(text)
    with pytest.raises(InvalidRequest) as info:
        bounded_text.load(file.read_text(), name)
    assert str(info.value) == f"{name}: {where}: nested more than {MAX_DEPTH} levels deep"


# ------------------------------------------------------------------------------- workloads
def test_a_bad_reference_deep_in_a_big_workload_is_named_before_it_is_validated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    arrivals = [{"at_s": n, "vm_id": f"vm{n}", "mem_mb": 512, "vcpus": 1} for n in range(20_000)]
    arrivals[19_000]["pinned_hosts"] = ["h1", "nowhere"]
    file = tmp_path / "w.json"
    file.write_text(
        json.dumps({"hosts": [{"id": "h", "count": 3, "cpu_cores": 4, "mem_mb": 8192}], "arrivals": arrivals})
    )

    def not_validated(*args: object, **kwargs: object) -> None:
        raise AssertionError("validated before its references were checked")

    monkeypatch.setattr(Workload, "model_validate", not_validated)
    code, err = run(capsys, "simulate", "--workload", str(file))
    assert code == EXIT_USAGE
    assert err.startswith(
        f"vmsched: {file}: arrivals.19000.pinned_hosts: vm vm19000 names host nowhere: no such host; hosts are h1…h3\n"
    )


def test_host_counts_may_not_expand_past_the_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "w.yaml"
    file.write_text(
        "hosts:\n" + "".join(f"  - {{id: r{n}-, count: 100000, cpu_cores: 4, mem_mb: 1}}\n" for n in range(9))
    )
    code, err = run(capsys, "simulate", "--workload", str(file))
    assert code == EXIT_USAGE
    assert "hosts.1: more than 100,000 hosts (counts expanded); a workload has at most 100,000" in err


def test_a_file_that_is_not_utf8_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "p.yaml"
    file.write_bytes(b"policies: []\n\xff\n")
    code, err = run(capsys, "policy", "apply", "-f", str(file))
    assert code == EXIT_USAGE
    assert err.startswith(f"vmsched: policy file {file}: not UTF-8 text (byte 14 is not)")


def test_a_device_is_read_no_further_than_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    # A device's (a pipe's, /proc's) size is 0 to stat: what bounds it is reading at most cap + 1 bytes.
    code, err = run(capsys, "schedule", "--cluster", "c1", "--vm", "/dev/zero")
    assert code == EXIT_USAGE
    assert err.startswith("vmsched: VM file /dev/zero is more than 1 MB; VMs are at most 1 MB")
