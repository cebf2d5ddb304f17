"""`vmsched security init|print`: a credentials directory nobody else can read, whose definitions
hold no password in clear, and whose passwords stay put until rotated."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from vmsched_services.tools.cli import EXIT_OK, EXIT_USAGE, main
from vmsched_services.tools.security.credentials import OPS, SERVERS, Credentials


def init(capsys: pytest.CaptureFixture[str], directory: Path, *extra: str) -> str:
    assert main(["security", "init", str(directory), *extra]) == EXIT_OK
    return capsys.readouterr().out


def clear_passwords(directory: Path) -> list[str]:
    return [p.read_text().strip() for p in (directory / "passwords").rglob("*") if p.is_file()]


def test_every_file_is_readable_by_its_owner_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "creds"
    init(capsys, d)
    files = [p for p in d.rglob("*") if p.is_file()]
    assert files
    assert [p for p in files if stat.S_IMODE(p.stat().st_mode) != 0o600] == []
    dirs = [d, *(p for p in d.rglob("*") if p.is_dir())]
    assert [p for p in dirs if stat.S_IMODE(p.stat().st_mode) != 0o700] == []


def test_definitions_hold_no_clear_password(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "creds"
    out = init(capsys, d)
    secrets = clear_passwords(d)
    assert len(secrets) == sum(len(s) for s in SERVERS.values()) + 3  # and the operator's three
    assert len(set(secrets)) == len(secrets), "every role and server has a password of its own"
    for server in ("rabbitmq", "redis", "postgres"):
        assert main(["security", "print", server, str(d)]) == EXIT_OK
        printed = capsys.readouterr().out
        assert printed
        assert not [s for s in secrets if s in printed], server
    assert not [s for s in secrets if s in out]
    users = {u["name"] for u in json.loads((d / "rabbitmq" / "definitions.json").read_text())["users"]}
    assert {"vmsched-engine", "vmsched-selector", "vmsched-admin", "vmsched-api", "vmsched-ops"} <= users


def test_each_role_gets_the_urls_of_the_servers_it_uses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "creds"
    init(capsys, d, "--amqp", "rabbitmq:5672", "--redis", "redis:6379", "--postgres", "postgres:5432")
    creds = Credentials.load(d)
    selector_amqp = (d / "selector" / "amqp_url").read_text().strip()
    assert selector_amqp == f"amqp://vmsched-selector:{creds.of('amqp')['selector']}@rabbitmq:5672/%2F"
    assert (d / "selector" / "postgres_url").read_text().startswith("postgresql://vmsched_selector:")
    assert not (d / "engine" / "redis_url").exists(), "the engine talks to the bus only"
    assert (d / "api" / "amqp_url").read_text().startswith("amqp://vmsched-api:")
    assert not (d / "api" / "redis_url").exists(), "the api talks to the bus only"
    assert not (d / "api" / "postgres_url").exists(), "the api talks to the bus only"
    assert "VMSCHED_AMQP_EVENTS_QUEUE=vmsched.engine.events" in (d / "engine" / "env").read_text()
    assert (d / OPS / "postgres_url").read_text().startswith("postgresql://postgres:")


def test_passwords_are_kept_until_rotated(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "creds"
    init(capsys, d)
    before = Credentials.load(d).passwords
    init(capsys, d)
    assert Credentials.load(d).passwords == before
    out = init(capsys, d, "--rotate", "engine")
    assert "engine" in out
    after = Credentials.load(d).passwords
    assert after["amqp"]["engine"] != before["amqp"]["engine"]
    assert after["amqp"]["selector"] == before["amqp"]["selector"]


def test_an_unknown_role_to_rotate_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["security", "init", str(tmp_path / "c"), "--rotate", "nobody"]) == EXIT_USAGE
    assert "unknown role" in capsys.readouterr().err


def test_print_of_a_directory_that_is_not_one_says_how_to_make_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["security", "print", "rabbitmq", str(tmp_path)]) == EXIT_USAGE
    assert "vmsched security init" in capsys.readouterr().err
