"""Generate `contracts/`: the AsyncAPI 3.0 document and one JSON Schema per message.

Everything is derived from the message models, vmsched.constants, vmsched.errors and the bus's own
constants, so the documents cannot drift from the code; `vmsched contracts --check` (and a test) fail
when the committed files differ. Operations are described from vmsched's side: it *receives* requests
and reports, and *sends* replies and decisions.

A tool over the contracts and the bus, so it lives above both: neither imports it.
"""

from vmsched_services.tools.asyncapi.catalogue import ALL_MODELS, EVENTS, RPCS, message_schemas
from vmsched_services.tools.asyncapi.document import asyncapi
from vmsched_services.tools.asyncapi.error_codes import error_codes
from vmsched_services.tools.asyncapi.files import check, render, write

__all__ = ["ALL_MODELS", "EVENTS", "RPCS", "asyncapi", "check", "error_codes", "message_schemas", "render", "write"]
