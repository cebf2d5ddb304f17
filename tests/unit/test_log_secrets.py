"""The last line of defence: the process's secrets are masked in every log line (ours and the client
libraries'), in /readyz's error texts and in what `vmsched` prints when it fails."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from vmsched.health import _error_text
from vmsched.logging import MASK, SECRETS, SecretRegistry, configure, get_logger
from vmsched_services.tools.failures import masked, report_unexpected

PASSWORD = "s3cret-log-Zk2"
OTHER = "hunter2-other"


@pytest.fixture
def secrets() -> Iterator[None]:
    SECRETS.add([PASSWORD, OTHER])
    yield
    SECRETS.clear()


@pytest.fixture
def json_logs(secrets: None) -> Iterator[None]:
    configure("INFO", "json", service="test")
    logging.getLogger("aiormq").setLevel(logging.NOTSET)  # the CLI silences it for its own output
    yield
    configure("WARNING", "console")  # what the rest of the suite runs with


class Opaque:
    def __repr__(self) -> str:
        return f"<Opaque amqp://u:{PASSWORD}@h/>"


@pytest.mark.usefixtures("json_logs")
def test_our_lines_mask_secrets_in_every_value(capsys: pytest.CaptureFixture[str]) -> None:
    log = get_logger("test.secrets")
    log.warning(
        f"connect to amqp://u:{PASSWORD}@h/ failed",
        url=f"redis://:{PASSWORD}@r/0",
        nested={"tried": [f"x{OTHER}y", 3, None], PASSWORD: True},
        obj=Opaque(),
        count=2,
    )
    line = capsys.readouterr().err
    assert PASSWORD not in line
    assert OTHER not in line
    record = json.loads(line)
    assert record["event"] == f"connect to amqp://u:{MASK}@h/ failed"
    assert record["url"] == f"redis://:{MASK}@r/0"
    assert record["nested"] == {"tried": [f"x{MASK}y", 3, None], MASK: True}
    assert record["obj"] == f"<Opaque amqp://u:{MASK}@h/>"
    assert record["count"] == 2


@pytest.mark.usefixtures("json_logs")
def test_tracebacks_are_masked(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise ValueError(f"bad password {PASSWORD}")
    except ValueError:
        get_logger("test.secrets").exception("failed")
        logging.getLogger("somelib").exception("failed too")
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert err.count(f"bad password {MASK}") == 2


@pytest.mark.usefixtures("json_logs")
def test_client_library_lines_are_masked(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise ConnectionError(f"cannot log in with {PASSWORD}")
    except ConnectionError:
        logging.getLogger("aiormq.connection").exception("connection to amqp://u:%s@h/ lost", PASSWORD)
    err = capsys.readouterr().err
    assert PASSWORD not in err
    event = json.loads(err)["event"]
    assert event == f"connection to amqp://u:{MASK}@h/ lost: ConnectionError: cannot log in with {MASK}"


def test_console_lines_are_masked(secrets: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure("INFO", "console")
    try:
        get_logger("test.secrets").warning("away", error=f"auth {PASSWORD}")
    finally:
        configure("WARNING", "console")
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert f"auth {MASK}" in err


def test_a_secret_inside_another_is_masked_whole() -> None:
    registry = SecretRegistry()
    registry.add(["abcd", "xxabcdyy"])
    assert registry.mask("1 xxabcdyy 2 abcd") == f"1 {MASK} 2 {MASK}"


def test_short_values_are_not_masked() -> None:
    registry = SecretRegistry()
    registry.add(["abc", ""])
    assert not registry
    assert registry.mask("abc") == "abc"


def test_readiness_errors_are_masked(secrets: None) -> None:
    assert _error_text(ConnectionError(f"AUTH {PASSWORD} refused")) == f"ConnectionError: AUTH {MASK} refused"


def test_command_failures_are_masked(secrets: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert masked(f"PostgreSQL at postgresql://u:{PASSWORD}@h/d") == f"PostgreSQL at postgresql://u:{MASK}@h/d"
    report_unexpected(RuntimeError(f"kaboom {PASSWORD}"), debug=True)
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert f"RuntimeError: kaboom {MASK}" in err
    assert "Traceback" in err or "RuntimeError" in err
