"""structlog configured once per process: JSON lines (or console), request ids bound per message.

Every line, ours and the client libraries', goes last through `mask_secrets`, which replaces the
process's secrets (SECRETS) wherever they appear in its values: whatever a message or an exception
quotes, a password the process was configured with never reaches its log.

With tracing on (vmsched.tracing), every line written inside a span carries its `trace_id` and
`span_id` (`add_trace_ids`, fed by TRACE_IDS), so a decision's lines and its trace find each other.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, cast

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
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            mask_secrets,
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
                mask_secrets,
                renderer,
            ],
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                add_trace_ids,
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


# ---------------------------------------------------------------- the current trace in each line
class TraceIds:
    """Where log lines take the current span's (trace_id, span_id) from: `source`, None while tracing
    is off (then `add_trace_ids` adds nothing, at the cost of one attribute read).

    The process has one, TRACE_IDS, owned by vmsched.tracing.Tracing: its start sets `source`, its
    last shutdown clears it. It lives here, not there, so that logging names no tracing module and
    every line goes through the same processors whether tracing is on or not.
    """

    def __init__(self) -> None:
        self.source: Callable[[], tuple[str, str] | None] | None = None


#: The process's one (see TraceIds for who feeds it).
TRACE_IDS = TraceIds()


def add_trace_ids(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the current span's trace_id and span_id, when tracing is on and a span is current."""
    source = TRACE_IDS.source
    if source is None:
        return event_dict
    ids = source()
    if ids is not None:
        event_dict["trace_id"], event_dict["span_id"] = ids
    return event_dict


# ---------------------------------------------------------------- secrets kept out of the logs
#: What a secret is replaced with.
MASK = "***"
#: Shorter values are not masked: replacing every "ab" of every line would garble the log and hide
#: nothing worth hiding (such a password is no protection anyway).
MIN_SECRET_LENGTH = 4


class SecretRegistry:
    """The values this process must never write: masked by `mask_secrets` in every log line, and by
    `mask` in whatever else the process prints (a command's error messages, /readyz's errors).

    The process has one, SECRETS, owned by this module. It is fed by
    vmsched_services.tools.clikit.settings(), which every `vmsched` command and service process
    (`vmsched run`, `vmsched up`) gets its Settings from: it adds Settings.secret_values() (and by
    `vmsched db migrate --dsn`, with the password of its URL). A program that builds Settings
    itself (an engine embedding the client) adds them with `SECRETS.add`.
    Values are only ever added (a process never forgets a credential it was given).
    """

    def __init__(self) -> None:
        self._values: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None
        self._lock = threading.Lock()  # the metrics server's threads mask too

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            values = self._values | {v for v in values if len(v) >= MIN_SECRET_LENGTH}
            if values != self._values:
                # Longest first: a secret that contains another is masked whole.
                ordered = sorted(values, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
                self._values = frozenset(values)

    def clear(self) -> None:
        """Forget every value (tests)."""
        with self._lock:
            self._values, self._pattern = frozenset(), None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str) -> str:
        """`text` with every secret replaced by MASK."""
        pattern = self._pattern
        return text if pattern is None else pattern.sub(MASK, text)

    def masked(self, value: Any) -> Any:
        """`value` with the secrets masked: inside strings, containers and mapping keys; any other
        object whose repr (what the renderers write for it) holds a secret becomes its masked repr."""
        if isinstance(value, str):
            return self.mask(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, dict):
            return {self.masked(k): self.masked(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.masked(v) for v in value]
        text = repr(value)
        hidden = self.mask(text)
        return value if hidden == text else hidden


#: The process's one registry (see SecretRegistry for who feeds it).
SECRETS = SecretRegistry()


def mask_secrets(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor, the last before the renderer: every value with the secrets masked."""
    if not SECRETS:
        return event_dict
    return {SECRETS.mask(k): SECRETS.masked(v) for k, v in event_dict.items()}
