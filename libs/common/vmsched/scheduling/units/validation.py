"""Checking a unit's custom properties against their regexes, and each unit's memory of the sets it
has checked.

A policy's properties are the same on every request, and every unit of every request validates
them: each unit keeps the sets it has validated (`PropertyValidation`, the unit's `validation`),
so a decision reads a dict instead of running regexes. The memory lives as long as its unit, is
bounded in entries and characters, and is safe to share between threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING

from vmsched.contracts.base import MAX_PROPERTY_VALUE
from vmsched.errors import InvalidProperty, PropertyTooLong

if TYPE_CHECKING:
    from vmsched.scheduling.units.base import PolicyUnit

#: A validated property set: (name, value) in the unit's declaration order, defaults filled in.
Validated = tuple[tuple[str, str], ...]

#: Per unit: 256 property sets of at most 4 KiB each, 64 Ki characters in all (a few MB at worst
#: over every unit of a process).
CACHE_ENTRIES = 256
CACHE_CHARS = 1 << 16
ENTRY_CHARS = 4096
#: Per unit: the property sets as given (all of a policy's, in its order) of the policies in use.
#: When full it starts over; a set over ENTRY_CHARS characters is not kept.
FAST_ENTRIES = 32


class ValidationCache:
    """An LRU of validated property sets, bounded in entries *and* in characters held.

    Keys hold the property values, so an entry count alone does not bound memory: 4096 entries of
    1 MB values would be 4 GB. Keys longer than `max_entry_chars` are not cached at all (a policy's
    real properties are a few short numbers, so they always fit).
    """

    def __init__(self, max_entries: int, max_chars: int, max_entry_chars: int) -> None:
        self.max_entries, self.max_chars, self.max_entry_chars = max_entries, max_chars, max_entry_chars
        self._entries: OrderedDict[Hashable, tuple[Validated, int]] = OrderedDict()
        self.chars = 0
        # Units are shared by every thread of a process (a worker's executor, the tests): so is this.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Validated | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: Validated, chars: int) -> None:
        if chars > self.max_entry_chars:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.chars -= old[1]
            self._entries[key] = (value, chars)
            self.chars += chars
            while len(self._entries) > self.max_entries or self.chars > self.max_chars:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.chars -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.chars = 0


class PropertyValidation:
    """The property sets one unit has validated: an LRU by the unit's own properties (sorted), and
    in front of it the sets exactly as policies give them, which need no sorting nor the LRU's lock."""

    __slots__ = ("cache", "fast")

    def __init__(self) -> None:
        self.cache = ValidationCache(CACHE_ENTRIES, CACHE_CHARS, ENTRY_CHARS)
        #: The properties exactly as given -> validated (read by validate_properties, kept by remember).
        self.fast: dict[tuple[tuple[str, str], ...], Validated] = {}

    def clear(self) -> None:
        self.fast.clear()
        self.cache.clear()

    def validated(self, unit: PolicyUnit, props: Mapping[str, str]) -> Validated:
        """`unit`'s properties from `props`, from the LRU or checked now (then kept there)."""
        given = tuple(sorted((k, v) for k, v in props.items() if k in unit.properties))
        cached = self.cache.get(given)
        if cached is not None:
            return cached
        # Every length first: no regex runs while any value is over the bound.
        for name, text in given:
            if len(text) > MAX_PROPERTY_VALUE:
                raise PropertyTooLong(unit.name, name, text, unit.properties[name].regex, MAX_PROPERTY_VALUE)
        values = dict(given)
        out: list[tuple[str, str]] = []
        for name, spec in unit.properties.items():
            value = values.get(name, spec.default)
            if value is None:
                continue
            if not spec.matches(value):
                raise InvalidProperty(unit.name, name, _clip(value), spec.regex)
            out.append((name, value))
        result = tuple(out)
        self.cache.put(given, result, sum(len(k) + len(v) for k, v in given))
        return result

    def remember(self, given: tuple[tuple[str, str], ...], validated: Validated) -> None:
        """Keep a validated set under the properties exactly as given, when they are strings and
        small (at most ENTRY_CHARS characters)."""
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in given):
            return
        if sum(len(k) + len(v) for k, v in given) > ENTRY_CHARS:
            return
        if len(self.fast) >= FAST_ENTRIES:
            self.fast.clear()
        self.fast[given] = validated


def validate_properties(unit: PolicyUnit, props: Mapping[str, str]) -> dict[str, str]:
    """The unit's properties from `props` (defaults filled in), each checked against its regex.

    Properties the unit does not declare are ignored here: a policy's properties are shared by all
    of its units (as in oVirt), so each unit picks its own. Results are kept by the unit (its
    `validation`): a policy's properties are the same on every request, and this runs for every
    unit of every request. A value longer than MAX_PROPERTY_VALUE raises PropertyTooLong before any
    regex runs.
    """
    # The fast path inline (no call but dict lookups): it runs for every unit of every decision.
    validation = unit.validation
    fast_key = tuple(props.items())
    try:
        fast = validation.fast.get(fast_key)
    except TypeError:  # a value that is not a string (not a property) cannot be a key: no shortcut
        return dict(validation.validated(unit, props))
    if fast is None:
        fast = validation.validated(unit, props)
        validation.remember(fast_key, fast)
    return dict(fast)


def _clip(value: str, limit: int = 200) -> str:
    """A value short enough for an error message (the error travels in a bounded reply)."""
    return value if len(value) <= limit else value[: limit - 3] + "..."


__all__ = ["PropertyValidation", "Validated", "ValidationCache", "validate_properties"]
