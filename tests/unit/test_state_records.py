"""parse_stored: the validation context stored records are parsed under."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, ValidationInfo

from vmsched.contracts import Message
from vmsched.store.state_records import MAX_TRUSTED_BYTES, parse_stored

seen: list[Any] = []


def _record(value: list[str], info: ValidationInfo) -> list[str]:
    seen.append(info.context)
    return value


class Probe(Message):
    items: Annotated[list[str], AfterValidator(_record)]


def test_stored_records_of_bounded_size_are_parsed_in_the_stored_context() -> None:
    seen.clear()
    parse_stored(Probe, json.dumps({"items": ["a"]}))
    # a field an older version stored: dropped, and the record parsed again in the same context
    parse_stored(Probe, json.dumps({"items": ["a"], "retired": 1}).encode())
    assert len(seen) >= 2
    assert all(c == {"stored": True} for c in seen)

    seen.clear()
    big = json.dumps({"items": ["x" * 1000] * (MAX_TRUSTED_BYTES // 1000)})
    assert len(big) > MAX_TRUSTED_BYTES
    parse_stored(Probe, big)
    assert seen == [None]  # validated as a message off the bus is
