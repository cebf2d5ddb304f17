"""Is a property regex safe for Python's backtracking `re`? A structural check, no timing.

Python's `re` backtracks: a regex that can match one stretch of input in several ways inside a loop
(``[0-9]*[1-9][0-9]*``, ``(a+)+``, ``(a|ab)*``) costs quadratic or exponential time on a crafted
value that almost matches. `ambiguity` finds such regexes from their shape.

How: the regex's Glushkov position automaton (one position per character class occurrence, and
for each position the positions that may follow it). The matcher stays linear when every choice it
can face is decided by the next character, wherever a loop is involved:

* no two positions reachable from the same point (the start, or one position) accept a common
  character when either of them sits inside an unbounded repeat (a bounded choice, such as
  ``100|[1-9][0-9]``, costs a constant however long the value is), and
* no position is reached from another along two routes (``(a+)+``: the inner and the outer loop
  both lead from ``a`` back to ``a``, and the matcher tries every way to split a run of ``a``).

Backreferences and lookarounds are refused outright: the check cannot reason about them.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from vmsched.errors import UnsupportedRegex

_parser: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

#: Characters a class is evaluated on: ASCII plus a few non-ASCII ones that \s, \d, \w or a negated
#: class accept (property regexes use ASCII classes; these stand for "everything else").
_ALPHABET: tuple[str, ...] = (*(chr(i) for i in range(128)), "\u00a0", "\u2003", "\u00e9", "\u0663", "\U0001f600")
#: Bounded repeats up to this many copies are unrolled; longer ones are treated as unbounded loops.
_MAX_UNROLL = 32

_CATEGORIES = {
    _c.CATEGORY_DIGIT: re.compile(r"\d"),
    _c.CATEGORY_NOT_DIGIT: re.compile(r"\D"),
    _c.CATEGORY_SPACE: re.compile(r"\s"),
    _c.CATEGORY_NOT_SPACE: re.compile(r"\S"),
    _c.CATEGORY_WORD: re.compile(r"\w"),
    _c.CATEGORY_NOT_WORD: re.compile(r"\W"),
}


@dataclass
class _Automaton:
    chars: list[frozenset[str]] = field(default_factory=list)
    looped: list[bool] = field(default_factory=list)
    follow: dict[int, list[int]] = field(default_factory=dict)

    def position(self, chars: frozenset[str], looped: bool) -> int:
        self.chars.append(chars)
        self.looped.append(looped)
        self.follow[len(self.chars) - 1] = []
        return len(self.chars) - 1

    def link(self, sources: set[int], targets: set[int]) -> None:
        for s in sources:
            self.follow[s].extend(sorted(targets))


#: (nullable, first positions, last positions) of a sub-expression.
_Part = tuple[bool, set[int], set[int]]


def _class(items: list[tuple[Any, Any]]) -> frozenset[str]:
    negate = bool(items) and items[0][0] is _c.NEGATE
    accepted: set[str] = set()
    for op, arg in items[1:] if negate else items:
        if op is _c.LITERAL:
            accepted.add(chr(arg))
        elif op is _c.RANGE:
            accepted.update(ch for ch in _ALPHABET if arg[0] <= ord(ch) <= arg[1])
        elif op is _c.CATEGORY:
            accepted.update(ch for ch in _ALPHABET if _CATEGORIES[arg].match(ch))
        else:
            raise UnsupportedRegex(f"character class item {op}")
    return frozenset(set(_ALPHABET) - accepted) if negate else frozenset(accepted)


def _atom_chars(op: Any, arg: Any) -> frozenset[str] | None:
    if op is _c.LITERAL:
        return frozenset({chr(arg)})
    if op is _c.NOT_LITERAL:
        return frozenset(ch for ch in _ALPHABET if ch != chr(arg))
    if op is _c.ANY:
        return frozenset(ch for ch in _ALPHABET if ch != "\n")
    if op is _c.IN:
        return _class(list(arg))
    return None


def _sequence(auto: _Automaton, items: Any, looped: bool) -> _Part:
    nullable, first, last = True, set[int](), set[int]()
    for op, arg in items:
        n, f, la = _item(auto, op, arg, looped)
        auto.link(last, f)
        first = first | f if nullable else first
        last = last | la if n else la
        nullable = nullable and n
    return nullable, first, last


def _item(auto: _Automaton, op: Any, arg: Any, looped: bool) -> _Part:
    chars = _atom_chars(op, arg)
    if chars is not None:
        p = auto.position(chars, looped)
        return False, {p}, {p}
    if op is _c.AT:
        return True, set(), set()
    if op is _c.SUBPATTERN:
        return _sequence(auto, arg[-1], looped)
    if op is _c.ATOMIC_GROUP:
        return _sequence(auto, arg, looped)
    if op is _c.BRANCH:
        nullable, first, last = False, set[int](), set[int]()
        for alternative in arg[1]:
            n, f, la = _sequence(auto, alternative, looped)
            nullable, first, last = nullable or n, first | f, last | la
        return nullable, first, last
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
        return _repeat(auto, arg, looped)
    raise UnsupportedRegex(f"construct {op}")


def _repeat(auto: _Automaton, arg: Any, looped: bool) -> _Part:
    low, high, body = arg
    unbounded = high is _c.MAXREPEAT or high > _MAX_UNROLL
    copies: list[tuple[_Part, bool]] = []  # (part, optional)
    mandatory = max(low - 1, 0) if unbounded else low
    for _ in range(mandatory):
        copies.append((_sequence(auto, body, looped), False))
    if unbounded:
        n, f, la = _sequence(auto, body, True)
        auto.link(la, f)  # the loop: the body's end leads back to its start
        copies.append(((n, f, la), low == 0))
    else:
        copies.extend((_sequence(auto, body, looped), True) for _ in range(high - low))
    nullable, first, last = True, set[int](), set[int]()
    for (n, f, la), optional in copies:
        n = n or optional
        auto.link(last, f)
        first = first | f if nullable else first
        last = last | la if n else la
        nullable = nullable and n
    return nullable, first, last


def ambiguity(regex: str) -> str | None:
    """Why `regex` may backtract super-linearly on a long value, or None when every loop is
    deterministic (see the module docstring). Raises UnsupportedRegex for constructs it cannot judge."""
    auto = _Automaton()
    _, first, _ = _sequence(auto, _parser.parse(regex), False)

    def describe(p: int) -> str:
        sample = "".join(sorted(auto.chars[p]))[:12]
        return f"position {p} [{sample!r}{'...' if len(auto.chars[p]) > 12 else ''}]"

    choices: list[tuple[str, list[int]]] = [("the start", sorted(first))]
    choices += [(f"after {describe(p)}", targets) for p, targets in auto.follow.items()]
    for where, targets in choices:
        if len(set(targets)) != len(targets):
            twice = next(t for t in targets if targets.count(t) > 1)
            return f"{where}: {describe(twice)} is reached along two routes (nested loops)"
        unique = sorted(set(targets))
        for i, a in enumerate(unique):
            for b in unique[i + 1 :]:
                if (auto.looped[a] or auto.looped[b]) and auto.chars[a] & auto.chars[b]:
                    return f"{where}: {describe(a)} and {describe(b)} accept a common character inside a loop"
    return None


__all__ = ["ambiguity"]
