"""Messages to bytes and back: JSON via pydantic, never pickle.

Every AMQP message carries content_type application/json and `type` = the model's class name, so a
consumer of a topic with several message kinds (state.#) knows which model to validate against.

Events an engine publishes (vmsched.contracts.base.EngineEvent) may carry fields this version does
not know: `decode` drops them and logs each (message type, field) once per process. Every other
model refuses them.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from typing import TypeVar, cast

from pydantic import ValidationError

from vmsched.contracts import ErrorReply, Message
from vmsched.errors import InvalidRequest
from vmsched.logging import get_logger

M = TypeVar("M", bound=Message)

CONTENT_TYPE = "application/json"

#: ErrorReply's own bounds (read from the model, so the two never drift apart).
ERROR_MESSAGE_MAX = next(m.max_length for m in ErrorReply.model_fields["message"].metadata if hasattr(m, "max_length"))
ERROR_LOCATION_MAX = next(
    m.max_length for m in ErrorReply.model_fields["location"].metadata if hasattr(m, "max_length")
)
_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")

log = get_logger("vmsched.bus")

#: Different (message type, field name) pairs logged as unknown, at most, per process.
UNKNOWN_LOGGED_MAX = 1000
#: Field names are quoted in logs at most this long.
UNKNOWN_NAME_MAX = 100

# The offending input is quoted in error texts; reprlib stops after a few items and characters,
# where repr() would first copy a multi-megabyte input whole only to cut it to 60 characters.
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxother = 2, 60, 60
_QUOTE.maxdict = _QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxset = 4


def encode(message: Message) -> bytes:
    return message.__pydantic_serializer__.to_json(message)


def type_name(model: type[Message] | Message) -> str:
    return model.__name__ if isinstance(model, type) else type(model).__name__


def describe_validation_error(exc: ValidationError, limit: int = 5) -> tuple[str, str | None]:
    """('vm.mem_mb: Input should be greater than or equal to 1 (got -5); ...', 'vm.mem_mb')."""
    parts: list[str] = []
    first: str | None = None
    for err in exc.errors(include_url=False)[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(message)"
        first = first or loc
        got = _QUOTE.repr(err.get("input"))
        if len(got) > 60:
            got = got[:57] + "..."
        parts.append(f"{loc}: {err['msg']} (got {got})")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts), first


def decode(body: bytes, model: type[M], *, max_bytes: int | None = None) -> M:
    """Validate `body` as `model`; bad input raises InvalidRequest saying what and where."""
    if max_bytes is not None and len(body) > max_bytes:
        raise InvalidRequest(f"message of {len(body)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        message = model.model_validate_json(body)
    except ValidationError as exc:
        text, loc = describe_validation_error(exc)
        raise InvalidRequest(f"invalid {model.__name__}: {text}", location=loc) from None
    # Only EngineEvent models keep unknown fields (extra="allow"); every other model has None here.
    # One that carries events of its own (contracts.StateReports) may hold them in those too.
    nested: tuple[str, ...] = getattr(model, "nested_events", ())
    if message.__pydantic_extra__ or any(_has_unknown(getattr(message, name)) for name in nested):
        return _without_unknown_fields(message)
    return message


def _has_unknown(items: list[Message]) -> bool:
    return any(item.__pydantic_extra__ for item in items)


def _without_unknown_fields(message: M) -> M:
    """`message` without the fields its model does not know (nor the events it carries), each
    (type, field) logged once per process."""
    model = type(message)
    for name in message.__pydantic_extra__ or ():
        UNKNOWN_FIELDS.log_once(model.__name__, name)
    # Dropped before anything stores or forwards the event: the fields are unbounded and unchecked.
    known = {name: getattr(message, name) for name in model.model_fields}
    for name in getattr(model, "nested_events", ()):
        known[name] = [_without_unknown_fields(item) if item.__pydantic_extra__ else item for item in known[name]]
    # cast: pydantic's mypy plugin types model_construct on a TypeVar's bound, not on the TypeVar.
    return cast(M, model.model_construct(_fields_set=message.model_fields_set, **known))


class UnknownFields:
    """The (message type, field name) pairs already logged as unknown, so each is logged once.

    Bounded: field names come from the publisher, and one that sends a new name with every message
    must not grow this without end; past `limit` pairs one last warning says no more are logged.
    """

    def __init__(self, limit: int = UNKNOWN_LOGGED_MAX) -> None:
        self.limit = limit
        self._logged: set[tuple[str, str]] = set()

    def log_once(self, type_: str, field: str) -> None:
        key = (type_, truncate(field, UNKNOWN_NAME_MAX))
        if key in self._logged or len(self._logged) > self.limit:
            return
        self._logged.add(key)
        if len(self._logged) > self.limit:
            log.warning(
                "too many different unknown fields: no more are logged",
                message_type=type_,
                logged=self.limit,
            )
            return
        log.warning(
            "unknown field ignored (a newer publisher?); logged once per message type and field",
            message_type=type_,
            field=key[1],
        )

    def reset(self) -> None:
        """Forget what was logged (tests: each starts from a process that logged nothing)."""
        self._logged.clear()

    def __len__(self) -> int:
        return len(self._logged)


#: The process's one record of unknown fields logged. Owned by this module: `decode` is its only
#: writer (the log is once per process, whichever bus or client decoded the event); tests reset() it.
UNKNOWN_FIELDS = UnknownFields()


def decode_any(
    body: bytes, type_header: str | None, models: Mapping[str, type[Message]], *, max_bytes: int | None = None
) -> Message:
    """Decode a message whose model is named by its `type` property (event queues with several kinds)."""
    if type_header is None:
        if len(models) == 1:
            return decode(body, next(iter(models.values())), max_bytes=max_bytes)
        raise InvalidRequest(f"message has no type property; expected one of {sorted(models)}")
    model = models.get(type_header)
    if model is None:
        raise InvalidRequest(f"unexpected message type {type_header!r}; expected one of {sorted(models)}")
    return decode(body, model, max_bytes=max_bytes)


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, saying how much was cut (error texts echo user input)."""
    if len(text) <= limit:
        return text
    keep = max(limit - len("... [ more characters cut]") - len(str(len(text))), 0)
    return (text[:keep] + f"... [{len(text) - keep} more characters cut]")[:limit]


def safe_text(value: object, limit: int) -> str:
    """str(value), bounded; never raises (an exception's __str__ may itself raise)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        text = f"<{type(value).__name__} whose text cannot be shown>"
    return truncate(text, limit)


def error_reply(code: str, message: object, location: object = None) -> ErrorReply:
    """An ErrorReply from any code/message/location: cut to the model's limits, never a ValidationError.

    An error text can echo user input of any size (a property value of 9,000 characters); a reply
    that failed validation would leave its request neither answered nor settled.
    """
    safe_code = code if isinstance(code, str) and _CODE.match(code) else "internal"
    loc = None if location is None else safe_text(location, ERROR_LOCATION_MAX)
    try:
        return ErrorReply(code=safe_code, message=safe_text(message, ERROR_MESSAGE_MAX), location=loc)
    except ValidationError:  # pragma: no cover - the fields above are already within bounds
        return ErrorReply(code="internal", message="the error could not be described")
