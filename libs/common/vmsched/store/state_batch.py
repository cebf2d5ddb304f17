"""What one state commit writes (StateWrite), and how the writes of a run of reports become one.

The state tracker applies reports that wait together (StateWriter.apply_reports): each report is
applied to the in-memory cluster in order, exactly as it would be alone, and what each would have
written is merged into one commit, one version. The merged write stores what the last of them would
have left: each changed host's final HostState, and each VM's last outcome (stored or deleted).

One thing a commit does depends on the state *between* reports: it settles a pending resync
(store.generations.SETTLE_RESYNC) when the state holds as many hosts and VMs as the engine's full
report had. Applied one at a time, the reports get that check after each; a later report of the same
run may delete a VM and bring the count back under. So the merged write also carries the counts after
each report that could have settled it, as offsets from the counts after the last one (Redis's own
HLEN is the base: what the writer holds in memory is the same set, but an offset stays right even if
Redis held a record the writer skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vmsched.contracts import ClusterReport, VmReport


@dataclass
class StateWrite:
    """What one commit changes in Redis."""

    kind: str
    hosts: list[str] = field(default_factory=list)
    vms_set: list[VmReport] = field(default_factory=list)
    vms_deleted: list[str] = field(default_factory=list)
    settings: ClusterReport | None = None
    hosts_deleted: list[str] = field(default_factory=list)
    #: (hosts, VMs) after earlier reports of a merged run, as offsets from the counts after the last
    #: one, where a resync may have settled (see the module docstring). Empty: only the final counts.
    earlier_counts: list[tuple[int, int]] = field(default_factory=list)


def merge(writes: Sequence[StateWrite], counts: Sequence[tuple[int, int]]) -> StateWrite:
    """One write with the effect of `writes` committed one after the other; `counts` are the
    cluster's (hosts, counted VMs) after each of them. Only host and VM writes merge (settings and
    removals go alone: the state tracker sends them one at a time)."""
    if len(writes) != len(counts):
        raise ValueError(f"{len(writes)} writes but {len(counts)} counts")
    if any(w.settings is not None or w.hosts_deleted for w in writes):
        raise ValueError("settings and host removals are committed alone, not merged")
    if len(writes) == 1:
        return writes[0]
    hosts: set[str] = set()
    last: dict[str, VmReport | None] = {}
    for w in writes:
        hosts.update(w.hosts)
        # In the order they happened: a VM stored then deleted is deleted, and the reverse stored.
        for vm in w.vms_set:
            last.pop(vm.vm_id, None)
            last[vm.vm_id] = vm
        for vm_id in w.vms_deleted:
            last.pop(vm_id, None)
            last[vm_id] = None
    kinds = {w.kind for w in writes}
    return StateWrite(
        kind=kinds.pop() if len(kinds) == 1 else "reports",
        hosts=sorted(hosts),
        vms_set=[vm for vm in last.values() if vm is not None],
        vms_deleted=[vm_id for vm_id, vm in last.items() if vm is None],
        earlier_counts=earlier_counts(counts),
    )


def earlier_counts(counts: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The counts after earlier writes that a resync check after the last one would not cover, as
    offsets from the last: those with more hosts or more VMs than every later point has (a point
    with no more of either than a later one settles nothing that one does not)."""
    if not counts:
        return []
    final_hosts, final_vms = counts[-1]
    kept: list[tuple[int, int]] = []
    later: list[tuple[int, int]] = [counts[-1]]
    for hosts, vms in reversed(counts[:-1]):
        if any(h >= hosts and v >= vms for h, v in later):
            continue
        later.append((hosts, vms))
        kept.append((hosts - final_hosts, vms - final_vms))
    kept.reverse()
    return kept


__all__ = ["StateWrite", "earlier_counts", "merge"]
