"""Stored state records: parsing them back into models.

Shared by the writer (StateWriter, which derives each HostState) and the readers (StateCache,
which parses the stored ones). What a host's VMs add up to is a domain rule the simulator applies
too: vmsched.scheduling.host_aggregates, which the writer calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

from pydantic import ValidationError

from vmsched.contracts import Message
from vmsched.logging import get_logger

log = get_logger(__name__)

M = TypeVar("M", bound=Message)

#: The pydantic validation context of a stored record (`info.context` in a validator). Every
#: record in Redis was validated when the state tracker took it off the bus, so a validator that
#: re-walks a whole JSON tree for its bounds (vmsched.contracts.base.json_bounds) may skip the
#: walk when the context says `stored`: a full load parses every host of a cluster, and walking
#: each host's capabilities again costs more than parsing them. Every field's type and each
#: field's own limits are still checked, and messages from the bus never get this context.
STORED: Mapping[str, bool] = MappingProxyType({"stored": True})

#: Records larger than this (bytes, or characters for text) are validated as messages off the bus
#: are (no STORED context): the walks a stored record may skip are bounded by its size, and a
#: record the tracker writes for a valid report is a few KB (a host's report, its VM ids, its CPU
#: samples).
MAX_TRUSTED_BYTES = 256 * 1024


def parse_stored(model: type[M], raw: bytes | str) -> M:
    """Parse a record that this or an older version stored, in the STORED validation context
    unless it is larger than MAX_TRUSTED_BYTES.

    Messages on the wire refuse unknown fields; stored state must survive an upgrade that removed
    one, or the state tracker could not load its clusters at all. Fields the model no longer has
    are dropped with a warning; any other problem still raises.
    """
    context = STORED if len(raw) <= MAX_TRUSTED_BYTES else None
    try:
        return model.model_validate_json(raw, context=context)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(e["type"] != "extra_forbidden" for e in errors):
            raise
        data = json.loads(raw)
        for e in errors:
            node = data
            for part in e["loc"][:-1]:
                node = node[part]
            node.pop(e["loc"][-1], None)
        log.warning(
            "stored record has fields this version does not know: dropped",
            model=model.__name__,
            fields=[".".join(str(p) for p in e["loc"]) for e in errors],
        )
        return model.model_validate(data, context=context)


__all__ = ["MAX_TRUSTED_BYTES", "STORED", "parse_stored"]
