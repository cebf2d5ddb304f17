"""The CLI answers a user's mistakes and a server that is down with a sentence, never a traceback.

The servers here are addresses where nothing listens (a refused connection is immediate), so no
running server is needed.
"""

from __future__ import annotations

import pytest

from vmsched_services.tools.cli import EXIT_ERROR, EXIT_USAGE, main

NOWHERE = "127.0.0.1:1"  # a port nothing listens on: connections are refused at once


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("vmsched ")


def test_a_missing_vm_file_is_a_usage_error_naming_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "schedule", "--cluster", "c1", "--vm", "/nonexistent/vm.json")
    assert code == EXIT_USAGE
    assert err == "vmsched: /nonexistent/vm.json: No such file or directory\n"


def test_an_unreachable_broker_is_named_with_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSCHED_AMQP_URL", f"amqp://guest:secret@{NOWHERE}/")
    code, err = run(capsys, "state", "--cluster", "c1")
    assert code == EXIT_ERROR
    assert f"RabbitMQ at amqp://guest:***@{NOWHERE}/ is unreachable" in err
    assert "VMSCHED_AMQP_URL" in err
    assert "secret" not in err


def test_an_unreachable_redis_is_named_with_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VMSCHED_REDIS_URL", f"redis://{NOWHERE}/0")
    code, err = run(capsys, "explain", "00000000-0000-0000-0000-000000000001")
    assert code == EXIT_ERROR
    assert f"Redis (redis://{NOWHERE}/0) is unreachable" in err
    assert "VMSCHED_REDIS_URL" in err


def test_an_unreachable_postgresql_is_named_without_its_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run(capsys, "db", "migrate", "--dsn", f"postgresql://admin:secret@{NOWHERE}/vmsched")
    assert code == EXIT_ERROR
    assert f"PostgreSQL at {NOWHERE}/vmsched is unreachable" in err
    assert "VMSCHED_POSTGRES_URL" in err
    assert "secret" not in err
