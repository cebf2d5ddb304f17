"""A workload's ids and the references between them, checked entry by entry as they are read.

The JSON reader (workload_json.py) feeds it each host, group, arrival, departure, failure and
maintenance window as soon as it has parsed it, so that the first bad reference deep in a big file
is said when it is reached, not after the whole file is in memory; the Workload model's own
validator feeds it the same entries from a validated model. A reference to a section not yet
complete (arrivals written before hosts) is kept and checked when the section is.

Messages name the entry, what it refers to, and the ids that exist ("arrivals.3: vm v3 names host
h9: no such host; hosts are h001…h008"), summarised so that 10,000 hosts are a line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

#: Hosts a workload may have, counts expanded (the simulator's target is 10,000): a few KB of
#: `count: 100000` entries must not become millions of host ids.
MAX_HOSTS = 100_000

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def summarize_ids(ids: Iterable[str], limit: int = 6) -> str:
    """Ids as a reader takes them in: runs of numbered ids as ranges (h001…h008), at most `limit`
    items, then how many more; "none" for none."""
    runs: list[list[str]] = []  # [first, last] of consecutive numbered ids, or [id]
    last: tuple[str, int, int] | None = None  # prefix, number, width of the previous id
    count = 0
    for ident in ids:
        count += 1
        match = _NUMBERED.match(ident)
        key = (match.group(1), int(match.group(2)), len(match.group(2))) if match else None
        if key and last and key[0] == last[0] and key[1] == last[1] + 1 and key[2] == last[2]:
            runs[-1][1:] = [ident]
        else:
            runs.append([ident])
        last = key
    if not runs:
        return "none"
    items = ["…".join(r) if len(r) == 2 else r[0] for r in runs]
    shown = ", ".join(items[:limit])
    if len(items) > limit:
        shown += f" and {len(items) - limit} more ({count} in all)"
    return shown


def host_names(prefix: str, count: int, first: int = 1) -> list[str]:
    """The ids of a host entry: `prefix` alone for one host; for more, `prefix` and the numbers
    first…first+count-1, zero-padded to the width of the last (h1…h8, h01…h12; h09…h12 after an
    entry h1…h8 with the same id)."""
    if count == 1:
        return [prefix]
    last = first + count - 1
    width = len(str(last))
    return [f"{prefix}{n:0{width}d}" for n in range(first, last + 1)]


class References:
    """Ids seen so far and references still to check. Each method raises ValueError saying what is
    wrong and where; `where` is the entry's path (arrivals.3)."""

    def __init__(self) -> None:
        self.hosts: dict[str, str] = {}  # id -> the entry that names it
        self._numbered: dict[str, int] = {}  # prefix -> numbers used by its entries with count > 1
        self.groups: dict[str, str] = {}
        self.vms: dict[str, str] = {}
        self.complete: set[str] = set()  # sections read to their end
        self._pending: list[tuple[str, str, str, str]] = []  # (section needed, where, what, id)

    # ------------------------------------------------------------------ definitions
    def host(self, where: str, prefix: str, count: int) -> list[str]:
        """The ids of a host entry (host_names, numbered on from earlier entries with the same id)."""
        if len(self.hosts) + count > MAX_HOSTS:
            raise ValueError(
                f"{where}: more than {MAX_HOSTS:,} hosts (counts expanded); a workload has at most {MAX_HOSTS:,}"
            )
        first = 1
        if count > 1:
            first = self._numbered.get(prefix, 0) + 1
            self._numbered[prefix] = first + count - 1
        ids = host_names(prefix, count, first)
        for ident in ids:
            if ident in self.hosts:
                raise ValueError(f"{where}: host id {ident!r} repeats ({self.hosts[ident]} names it too)")
            self.hosts[ident] = where
        return ids

    def group(self, where: str, ident: str) -> None:
        if ident in self.groups:
            raise ValueError(f"{where}: affinity group {ident!r} repeats ({self.groups[ident]} is it too)")
        self.groups[ident] = where

    def arrival(self, where: str, vm: str, pinned: Sequence[str], groups: Sequence[str]) -> None:
        if vm in self.vms:
            raise ValueError(f"{where}: vm_id {vm!r} repeats ({self.vms[vm]} has it too)")
        self.vms[vm] = where
        for host in pinned:
            self._refer("hosts", f"{where}.pinned_hosts", f"vm {vm} names host", host)
        for group in groups:
            self._refer("affinity_groups", f"{where}.affinity_groups", f"vm {vm} names affinity group", group)

    def departure(self, where: str, vm: str) -> None:
        self._refer("arrivals", where, "VM", vm)

    def host_event(self, where: str, host: str) -> None:
        self._refer("hosts", where, "host", host)

    def section_done(self, section: str) -> None:
        """`section` is read to its end: references to it waiting are checked now."""
        self.complete.add(section)
        waiting, self._pending = self._pending, []
        for needed, where, what, ident in waiting:
            self._refer(needed, where, what, ident)

    def finish(self) -> None:
        """Every section is read: references still waiting are checked."""
        for section in ("hosts", "affinity_groups", "arrivals"):
            self.section_done(section)

    # ------------------------------------------------------------------ references
    def _refer(self, section: str, where: str, what: str, ident: str) -> None:
        known = {"hosts": self.hosts, "affinity_groups": self.groups, "arrivals": self.vms}[section]
        if ident in known:
            return
        if section not in self.complete:
            self._pending.append((section, where, what, ident))
            return
        noun = {"hosts": "host", "affinity_groups": "affinity group", "arrivals": "VM"}[section]
        listed = {"hosts": "hosts", "affinity_groups": "affinity groups", "arrivals": "VMs"}[section]
        raise ValueError(f"{where}: {what} {ident}: no such {noun}; {listed} are {summarize_ids(known)}")


__all__ = ["MAX_HOSTS", "References", "host_names", "summarize_ids"]
