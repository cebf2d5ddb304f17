"""structlog configured once per process: JSON lines (or console), request ids bound per message."""

from __future__ import annotations

import logging
import sys
from typing import cast

import structlog


def configure(level: str = "INFO", fmt: str = "json", service: str | None = None) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # An object with write/flush, not a TextIO: structlog only writes to it.
        logger_factory=structlog.PrintLoggerFactory(file=_STDERR),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    if service:
        structlog.contextvars.bind_contextvars(service=service)
    # aio-pika, aiormq and redis log through the standard library: keep them at WARNING, in the same
    # line format as ours, and without tracebacks for a dropped connection (an expected event that
    # the bus reports and heals; a traceback in an operator's log reads like a crash).
    handler = logging.StreamHandler(_STDERR)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    handler.addFilter(_one_line_client_errors)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))


class _CurrentStderr:
    """A stream that writes to whatever sys.stderr is at the time of writing, not at the time logging
    was configured: a stream replaced since (a test's capture, a closed pipe) may be closed by then."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = _CurrentStderr()


#: Loggers of the client libraries whose connection-loss tracebacks are folded into one line.
_CLIENT_LIBRARIES = ("aiormq", "aio_pika", "redis", "asyncpg")


def _one_line_client_errors(record: logging.LogRecord) -> bool:
    if record.exc_info and record.name.startswith(_CLIENT_LIBRARIES):
        exc = record.exc_info[1]
        record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
        record.args = None
        record.exc_info = None
        record.exc_text = None
    return True


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return cast(structlog.typing.FilteringBoundLogger, structlog.get_logger(name))
