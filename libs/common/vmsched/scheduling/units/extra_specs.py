"""Nova's two small request languages, as pure functions: extra-spec matching and JsonFilter queries.

Extra specs (ComputeCapabilitiesFilter, AggregateInstanceExtraSpecsFilter)
-------------------------------------------------------------------------
`match(value, requirement)`: the requirement's first word is the operator (Nova's
``extra_specs_ops``):

==============  =====================================================================
``= x``         value >= x as numbers (*not* equality: "at least", like vCPUs)
``== x``        equal as numbers; ``!= x``, ``>= x``, ``<= x`` likewise numeric
``s== x``       equal as strings; ``s!=``, ``s<``, ``s<=``, ``s>``, ``s>=`` likewise
``<in> x``      x is a substring of the value (``<in> x <in>``, with a closing keyword, too)
``<all-in> a b``  every word a, b, ... is a substring of the value
``<or> a <or> b``  the value equals one of the alternatives
anything else   plain string equality of the whole requirement (so ``> 2`` and ``< 2``,
                which are *not* operators, compare as the literal strings "> 2", "< 2")
==============  =====================================================================

A missing value (None), or an operator with no operand (``"s=="``, ``"<or>"``), never matches.

Decisions where Nova is silent or crashes (documented deviations):

* The operand is everything after the operator, words re-joined by one space: ``s== Intel Xeon``
  compares with "Intel Xeon" (Nova compares with the first word only, "Intel"). Numeric operands
  are therefore one word in practice; ``>= 5 cores`` does not parse and does not match.
* An ``<or>`` alternative is the text between two ``<or>`` keywords (Nova takes single words and
  skips every other word without checking it is ``<or>``). Likewise the ``<in>`` operand ends at
  the next ``<in>`` keyword, so Nova's ``<in> x <in>`` means ``<in> x``; ``<in> <in>``, with nothing
  before the keyword, has no operand and never matches (Nova looks for the text "<in>").
* A value or operand that is not a number never matches a numeric operator (Nova raises
  ValueError out of the filter).

Host values are turned into strings the way Nova does (``str(cap)``) except that integral floats
print without ``.0`` (vmsched's numeric host columns are floats: 4096.0 prints as "4096", so
``s== 4096`` matches) and sets print sorted.

Scoped keys (`spec_path`): ``capabilities:cpu_info:features`` is the nested path
``["cpu_info", "features"]`` into the host's capabilities; a key with another namespace
(``hw:cpu_policy``, ``quota:...``) is not for this filter and is ignored; an unscoped key names a
host attribute. `lookup` walks a path through nested mappings, decoding a JSON string on the way
(Nova's ``cpu_info`` is such a string).

JsonFilter (`evaluate_query`, `query_passes`)
---------------------------------------------
A query is a prefix list ``[op, arg, ...]``. Arguments are nested queries, literals, or ``"$attr"``
/ ``"$attr.key.key"`` host references; a reference that resolves to nothing (and, as in Nova, an
empty string) is *dropped* from the argument list. Operators:

* ``=  <  >  <=  >=``: the first argument compared with every other one; fewer than two arguments
  is False; comparing incomparable types (a string with a number) is False (Nova raises).
* ``in``: the first argument equals one of the others.
* ``and`` / ``or``: all / any argument truthy (``and`` of nothing is True, ``or`` of nothing False).
* ``not``: **real negation**: ``["not", x]`` is ``not x``. Nova returns the list ``[not x]``, which
  is truthy (a non-empty list) wherever it is nested, so ``["and", ["not", q], ...]`` ignores the
  ``not``: a bug. With several arguments ``not`` is ``not (a and b ...)``, which is exactly what
  Nova's top-level ``any([not a, not b])`` computes, so top-level queries keep their meaning; with
  no argument left (all dropped) it is False, as Nova's ``any([])``.

An empty query (None or ``[]``) passes every host. A malformed query (unknown operator, operator not
a string, nesting deeper than `MAX_QUERY_DEPTH`) raises InvalidQuery; `check_query` finds that once
per request, before any host is looked at.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vmsched.errors import InvalidQuery

# ------------------------------------------------------------------------------------- operators
_NUMERIC: dict[str, Callable[[float, float], bool]] = {
    "=": operator.ge,  # "at least", as Nova: not equality
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
}
_STRING: dict[str, Callable[[str, str], bool]] = {
    "s==": operator.eq,
    "s!=": operator.ne,
    "s<": operator.lt,
    "s<=": operator.le,
    "s>": operator.gt,
    "s>=": operator.ge,
}
OR = "<or>"
IN = "<in>"
ALL_IN = "<all-in>"
#: Every operator word the grammar knows (a requirement starting with anything else is a literal).
OPERATORS: frozenset[str] = frozenset({*_NUMERIC, *_STRING, OR, IN, ALL_IN})


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _any_alternative(value: str, operands: list[str]) -> bool:
    """`<or> a <or> b c`: the value equals one of the alternatives (an alternative may have spaces)."""
    alternatives: list[list[str]] = [[]]
    for word in operands:
        if word == OR:
            alternatives.append([])
        else:
            alternatives[-1].append(word)
    return any(alt and " ".join(alt) == value for alt in alternatives)


def _contains(value: str, operands: list[str]) -> bool:
    # Nova also accepts a closing keyword, "<in> X <in>", and matches it like "<in> X" (it reads
    # only the operand's first word): the operand is the text before the next <in>.
    if IN in operands:
        operands = operands[: operands.index(IN)]
    return bool(operands) and " ".join(operands) in value


def match(value: str | None, requirement: str) -> bool:
    """Does the host `value` satisfy the extra-spec `requirement`? (Module docstring: the grammar.)"""
    words = requirement.split()
    op = words[0] if words else None
    if op not in OPERATORS:
        return value is not None and value == requirement
    if value is None:
        return False
    operands = words[1:]
    if not operands:
        return False  # an operator with nothing to compare with
    if op == OR:
        return _any_alternative(value, operands)
    if op == ALL_IN:
        return all(word in value for word in operands)
    if op == IN:
        return _contains(value, operands)
    operand = " ".join(operands)
    if op in _STRING:
        return _STRING[op](value, operand)
    have, want = _number(value), _number(operand)
    if have is None or want is None:
        return False
    return _NUMERIC[op](have, want)


def spec_string(value: Any) -> str | None:
    """A host value as the string `match` compares (None stays None: nothing to match)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, (set, frozenset)):
        return str(sorted(value, key=str))
    if isinstance(value, (list, tuple)):
        return str(list(value))
    if isinstance(value, Mapping):
        return str(dict(value))
    return str(value)


# ------------------------------------------------------------------------------------ scoped keys
CAPABILITIES_SCOPE = "capabilities"
AGGREGATE_SCOPE = "aggregate_instance_extra_specs"


def spec_path(key: str, scope: str = CAPABILITIES_SCOPE) -> tuple[bool, list[str]] | None:
    """How the extra-spec `key` reads for a filter whose namespace is `scope`.

    Returns None when the key belongs to another namespace (the filter ignores it), else
    (scoped, path): `scoped` is True for ``scope:a:b`` (path ["a", "b"]), False for an unscoped key
    (path [key]).
    """
    parts = key.split(":")
    if len(parts) == 1:
        return False, parts
    if parts[0] != scope or not all(parts[1:]):
        return None
    return True, parts[1:]


def lookup(root: Any, path: Sequence[str]) -> Any:
    """Follow `path` through nested mappings; None when a step is missing.

    A JSON string met on the way is decoded (Nova's ``cpu_info`` is JSON text), so
    ``capabilities:cpu_info:vendor`` works whether cpu_info is a mapping or its JSON.
    """
    node = root
    for step in path:
        if isinstance(node, str):
            try:
                node = json.loads(node)
            except (ValueError, RecursionError):  # not JSON, or nested past json's recursion limit
                return None
        if not isinstance(node, Mapping):
            return None
        node = node.get(step)
        if node is None:
            return None
    return node


# -------------------------------------------------------------------------------------- JsonFilter
#: Deeper queries are refused (a request could otherwise exhaust the recursion limit).
MAX_QUERY_DEPTH = 64


def _compare(op: Callable[[Any, Any], Any]) -> Callable[[list[Any]], bool]:
    def run(args: list[Any]) -> bool:
        if len(args) < 2:
            return False
        first = args[0]
        try:
            return all(bool(op(first, other)) for other in args[1:])
        except TypeError:
            return False

    return run


def _in(args: list[Any]) -> bool:
    if len(args) < 2:
        return False
    try:
        return args[0] in args[1:]
    except TypeError:  # pragma: no cover - list membership compares with ==, which does not raise
        return False


_QUERY_OPS: dict[str, Callable[[list[Any]], bool]] = {
    "=": _compare(operator.eq),
    "<": _compare(operator.lt),
    ">": _compare(operator.gt),
    "<=": _compare(operator.le),
    ">=": _compare(operator.ge),
    "in": _in,
    "not": lambda args: bool(args) and not all(args),
    "and": all,
    "or": any,
}
QUERY_OPERATORS: frozenset[str] = frozenset(_QUERY_OPS)

Resolver = Callable[[str], Any]


def check_query(query: Sequence[Any] | None, _depth: int = 0) -> None:
    """Raise InvalidQuery if `query` is malformed (any host would fail on it the same way)."""
    if not query:
        return
    if _depth >= MAX_QUERY_DEPTH:
        raise InvalidQuery(f"query nested deeper than {MAX_QUERY_DEPTH} levels")
    op = query[0]
    if not isinstance(op, str) or op not in _QUERY_OPS:
        raise InvalidQuery(f"unknown operator {op!r} (known: {', '.join(sorted(_QUERY_OPS))})")
    for arg in query[1:]:
        if isinstance(arg, list):
            check_query(arg, _depth + 1)


def resolve_reference(text: str, attribute: Resolver) -> Any:
    """A string argument: ``$attr.key...`` looked up (None when missing), "" -> None, else literal."""
    if not text:
        return None
    if not text.startswith("$"):
        return text
    name, *rest = text[1:].split(".")
    return lookup(attribute(name), rest) if rest else attribute(name)


def evaluate_query(query: Sequence[Any] | None, attribute: Resolver) -> Any:
    """Evaluate a (checked) query for one host; `attribute(name)` is the host's attribute or None.

    The result is a bool for every operator; an empty query is True.
    """
    if not query:
        return True
    args: list[Any] = []
    for arg in query[1:]:
        if isinstance(arg, list):
            arg = evaluate_query(arg, attribute)
        elif isinstance(arg, str):
            arg = resolve_reference(arg, attribute)
        if arg is not None:
            args.append(arg)
    return _QUERY_OPS[query[0]](args)


def query_passes(query: Sequence[Any] | None, attribute: Resolver) -> bool:
    """Does the host pass the query? (Checks the query first: InvalidQuery if malformed.)"""
    check_query(query)
    return bool(evaluate_query(query, attribute))


def mapping_resolver(attrs: Mapping[str, Any]) -> Resolver:
    return attrs.get


__all__ = [
    "AGGREGATE_SCOPE",
    "ALL_IN",
    "CAPABILITIES_SCOPE",
    "IN",
    "MAX_QUERY_DEPTH",
    "OPERATORS",
    "OR",
    "QUERY_OPERATORS",
    "Resolver",
    "check_query",
    "evaluate_query",
    "lookup",
    "mapping_resolver",
    "match",
    "query_passes",
    "resolve_reference",
    "spec_path",
    "spec_string",
]
