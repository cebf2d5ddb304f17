"""Nova's names for architectures and hypervisors, and its hypervisor version checks, as pure functions.

ImagePropertiesFilter compares an image's architecture and hypervisor type with the host's after
Nova's canonicalization (amd64 is x86_64, xapi is xen), and checks the host's hypervisor version,
an int as Nova stores it (6001000 = 6.1.0), against requirements like ">=6.0, <7.0".
"""

from __future__ import annotations

import re
from collections.abc import Callable

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "i386": "i686", "i486": "i686", "i586": "i686"}
_ARCH_ALIASES |= {"x86_32": "i686", "x86_32p": "i686", "arm64": "aarch64"}
_HV_ALIASES = {"xapi": "xen"}


def canonical_arch(name: str) -> str:
    """Nova's arch.canonicalize: lower case, amd64 -> x86_64, i386..i586 -> i686 (+ arm64 -> aarch64)."""
    lowered = name.strip().lower()
    return _ARCH_ALIASES.get(lowered, lowered)


def canonical_hv_type(name: str) -> str:
    """Nova's hv_type.canonicalize: lower case, xapi -> xen."""
    lowered = name.strip().lower()
    return _HV_ALIASES.get(lowered, lowered)


def version_tuple(version: int) -> tuple[int, int, int]:
    """Nova's convert_version_to_str, as a tuple: 1005003 -> (1, 5, 3)."""
    return version // 1_000_000, version // 1_000 % 1_000, version % 1_000


_VERSION_CLAUSE = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*([0-9]+(?:\.[0-9]+){0,2})\s*$")
_VERSION_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def version_satisfies(version: tuple[int, ...], requirement: str) -> bool | None:
    """Does `version` meet every comma-separated clause (">=6.0, <7.0")? None if unparseable.

    Versions compare as integer tuples padded with zeros ("6" == "6.0.0"), like distutils'
    VersionPredicate that Nova uses.
    """
    clauses = [c for c in requirement.split(",") if c.strip()]
    if not clauses:
        return None
    ok = True
    for clause in clauses:
        parsed = _VERSION_CLAUSE.match(clause)
        if parsed is None:
            return None
        wanted = tuple(int(p) for p in parsed.group(2).split("."))
        wanted = wanted + (0,) * (3 - len(wanted))
        ok = ok and _VERSION_OPS[parsed.group(1)](version, wanted)
    return ok


__all__ = ["canonical_arch", "canonical_hv_type", "version_satisfies", "version_tuple"]
