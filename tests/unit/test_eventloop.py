"""VMSCHED_EVENT_LOOP: which loop the services run on."""

from __future__ import annotations

import asyncio
import sys

import pytest

from vmsched.errors import UsageError
from vmsched.settings import Settings
from vmsched_services import eventloop

uvloop = pytest.importorskip("uvloop")


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_runs_the_services_on_uvloop_when_it_is_installed() -> None:
    assert eventloop.loop_factory("auto")[0] == "uvloop"
    assert eventloop.run(_loop_type(), Settings(event_loop="auto")).startswith("uvloop")


def test_asyncio_keeps_asyncio_s_own_loop() -> None:
    assert eventloop.loop_factory("asyncio") == ("asyncio", None)
    assert eventloop.run(_loop_type(), Settings(event_loop="asyncio")).startswith("asyncio")


def test_a_setting_that_is_no_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="event_loop"):
        Settings(event_loop="trio")


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import uvloop` raise ImportError, as on a machine without it.
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    assert eventloop.loop_factory("auto") == ("asyncio", None)


def test_insisting_on_uvloop_without_it_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    with pytest.raises(UsageError, match="uvloop is not installed") as raised:
        eventloop.loop_factory("uvloop")
    assert raised.value.hint is not None
    assert "pip install uvloop" in raised.value.hint
