"""The CLI answers a user's mistakes and a server that is down with a sentence, never a traceback,
and with an exit code that says which it was.

The servers here are addresses where nothing listens (a refused connection is immediate), so no
running server is needed; each other failure class is raised from inside a command.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import logging
import re
import signal
import socket
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import asyncpg
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import vmsched
from vmsched import errors
from vmsched.contracts import ClusterAttachment
from vmsched.settings import Settings
from vmsched_services.tools import policy_commands, units_cli
from vmsched_services.tools.cli import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    build_parser,
    explain_failure,
    main,
)
from vmsched_services.tools.contracts_cli import checkout_contracts

NOWHERE = "127.0.0.1:1"  # a port nothing listens on: connections are refused at once


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """argparse's own refusal: exit 2 and its message."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == EXIT_USAGE
    return capsys.readouterr().err


def failing_command(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    """`vmsched units list` raises `exc` (the parser is built when main runs, after the patch)."""

    def boom(args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr(units_cli, "cmd_units_list", boom)


# ---------------------------------------------------------------------- version and help


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"vmsched {version('vmsched')}\n"


def test_help_lists_the_exit_codes_and_the_servers_variables() -> None:
    text = build_parser().format_help()
    for code in (EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE):
        assert re.search(rf"^  {code}\s+\S", text, re.MULTILINE), code
    for variable in ("VMSCHED_AMQP_URL", "VMSCHED_REDIS_URL", "VMSCHED_POSTGRES_URL", "VMSCHED_DEBUG"):
        assert variable in text


def _parsers(parser: argparse.ArgumentParser, path: str = "vmsched") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _parsers(child, f"{path} {name}")
    return found


def test_every_option_has_help_and_a_setting_backed_one_names_its_variable() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 20
    for path, parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{path} {action.dest} has no help"
    helps = {path: p.format_help() for path, p in parsers}
    for path in ("vmsched schedule", "vmsched state", "vmsched ha-check", "vmsched hosts remove"):
        assert "$VMSCHED_RPC_TIMEOUT_S" in helps[path], path
    assert "$VMSCHED_POSTGRES_URL" in helps["vmsched db migrate"]
    assert "$VMSCHED_DECISION_HISTORY_MAX" in helps["vmsched decisions"]
    assert "policy link in" in helps["vmsched clusters remove"]


def test_debug_is_taken_before_or_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["--debug", "units", "list"]).debug
    assert parser.parse_args(["units", "list", "--debug"]).debug
    assert not parser.parse_args(["units", "list"]).debug


# ---------------------------------------------------------------------- input mistakes


def test_a_missing_vm_file_is_a_usage_error_naming_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "schedule", "--cluster", "c1", "--vm", "/nonexistent/vm.json")
    assert code == EXIT_USAGE
    assert err == "vmsched: /nonexistent/vm.json: cannot read it (No such file or directory)\n"


def test_a_vm_file_that_is_not_json_says_where(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    vm = tmp_path / "vm.json"
    vm.write_text('{"vm_id": "v1",\n  mem_mb: 5}')
    code, err = run(capsys, "schedule", "--cluster", "c1", "--vm", str(vm))
    assert code == EXIT_USAGE
    assert err.startswith(f"vmsched: {vm}: not valid JSON: ")
    assert "line 2 column 3" in err


def test_a_vm_that_does_not_validate_names_its_fields(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    vm = tmp_path / "vm.json"
    vm.write_text('{"vm_id": "v 1", "mem_mb": "5", "vcpus": 2, "extra_specs": {"a": 1}}')
    code, err = run(capsys, "schedule", "--cluster", "c1", "--vm", str(vm))
    assert code == EXIT_USAGE
    first = err.splitlines()[0]
    assert first.startswith(f"vmsched: {vm}: not a valid VM: ")
    for field in ("vm_id:", "mem_mb:", "extra_specs.a:"):
        assert field in first


def test_a_vm_from_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"[1, 2]")))
    code, err = run(capsys, "schedule", "--cluster", "c1", "--vm", "-")
    assert code == EXIT_USAGE
    assert err.startswith("vmsched: stdin: not a valid VM: (the document): ")


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", "--cluster", "c 1", "--vm", "vm.json"],
        ["state", "--cluster=.c1"],
        ["hosts", "remove", "--cluster", "c1", "h1", "h/2"],
        ["clusters", "remove", "x" * 65],
        ["schedule", "--cluster", "c1", "--vm", "vm.json", "--exclude", "h 1"],
    ],
)
def test_a_bad_id_is_refused_before_anything_is_sent(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    err = usage_error(capsys, *argv)
    assert "is not a valid id: 1 to 64 letters, digits and . _ : @ -, starting with a letter or digit" in err


def test_a_request_id_must_be_a_uuid(capsys: pytest.CaptureFixture[str]) -> None:
    assert "'nope' is not a request id: a UUID" in usage_error(capsys, "explain", "nope", "--cluster", "c1")


def test_a_setting_that_does_not_validate_names_its_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSCHED_RPC_TIMEOUT_S", "soon")
    code, err = run(capsys, "state", "--cluster", "c1")
    assert code == EXIT_USAGE
    assert err.startswith("vmsched: invalid setting: VMSCHED_RPC_TIMEOUT_S: ")


def test_requeue_needs_targets_or_all_and_all_needs_a_yes_without_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run(capsys, "dead-letters", "requeue")
    assert (code, err) == (EXIT_USAGE, "vmsched: name the dead letters to requeue (N or ID), or pass --all\n")
    code, _ = run(capsys, "dead-letters", "requeue", "3", "--all")
    assert code == EXIT_USAGE
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal
    code, err = run(capsys, "dead-letters", "requeue", "--all")
    assert code == EXIT_USAGE
    assert "needs confirmation" in err
    assert "--yes" in err


def test_hosts_register_names_each_bad_entry_its_host_and_field_and_publishes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "- {host_id: h1, status: up, cpu_cores: 8, physical_mem_mb: 4096, mem_free_mb: 4000}\n"
        "- {host_id: h2, status: sideways, cpu_cores: 8, physical_mem_mb: 4096, mem_free_mb: 4000}\n"
        "- {host_id: h3, status: up, cpu_cores: 8, physical_mem_mb: 4096, mem_fre_mb: 4000}\n"
        "- {cluster_id: c2, host_id: h4, status: up, cpu_cores: 8, physical_mem_mb: 4096, mem_free_mb: 4000}\n"
        "- 7\n"
    )
    code, err = run(capsys, "hosts", "register", "--cluster", "c1", str(hosts))
    assert code == EXIT_USAGE
    lines = err.splitlines()
    assert lines[0] == f"vmsched: {hosts}: 4 problem(s), nothing published:"
    assert lines[1].startswith("  entry 2 (host h2): status: Input should be ")
    assert lines[2:5] == [
        "  entry 3 (host h3): mem_fre_mb: not a field of a host report",
        "  entry 4 (host h4): cluster_id: 'c2' is not the cluster named by --cluster, c1",
        "  entry 5: expected a mapping of a host's fields, not int",
    ]
    assert len(lines) == 6  # and the hint
    assert lines[5].startswith("  fix the entries named above")


def test_hosts_register_reads_the_whole_file_before_it_connects(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts.json"
    entry = {"host_id": "h1", "status": "up", "cpu_cores": 8, "physical_mem_mb": 4096, "mem_free_mb": 4000}
    hosts.write_text(json.dumps({"hosts": [entry, entry]}))
    code, err = run(capsys, "hosts", "register", "--cluster", "c1", str(hosts))
    assert (code, err.splitlines()[1]) == (EXIT_USAGE, "  entry 2 (host h1): host_id: entry 1 is that host too")
    hosts.write_text(json.dumps([entry]))  # valid, no reported_at: so the broker is asked, and is away
    monkeypatch.setenv("VMSCHED_AMQP_URL", f"amqp://guest:guest@{NOWHERE}/")
    code, err = run(capsys, "hosts", "register", "--cluster", "c1", str(hosts))
    assert code == EXIT_ERROR
    assert err.startswith("vmsched: bus_unavailable: ")
    hosts.write_text("{}")
    code, err = run(capsys, "hosts", "register", "--cluster", "c1", str(hosts))
    assert code == EXIT_USAGE
    assert err.startswith(f"vmsched: {hosts}: expected a list of hosts")


# ---------------------------------------------------------------------- servers that are down


def test_an_unreachable_broker_is_named_with_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSCHED_AMQP_URL", f"amqp://guest:secret@{NOWHERE}/")
    code, err = run(capsys, "state", "--cluster", "c1")
    assert code == EXIT_ERROR
    assert err.startswith(f"vmsched: bus_unavailable: nothing listens at {NOWHERE} (connection refused)")
    assert f"amqp://guest:***@{NOWHERE}/" in err
    assert "VMSCHED_AMQP_URL" in err
    assert "rabbitmq-server -detached" in err
    assert "secret" not in err


def test_an_unreachable_redis_is_named_with_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSCHED_REDIS_URL", f"redis://:secret@{NOWHERE}/0")
    for argv in (
        ["explain", "00000000-0000-0000-0000-000000000001", "--cluster", "c1"],
        ["decisions", "--cluster", "c1"],
    ):
        code, err = run(capsys, *argv)
        assert code == EXIT_ERROR
        assert err.startswith(f"vmsched: redis_unavailable: nothing listens at {NOWHERE} (connection refused)")
        assert f"redis://:***@{NOWHERE}/0" in err
        assert "VMSCHED_REDIS_URL" in err
        assert "redis-server" in err
        assert "secret" not in err


def test_an_unreachable_postgresql_is_named_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "db", "migrate", "--dsn", f"postgresql://admin:secret@{NOWHERE}/vmsched")
    assert code == EXIT_ERROR
    assert f"nothing listens at {NOWHERE} (connection refused)" in err
    assert "VMSCHED_POSTGRES_URL" in err
    assert "pg_ctlcluster" in err
    assert "secret" not in err


# ---------------------------------------------------------------------- every failure class

FAILURES: list[tuple[BaseException, int, str, str | None]] = [
    (errors.NoConsumer("no service serves 'state'"), EXIT_ERROR, "no_consumer: no service serves", "state-tracker"),
    (errors.RpcTimeout("no reply to 'state' within 5 s"), EXIT_ERROR, "rpc_timeout: no reply", "--timeout"),
    (
        errors.RemoteError("unknown_cluster", "no state reported for cluster c9", location="cluster_id"),
        EXIT_NOT_FOUND,
        "unknown_cluster: cluster c9 is unknown: no state has been reported for it",
        "vmsched clusters list",
    ),
    (errors.RemoteError("internal", "internal error (reference ab12)"), EXIT_ERROR, "internal:", "reference above"),
    (errors.RemoteError("policy_not_found", "no policy named x"), EXIT_NOT_FOUND, "policy_not_found:", "policy list"),
    (errors.DatabaseMissing('database "x" does not exist'), EXIT_ERROR, "database_missing:", "vmsched db migrate"),
    (errors.LockTimeout("lock of c1 not acquired"), EXIT_ERROR, "lock_timeout: lock of c1", None),
    (errors.InvalidRequest("must be 1 or more", location="vm.vcpus"), EXIT_ERROR, "invalid_request: vm.vcpus:", None),
    (RedisConnectionError("Error 111 connecting"), EXIT_ERROR, "redis_unavailable: Redis at 127.0.0.1", "redis-server"),
    (asyncpg.exceptions.UndefinedTableError("relation does not exist"), EXIT_ERROR, "PostgreSQL at", None),
    (PermissionError(13, "Permission denied", "/etc/vm.json"), EXIT_USAGE, "/etc/vm.json: Permission denied", None),
    (ConnectionRefusedError(111, "Connection refused"), EXIT_ERROR, "ConnectionRefusedError", "scripts/servers.sh"),
    (ExceptionGroup("tasks", [errors.RpcTimeout("late")]), EXIT_ERROR, "rpc_timeout: late", None),
]


@pytest.mark.parametrize(("exc", "code", "message", "hint"), FAILURES, ids=lambda v: type(v).__name__)
def test_each_failure_class_is_a_sentence_with_a_hint_and_its_exit_code(
    exc: BaseException, code: int, message: str, hint: str | None
) -> None:
    told = explain_failure(exc, needs="state-tracker", cluster="c9")
    assert told is not None
    assert told.code == code
    assert message in told.message
    if hint is not None:
        assert told.hint is not None
        assert hint in told.hint


def test_not_found_is_exit_1_whichever_service_answered_but_schedule_keeps_1_for_unplaceable() -> None:
    for code in ("unknown_cluster", "policy_not_found"):
        told = explain_failure(errors.RemoteError(code, "no such thing"))
        assert told is not None
        assert told.code == EXIT_NOT_FOUND
        told = explain_failure(errors.RemoteError(code, "no such thing"), missing=EXIT_ERROR)
        assert told is not None
        assert told.code == EXIT_ERROR


class _NoBus:
    """A PolicyClient that connects nowhere: the command decides what happens."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    async def __aenter__(self) -> _NoBus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_policy_commands_end_a_not_found_answer_with_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def missing(args: argparse.Namespace, admin: object) -> int:
        raise errors.RemoteError("policy_not_found", "no policy named nope")

    monkeypatch.setattr(policy_commands, "PolicyClient", _NoBus)
    code = policy_commands.run(missing, argparse.Namespace(policy_command="show"), Settings())
    err = capsys.readouterr().err
    assert code == EXIT_NOT_FOUND
    assert "policy_not_found: no policy named nope" in err
    assert "`vmsched policy list`" in err


def test_a_taken_metrics_port_is_a_setting_error_naming_the_port(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("VMSCHED_METRICS_PORT", str(port))
        monkeypatch.setenv("VMSCHED_AMQP_URL", f"amqp://guest:guest@{NOWHERE}/")  # never reached
        code, err = run(capsys, "run", "state-tracker")
    assert code == EXIT_USAGE
    lines = err.splitlines()
    assert f"vmsched: metrics port {port} is taken: another process listens on 127.0.0.1:{port}" in lines[-2]
    assert "VMSCHED_METRICS_PORT" in lines[-2]
    assert lines[-1].startswith("  set VMSCHED_METRICS_PORT to a free port")


def test_attach_keeps_the_clusters_overrides_and_ha_reservation_unless_changed_and_says_what_goes() -> None:
    current = ClusterAttachment(cluster_id="c1", policy="p", properties={"A": "1", "B": "2"}, ha_reservation=True)
    kept, notes = policy_commands.merged_attachment(current, "c1", "q", set_={"B": "3"}, unset=[], ha_reservation=None)
    assert (kept.policy, kept.properties, kept.ha_reservation, notes) == ("q", {"A": "1", "B": "3"}, True, [])

    off, notes = policy_commands.merged_attachment(current, "c1", "p", set_={}, unset=["A"], ha_reservation=False)
    assert (off.properties, off.ha_reservation) == ({"B": "2"}, False)
    assert notes == ["property override A=1 removed", "HA reservation turned OFF for cluster c1 (it was on)"]

    new, notes = policy_commands.merged_attachment(None, "c2", "p", set_={"A": "1"}, unset=[], ha_reservation=None)
    assert (new.properties, new.ha_reservation, notes) == ({"A": "1"}, False, [])
    with pytest.raises(errors.InvalidRequest, match="--unset X: cluster c1 has no override of X"):
        policy_commands.merged_attachment(current, "c1", "p", set_={}, unset=["X"], ha_reservation=None)


def test_a_failure_is_printed_as_code_message_and_hint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_command(monkeypatch, errors.NoConsumer("no service serves 'ha-check'"))
    code, err = run(capsys, "units", "list")
    assert code == EXIT_ERROR
    assert err.splitlines() == [
        "vmsched: no_consumer: no service serves 'ha-check'",
        "  start the services (`vmsched up`, or `vmsched run SERVICE` for each)",
    ]


def test_an_unexpected_error_is_one_line_with_a_reference_and_the_traceback_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VMSCHED_DEBUG", raising=False)
    failing_command(monkeypatch, ZeroDivisionError("division by zero"))
    code, err = run(capsys, "units", "list")
    assert code == EXIT_ERROR
    first, second = err.splitlines()
    match = re.fullmatch(r"vmsched: unexpected error \(reference (\w{8})\): ZeroDivisionError: division by zero", first)
    assert match is not None
    kept = re.search(r"the traceback is in (\S+);", second)
    assert kept is not None
    assert match.group(1) in kept.group(1)
    saved = Path(kept.group(1)).read_text()
    assert "Traceback" in saved
    assert "ZeroDivisionError" in saved
    Path(kept.group(1)).unlink()


@pytest.mark.parametrize("how", ["--debug", "VMSCHED_DEBUG"])
def test_debug_shows_the_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    failing_command(monkeypatch, ZeroDivisionError("division by zero"))
    if how == "VMSCHED_DEBUG":
        monkeypatch.setenv("VMSCHED_DEBUG", "1")
        code = main(["units", "list"])
    else:
        monkeypatch.delenv("VMSCHED_DEBUG", raising=False)
        code = main(["units", "list", "--debug"])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert "Traceback (most recent call last)" in err
    assert "ZeroDivisionError: division by zero" in err


@pytest.fixture
def sigint_restored() -> Iterator[None]:
    """main ignores Ctrl-C once interrupted (the process is ending); the test process must not."""
    handler = signal.getsignal(signal.SIGINT)
    # Python's own: whatever an earlier test left (an event loop's handler) must not decide this one.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, handler)
    logging.getLogger("asyncio").setLevel(logging.NOTSET)


@pytest.mark.usefixtures("sigint_restored")
def test_ctrl_c_exits_130_with_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    failing_command(monkeypatch, KeyboardInterrupt())
    assert run(capsys, "units", "list") == (EXIT_INTERRUPTED, "vmsched: interrupted\n")


@pytest.mark.usefixtures("sigint_restored")
def test_ctrl_c_twice_during_a_commands_cleanup_is_one_line_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second Ctrl-C lands while asyncio.run cancels the command's tasks (as `policy apply`
    closing its connection): no traceback, now or when the stopped task is collected."""

    async def go() -> None:
        async def closing() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, during the cleanup
                await asyncio.sleep(0.01)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(closing())
            await asyncio.sleep(0)
            signal.raise_signal(signal.SIGINT)  # the first
            await asyncio.sleep(60)

    def command(args: argparse.Namespace) -> int:
        asyncio.run(go())
        return EXIT_OK

    monkeypatch.setattr(units_cli, "cmd_units_list", command)
    code = main(["units", "list"])
    gc.collect()  # asyncio logs a task that ended in an exception no one retrieved when it is collected
    assert (code, capsys.readouterr().err) == (EXIT_INTERRUPTED, "vmsched: interrupted\n")


@pytest.mark.usefixtures("sigint_restored")
def test_ctrl_c_inside_a_task_group_is_an_interruption(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_command(monkeypatch, BaseExceptionGroup("tasks", [KeyboardInterrupt()]))
    assert run(capsys, "units", "list") == (EXIT_INTERRUPTED, "vmsched: interrupted\n")


class _ClosedPipe(io.StringIO):
    """stdout whose reader went away (`vmsched units list | head -1`)."""

    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_that_goes_away_ends_the_command_quietly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with capsys.disabled():
        monkeypatch.setattr(sys, "stdout", _ClosedPipe())
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert main(["units", "list"]) == EXIT_BROKEN_PIPE
    assert err.getvalue() == ""


# ---------------------------------------------------------------------- contracts --check


def test_contracts_check_in_this_checkout_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = checkout_contracts(Path(vmsched.__file__).resolve().parent)
    assert root is not None
    assert root.is_dir()
    assert root.parent.joinpath("pyproject.toml").is_file()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)  # found next to the package, wherever it is run from
        assert main(["contracts", "--check"]) == EXIT_OK
    assert capsys.readouterr().out == f"{root} matches the message models\n"


def test_contracts_check_of_a_missing_directory_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run(capsys, "contracts", "--check", "--out", str(tmp_path / "nowhere"))
    assert code == EXIT_ERROR
    assert err.startswith(f"vmsched: {tmp_path / 'nowhere'} does not exist: there is nothing to check")


def test_contracts_check_outside_a_checkout_does_not_claim_success(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installed = tmp_path / "lib" / "python3.11" / "site-packages" / "vmsched"
    installed.mkdir(parents=True)
    monkeypatch.setattr(vmsched, "__file__", str(installed / "__init__.py"))
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, "contracts", "--check")
    assert code == EXIT_ERROR
    assert err.startswith(f"vmsched: no contracts/ directory next to the installed package ({installed})")
    assert "--out DIR" in err
    assert "matches" not in capsys.readouterr().out


def test_contracts_check_of_a_stale_directory_lists_the_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["contracts", "--out", str(tmp_path)]) == EXIT_OK
    (tmp_path / "schemas" / "HostRemoved.json").write_text("{}\n")
    (tmp_path / "schemas" / "Extra.json").write_text("{}\n")
    capsys.readouterr()
    code, err = run(capsys, "contracts", "--check", "--out", str(tmp_path))
    assert code == EXIT_NOT_FOUND
    assert "schemas/HostRemoved.json, schemas/Extra.json" in err
