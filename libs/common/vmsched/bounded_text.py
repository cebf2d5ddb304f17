"""YAML and JSON text parsed with bounds on what parsing may cost: JSON through `json.loads` (C,
linear), YAML without aliases (`*name`: "billion laughs", a few KB whose expansion never ends) and
both with at most MAX_DEPTH levels of nesting. A refusal is InvalidRequest naming the line and column.

The size of the text is the caller's to bound (vmsched_services.tools.inputs reads a file at most
its cap): with no aliases, what YAML builds grows with the text, not faster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import Node
from yaml.resolver import Resolver

from vmsched.errors import InvalidRequest

#: Levels of nesting a document may have (mappings and lists inside each other); vmsched's files use
#: fewer than 10 (a workload's policy's filter's properties is 6).
MAX_DEPTH = 32

Format = Literal["json", "yaml"]


def _refused(what: str, mark: Any) -> InvalidRequest:
    """A refusal raised from inside the parser (not a YAMLError: it passes through PyYAML as it is)."""
    return InvalidRequest(f"line {mark.line + 1} column {mark.column + 1}: {what}")


class _Bounded(Composer):
    """PyYAML's composer refusing aliases and deep nesting (in Python, so that it can refuse them)."""

    depth = 0
    peek_event: Callable[[], Any]  # the parser's (PyYAML's or libyaml's), which the loader mixes in

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            raise _refused(f"an alias (*{event.anchor}): aliases and anchors are not accepted", event.start_mark)
        if not isinstance(event, SequenceStartEvent | MappingStartEvent):
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _refused(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _PyLoader(_Bounded, yaml.SafeLoader):
    """safe_load's loader, bounded, all in Python: where PyYAML has no libyaml."""


_Loader: Callable[[str], Any] = _PyLoader
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(_Bounded, CParser, SafeConstructor, Resolver):
        """safe_load's loader, bounded, with libyaml's scanner and parser (C, 3 times faster); the
        composer (before CParser's own in the MRO) is _Bounded's."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _Bounded.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    _Loader = _CLoader


def _at(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"line {line} column {offset - (text.rfind(chr(10), 0, offset) + 1) + 1}"


def load_yaml(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except InvalidRequest as exc:
        raise InvalidRequest(f"{source}: {exc.message}") from None
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{source}: not valid YAML: {exc}") from None
    except ValueError as exc:  # a scalar YAML resolves but Python refuses (an int of 5,000 digits)
        raise InvalidRequest(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _too_deep_at(text: str) -> str:
    """Where JSON text first nests deeper than MAX_DEPTH (only on the way to a refusal: a scan of it)."""
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        char = token.group()[0]
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return _at(text, token.start())
        elif char in "]}":
            depth -= 1
    return "somewhere"  # pragma: no cover - only called for text that nests too deep


def _depth(value: Any) -> int:
    """How deep containers nest in parsed JSON, level by level (no recursion); stops past MAX_DEPTH."""
    level, frontier = 0, [value] if isinstance(value, dict | list) else []
    while frontier and level <= MAX_DEPTH:
        level += 1
        below: list[Any] = []
        for node in frontier:
            below += [c for c in (node.values() if type(node) is dict else node) if type(c) is dict or type(c) is list]
        frontier = below
    return level


def load_json(text: str, source: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
        raise InvalidRequest(f"{source}: {_too_deep_at(text)}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # an int of 5,000 digits
        raise InvalidRequest(f"{source}: not valid JSON: {exc}") from None
    if _depth(value) > MAX_DEPTH:
        raise InvalidRequest(f"{source}: {_too_deep_at(text)}: nested more than {MAX_DEPTH} levels deep")
    return value


def format_of(name: str, text: str) -> Format:
    """JSON for a .json name, YAML for .yaml/.yml; otherwise (standard input, another suffix) JSON if
    the text starts as a JSON document does, with { or [."""
    lower = name.lower()
    if lower.endswith(".json"):
        return "json"
    if lower.endswith((".yaml", ".yml")):
        return "yaml"
    return "json" if text.lstrip()[:1] in ("{", "[") else "yaml"


def load(text: str, source: str, fmt: Format | None = None) -> Any:
    """The document in `text` (`fmt`, else as format_of(source) says); InvalidRequest names `source`
    and the line. Text that looks like JSON but is not (YAML's flow style, `{a: 1}`) is read as YAML
    when the format was guessed; the caller's size cap bounds that second reading."""
    chosen = fmt or format_of(source, text)
    if chosen == "yaml":
        return load_yaml(text, source)
    try:
        return load_json(text, source)
    except InvalidRequest:
        if fmt is not None or source.lower().endswith(".json"):
            raise
        return load_yaml(text, source)


__all__ = ["MAX_DEPTH", "Format", "format_of", "load", "load_json", "load_yaml"]
