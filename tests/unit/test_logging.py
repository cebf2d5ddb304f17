"""Client libraries' log records: same line format as ours, connection losses without a traceback."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from vmsched.logging import configure


@pytest.fixture
def json_logs() -> Iterator[None]:
    configure("INFO", "json", service="test")
    logging.getLogger("aiormq").setLevel(logging.NOTSET)  # the CLI silences it for its own output
    yield
    configure("WARNING", "console")  # what the rest of the suite runs with


@pytest.mark.usefixtures("json_logs")
def test_a_dropped_connection_logged_by_aiormq_is_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise ConnectionError("CONNECTION_FORCED - broker restarting")
    except ConnectionError:
        logging.getLogger("aiormq.connection").exception("Cancelling cause reader exited abnormally")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["event"] == (
        "Cancelling cause reader exited abnormally: ConnectionError: CONNECTION_FORCED - broker restarting"
    )
    assert record["logger"] == "aiormq.connection"
    assert record["level"] == "error"


@pytest.mark.usefixtures("json_logs")
def test_other_libraries_keep_their_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise ValueError("a bug somewhere")
    except ValueError:
        logging.getLogger("somelib").exception("failed")
    record = json.loads(capsys.readouterr().err.strip())
    assert "Traceback" in record["exception"]
