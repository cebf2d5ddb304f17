"""JSON workloads read as JSON, entry by entry, in memory bounded by what the workload is.

`json.loads` of a 50 MB workload builds every arrival as a dict before any is validated: hundreds of
MB of dicts beside the models made from them, and a bad reference deep in the file is said only
after all of it is parsed. This reader walks the top-level object itself and decodes the entries of
its sections (hosts, affinity_groups, arrivals, departures, failures, maintenance) one at a time
with the C decoder (`JSONDecoder.raw_decode`), validates each into its model and checks its ids and
references at once (workload_refs.References), and drops the dict. The text comes as chunks (a file
read a MB at a time), so the text itself need not be in memory whole either.

Nesting is bounded as vmsched.bounded_text bounds it (MAX_DEPTH levels); a syntax error names the
line and column, a bad entry its path (arrivals.400000.vcpus).
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from vmsched.bounded_text import MAX_DEPTH
from vmsched.errors import InvalidRequest
from vmsched.simulation.workload import (
    REFERENCES_CHECKED,
    AffinityGroupSpec,
    HostFailure,
    HostSpec,
    MaintenanceWindow,
    VmArrival,
    VmDeparture,
    Workload,
    validation_problem,
)
from vmsched.simulation.workload_refs import References

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _hosts(refs: References, where: str, e: HostSpec) -> None:
    refs.host(where, e.id, e.count)


def _groups(refs: References, where: str, e: AffinityGroupSpec) -> None:
    refs.group(where, e.id)


def _arrivals(refs: References, where: str, e: VmArrival) -> None:
    refs.arrival(where, e.vm_id, e.pinned_hosts, e.affinity_groups)


def _departures(refs: References, where: str, e: VmDeparture) -> None:
    refs.departure(where, e.vm_id)


def _host_events(refs: References, where: str, e: HostFailure | MaintenanceWindow) -> None:
    refs.host_event(where, e.host_id)


#: The sections read entry by entry: their model and what each entry defines or refers to.
_SECTIONS: dict[str, tuple[type[BaseModel], Callable[[References, str, Any], None]]] = {
    "hosts": (HostSpec, _hosts),
    "affinity_groups": (AffinityGroupSpec, _groups),
    "arrivals": (VmArrival, _arrivals),
    "departures": (VmDeparture, _departures),
    "failures": (HostFailure, _host_events),
    "maintenance": (MaintenanceWindow, _host_events),
}


class _Text:
    """The JSON text, chunk by chunk: what is not yet consumed of it, and where that is (lines)."""

    def __init__(self, chunks: Iterable[str], source: str) -> None:
        self._chunks: Iterator[str] = iter(chunks)
        self.source = source
        self.buf = ""
        self.pos = 0
        self.eof = False
        self._lines = 0  # newlines before buf
        self._line_start = 0  # chars since the last newline before buf

    def more(self) -> bool:
        """Appends the next chunk (dropping what is consumed); False at the end of the text."""
        if self.eof:
            return False
        chunk = next(self._chunks, None)
        if chunk is None:
            self.eof = True
            return False
        done = self.buf[: self.pos]
        newlines = done.count("\n")
        self._lines += newlines
        self._line_start = len(done) - done.rfind("\n") - 1 if newlines else self._line_start + len(done)
        self.buf, self.pos = self.buf[self.pos :] + chunk, 0
        return True

    def where(self, pos: int) -> str:
        line = self._lines + self.buf.count("\n", 0, pos) + 1
        nl = self.buf.rfind("\n", 0, pos)
        column = pos - nl if nl >= 0 else self._line_start + pos + 1
        return f"line {line} column {column}"

    def error(self, what: str, pos: int | None = None) -> InvalidRequest:
        return InvalidRequest(
            f"{self.source}: not valid JSON: {what} at {self.where(self.pos if pos is None else pos)}"
        )

    def peek(self) -> str:
        """The next character that is not white space (not consumed), or "" at the end."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]  # `*` always matches
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def take(self, char: str, expecting: str) -> None:
        if self.peek() != char:
            raise self.error(f"expecting {expecting}")
        self.pos += 1

    def value(self, *, shallow: bool = False) -> Any:
        """The next JSON value, decoded by the C decoder, more of the text appended while it is cut.
        Its depth is checked unless `shallow` (a section's entry: its model refuses nesting)."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # Cut by the chunk's end (near it, or a string running to it)? Read on; else it is wrong.
                cut = exc.pos >= len(self.buf) - 64 or exc.msg.startswith("Unterminated string")
                if cut and self.more():
                    continue
                raise self.error(exc.msg, exc.pos) from None
            except RecursionError:
                raise self.error(f"nested more than {MAX_DEPTH} levels deep") from None
            if end == len(self.buf) and self.more():
                continue  # a number or literal may go on in the next chunk
            if not shallow and _too_deep(value):
                raise self.error(f"nested more than {MAX_DEPTH} levels deep")
            self.pos = end
            return value


def _too_deep(value: Any, limit: int = MAX_DEPTH - 2) -> bool:
    """Whether `value` nests deeper than `limit` (it sits two levels down: the workload, a section)."""
    frontier = [value] if isinstance(value, dict | list) else []
    level = 0
    while frontier:
        level += 1
        if level > limit:
            return True
        below: list[Any] = []
        for node in frontier:
            below += [c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, dict | list)]
        frontier = below
    return False


def read_json_workload(chunks: Iterable[str], source: str) -> Workload:
    """The workload in JSON text given as chunks; InvalidRequest naming `source` and the line and
    column (syntax) or the entry (arrivals.3.vcpus; a repeated id, a reference to nothing)."""
    # The cyclic collector would walk every model read so far each time allocations pass its
    # threshold (half the reading time at 400,000 arrivals); nothing read here is cyclic garbage.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _read(_Text(chunks, source), source)
    finally:
        if enabled:
            gc.enable()


def _read(text: _Text, source: str) -> Workload:
    if text.peek() != "{":
        raise InvalidRequest(f"{source}: expected a mapping with 'hosts' and 'arrivals'")
    text.pos += 1
    builder = _Builder(source)
    while text.peek() != "}":
        if builder.raw:
            text.take(",", "',' or '}'")
        at = text.pos
        key = text.value()
        if not isinstance(key, str):
            raise text.error("expecting a property name in double quotes", at)
        if key in builder.raw:
            raise InvalidRequest(f"{source}: {text.where(at)}: key {key!r} repeats")
        text.take(":", "':'")
        if key in _SECTIONS and text.peek() == "[":
            builder.section(key, _entries(text))
        else:
            builder.raw[key] = text.value()
    text.pos += 1
    if text.peek():
        raise text.error("extra data after the workload")
    return builder.workload()


def workload_of_raw(raw: dict[str, Any], source: str) -> Workload:
    """The workload of a parsed (YAML, CSV) mapping, its entries validated and checked as JSON's are."""
    builder = _Builder(source)
    for key, value in raw.items():
        if key in _SECTIONS and isinstance(value, list):
            builder.section(key, iter(value))
        else:
            builder.raw[key] = value
    return builder.workload()


def _entries(text: _Text) -> Iterator[Any]:
    """The values of the JSON array at the text's position, one by one (the "]" consumed after)."""
    text.pos += 1  # the "["
    first = True
    while text.peek() != "]":
        if not first:
            text.take(",", "',' or ']'")
        first = False
        yield text.value(shallow=True)
    text.pos += 1


class _Builder:
    """A workload's top-level values, its sections' entries validated and checked one by one."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.raw: dict[str, Any] = {}
        self.refs = References()

    def _problem(self, exc: ValueError) -> InvalidRequest:
        return InvalidRequest(f"{self.source}: {exc}")

    def section(self, key: str, values: Iterator[Any]) -> None:
        model, check = _SECTIONS[key]
        validate = model.__pydantic_validator__.validate_python  # model_validate without its wrapper
        entries: list[Any] = []
        self.raw[key] = entries
        for n, value in enumerate(values):
            where = f"{key}.{n}"
            try:
                entry = validate(value)
            except ValidationError as exc:
                raise validation_problem(exc, self.source, where) from None
            try:
                check(self.refs, where, entry)
            except ValueError as exc:
                raise self._problem(exc) from None
            entries.append(entry)
        if key in ("hosts", "affinity_groups", "arrivals"):
            try:
                self.refs.section_done(key)
            except ValueError as exc:
                raise self._problem(exc) from None

    def workload(self) -> Workload:
        try:
            self.refs.finish()
        except ValueError as exc:
            raise self._problem(exc) from None
        try:
            return Workload.model_validate(self.raw, context={REFERENCES_CHECKED: True})
        except ValidationError as exc:
            raise validation_problem(exc, self.source) from None


__all__ = ["read_json_workload", "workload_of_raw"]
