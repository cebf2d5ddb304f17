"""The event loop the services run on (VMSCHED_EVENT_LOOP).

uvloop's loop runs the same asyncio code with its I/O in libuv: each message a service takes or
sends costs less of Python's own loop machinery (transports, handles, the selector). It is used
when installed unless the setting says `asyncio`; `uvloop` makes its absence an error instead of a
silent fallback. Imported lazily: the library and the tests run on asyncio's loop either way.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from vmsched.errors import UsageError
from vmsched.settings import Settings

T = TypeVar("T")


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """The loop's name and how to make it (None: asyncio's default) for VMSCHED_EVENT_LOOP=`choice`."""
    if choice == "asyncio":
        return "asyncio", None
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise UsageError(
                "VMSCHED_EVENT_LOOP=uvloop but uvloop is not installed",
                hint="pip install uvloop, or set VMSCHED_EVENT_LOOP to auto or asyncio",
            ) from None
        return "asyncio", None
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return "uvloop", new_loop


def run(main: Coroutine[Any, Any, T], settings: Settings) -> T:
    """Run `main` to the end on the loop the settings choose."""
    _, factory = loop_factory(settings.event_loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


__all__ = ["loop_factory", "run"]
