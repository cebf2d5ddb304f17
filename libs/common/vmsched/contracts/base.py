"""The base every message model derives from, the bounded id and text types, strict numbers, and
the bounds every engine-supplied map or JSON tree must stay within (a message that passes
validation must not be able to hold a worker for seconds or grow its memory)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    StringConstraints,
    ValidationInfo,
)

#: Host, cluster, VM and network ids: engine-chosen strings (UUIDs fit), bounded and printable.
Id = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
#: Names of policy units and properties: identifiers, no spaces.
Name = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")]
#: Free text from a filter or an error: bounded so one message cannot balloon.
MAX_TEXT = 2000
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]

# Numbers are strict: pydantic's lax mode turns JSON `true` into 1, "5" into 5 and 2.0 into 2, so
# a wrongly typed field would be scheduled on instead of refused. A float still takes a JSON
# integer (1 is 1.0). Booleans are strict too: 1 or "yes" is not a boolean.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]

#: Largest magnitude of a weight factor. Nova's largest default multipliers (build_failure_ and
#: cross_cell_move_weight_multiplier, 1000000.0) fit as they are. Not larger: selectors compare
#: totals rounded to 9 decimals (scheduling.selection), which absorbs floating-point noise only while
#: sum(|factor| x points) stays within what a double holds to that many decimals.
MAX_FACTOR = 1_000_000


def canonical_number(value: float) -> float:
    """A whole number as an int (2, not 2.0), anything else as a float: a factor read back from
    PostgreSQL (double precision) or JSON writes the way its administrator wrote it, so a policy
    file with `factor: 2` exports as 2 and shows no difference when applied again."""
    number = float(value)
    return int(number) if number.is_integer() else number


def factor_problem(value: object) -> str | None:
    """What is wrong with `value` as a weight factor (None: nothing, or not a number at all, which
    the type check refuses): not finite, or past ±MAX_FACTOR."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        if not math.isfinite(number):
            return f"{value!r} is not a finite number"
        # Quoted, or YAML 1.1's exponent without a dot (PyYAML reads 1e6 as text): say how to write it.
        return f"{value!r} is text, not a number: write it unquoted, an exponent with a dot (1.0e+6, not 1e6)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if abs(value) > MAX_FACTOR:
        shown = repr(value) if len(repr(value)) <= 32 else f"a number of {len(str(abs(value)))} digits"
        return f"{shown} is out of range: a factor is from -{MAX_FACTOR} to {MAX_FACTOR}"
    return None


def check_factor(value: object, info: ValidationInfo) -> object:
    """A before-validator for a `factor` field declared after a `unit` field: the refusal names the
    unit and the value ("weight RAMWeigher: factor inf is not a finite number")."""
    problem = factor_problem(value)
    if problem is not None:
        raise ValueError(f"weight {info.data.get('unit', '(unnamed)')}: factor {problem}")
    return value


#: A weight factor: a decimal, finite, within ±MAX_FACTOR. Held and written as an int when whole
#: (canonical_number): a JSON integer and 2.0 are the same factor, 2.
Factor = Annotated[
    float,
    Strict(),
    Field(ge=-MAX_FACTOR, le=MAX_FACTOR, allow_inf_nan=False),
    AfterValidator(canonical_number),
    PlainSerializer(canonical_number, return_type=Any),
]

#: Largest integer a message carries (int64): counters and sizes fit; a 1000-digit number would
#: overflow the hosts' numpy columns.
MAX_INT = (1 << 63) - 1

#: Keys of engine-supplied maps (extra specs, image properties, labels, capabilities, metrics,
#: host-group metadata): Nova stores every such key as String(255).
MAX_KEY = 255
Key = Annotated[str, StringConstraints(max_length=MAX_KEY)]
#: Values of flavor extra specs, labels and host-group metadata: Nova's flavor extra specs and
#: aggregate metadata values are String(255). Extra-spec requirements are matched against every
#: candidate host, so their length multiplies by the cluster size.
MAX_SHORT_VALUE = 255
ShortValue = Annotated[str, StringConstraints(max_length=MAX_SHORT_VALUE)]
#: Image property values: the ones the filters read are short (architecture, hypervisor type,
#: ">=6.0, <7.0"); 1024 leaves room for an engine forwarding other Glance properties.
MAX_IMAGE_PROPERTY_VALUE = 1024
ImagePropertyValue = Annotated[str, StringConstraints(max_length=MAX_IMAGE_PROPERTY_VALUE)]
#: Policy property values: oVirt's are short numbers and booleans; the longest is Nova's metrics
#: weight setting ("cpu.percent=1.0, cpu.user.percent=-0.5, ..."), and 1024 fits every Nova metric
#: with a ratio several times over. Longer values are refused before any regex runs.
MAX_PROPERTY_VALUE = 1024
PropertyValue = Annotated[str, StringConstraints(max_length=MAX_PROPERTY_VALUE)]

#: Flavor extra specs per VM: every capability-scoped or unscoped one is looked up and matched on
#: every candidate host; real flavors carry a few dozen at most.
MAX_EXTRA_SPECS = 128
#: JsonFilter queries (evaluated once per candidate host: the cost is nodes x hosts). Nova's
#: examples are a handful of nodes; 256 nodes on 10,000 hosts is still ~1 s of evaluation.
MAX_QUERY_DEPTH = 16
MAX_QUERY_NODES = 256
MAX_QUERY_STRING = 255
#: Host capabilities (nested, for capabilities:a:b extra specs): Nova's cpu_info JSON text is a few KB.
MAX_CAPABILITIES_DEPTH = 8
MAX_CAPABILITIES_NODES = 4096
MAX_CAPABILITIES_STRING = 8192


def _scalar_problem(node: Any, where: str, max_string: int) -> str | None:
    if isinstance(node, str) and len(node) > max_string:
        return f"string of {len(node)} characters at {where} (the limit is {max_string})"
    if isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_INT:
        return f"integer at {where} does not fit in 64 bits"
    return None


def _children(node: Any, path: str, where: str, max_string: int) -> list[tuple[Any, str]]:
    """A list's items or an object's values, each with its JSON path; object keys are checked here."""
    if isinstance(node, list):
        return [(item, f"{path}[{i}]") for i, item in enumerate(node)]
    children = []
    for key, item in node.items():
        if isinstance(key, str) and len(key) > max_string:
            raise ValueError(f"key of {len(key)} characters at {where} (the limit is {max_string})")
        children.append((item, f"{path}.{key}" if len(str(key)) <= 40 else f"{path}.<long key>"))
    return children


def _stored(info: ValidationInfo) -> bool:
    """Whether the value comes from a record the state tracker stored after validating it
    (vmsched.store.state_records.parse_stored says so in the validation context)."""
    context = info.context
    return isinstance(context, Mapping) and context.get("stored") is True


def json_bounds(*, max_depth: int, max_nodes: int, max_string: int) -> Callable[[Any, ValidationInfo], Any]:
    """A validator bounding a JSON tree: nesting depth, number of nodes (every list, object, key and
    scalar counts), string length and integer size. The error names where, as a JSON path.

    A stored record's tree is not walked again: it was bounded when its message came off the bus,
    and parse_stored gives the stored context only to records of bounded size."""
    too_many = f"more than {max_nodes} JSON nodes (lists, objects, keys and values)"

    def check(value: Any, info: ValidationInfo) -> Any:
        if _stored(info):
            return value
        nodes = 0
        stack: list[tuple[Any, str, int]] = [(value, "", 0)]
        while stack:
            node, path, depth = stack.pop()
            nodes += 1
            where = path or "the top level"
            if nodes > max_nodes:
                raise ValueError(too_many)
            if depth > max_depth:
                raise ValueError(f"nested deeper than {max_depth} levels at {where}")
            if (problem := _scalar_problem(node, where, max_string)) is not None:
                raise ValueError(problem)
            if not isinstance(node, (list, dict)):
                continue
            # Counted before expanding, so a huge container is refused without walking it.
            if nodes + len(node) > max_nodes:
                raise ValueError(too_many)
            if isinstance(node, dict):
                nodes += len(node)  # the keys
            stack.extend((item, child, depth + 1) for item, child in _children(node, path, where, max_string))
        return value

    return check


#: A Nova JsonFilter query, bounded.
Query = Annotated[
    list[Any],
    AfterValidator(json_bounds(max_depth=MAX_QUERY_DEPTH, max_nodes=MAX_QUERY_NODES, max_string=MAX_QUERY_STRING)),
]
#: A host's capabilities, bounded.
Capabilities = Annotated[
    dict[Key, Any],
    AfterValidator(
        json_bounds(
            max_depth=MAX_CAPABILITIES_DEPTH, max_nodes=MAX_CAPABILITIES_NODES, max_string=MAX_CAPABILITIES_STRING
        )
    ),
]


class Message(BaseModel):
    """Every message on the bus: immutable, unknown fields refused, versioned."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)

    schema_version: Literal[1] = Field(
        1, description="Version of the message contracts this message follows; only 1 exists (may be left out)."
    )


class EngineEvent(Message):
    """An event an engine publishes (the state reports). Fields this version does not know are
    ignored, each logged once per process (vmsched.bus.codec), so an engine newer than the services
    does not get its state dead-lettered. RPC requests stay strict: a misspelt field there is
    refused, not silently dropped from a decision."""

    # "allow", not "ignore": the bus decoder learns which fields were unknown, logs them and drops
    # them before anything stores the event.
    model_config = ConfigDict(extra="allow")
