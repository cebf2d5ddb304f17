"""oVirt's memory filter units: Memory, Swap and HugePages (MemoryPolicyUnit + SlaValidator,
SwapFilterPolicyUnit, HugePagesFilterPolicyUnit).

Each filter is a few array expressions over the HostTable; a reason string (with numbers) is built
only for the hosts it removes. Where vmsched deliberately differs from the engine's code, the
difference and its reason are noted at the unit.
"""

from __future__ import annotations

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, any_true
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, PropertySpec, Props, prop_int
from vmsched.scheduling.units.helpers import fmt_num, max_scheduling_memory_mb, or_current_host, vm_memory_need_mb

MAX_ALLOWED_SWAP_USAGE = PropertySpec(
    r"^1?[0-9]?[0-9]$", "0", "swap in use beyond free memory (% of physical memory) a host may have"
)


# ---------------------------------------------------------------------------------------- Memory
def memory_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Physical check, then overcommit check (oVirt's order; the first failure is the reason).

    A VM's *memory need* is its memory plus overhead. A VM backed by static huge pages takes its
    memory from the host's free huge pages of its page size, which are outside the host's free
    memory; as in oVirt, only the pages those free pages (after the pending ones, counted as in the
    HugePages filter) do not cover, rounded up to whole pages, plus the overhead are its need here:
    the kernel would have to allocate the missing pages from ordinary memory.

    Physical: need <= free - pending (+ free swap when the VM may use swap and is not backed by
    huge pages: QEMU's up-front allocation check counts swap, huge pages cannot be swapped).
    Overcommit: need <= max scheduling memory. As in oVirt, both checks are skipped on the host the
    VM already runs on (its memory is already there); the Migration filter removes that host anyway.
    """
    need, uncovered_mb = _memory_need(hosts, vm)
    swap_counts = vm.use_swap and not vm.hugepages
    swap: float | FloatArray = hosts.swap_free_mb if swap_counts else 0.0
    physical = hosts.mem_free_mb - hosts.pending_mem_mb + swap
    max_sched = max_scheduling_memory_mb(hosts)
    phys_ok = need <= physical
    keep = or_current_host(phys_ok & (need <= max_sched), hosts, vm)

    def required(i: int) -> str:
        text = f"required {fmt_num(_at(need, i))} MB"
        if uncovered_mb is not None:
            text += (
                f" ({fmt_num(uncovered_mb[i])} MB not covered by free {vm.hugepage_size_kb} KiB huge pages"
                f" + overhead {vm.overhead_mb} MB)"
            )
        return text

    def reason(i: int) -> str:
        if not phys_ok[i]:
            pending, free_swap = hosts.pending_mem_mb[i], _at(swap, i)
            if pending == 0 and free_swap == 0:
                return f"free memory {fmt_num(physical[i])} MB < {required(i)}"
            parts = f"free memory {fmt_num(hosts.mem_free_mb[i])} MB"
            if pending:
                parts += f" - pending {fmt_num(pending)} MB"
            if free_swap:
                parts += f" + free swap {fmt_num(free_swap)} MB"
            return f"{parts} = {fmt_num(physical[i])} MB < {required(i)}"
        return (
            f"max scheduling memory {fmt_num(max_sched[i])} MB < {required(i)} "
            f"(overcommit {hosts.settings.memory_overcommit_pct}% of {fmt_num(hosts.physical_mem_mb[i])} MB"
            f" - committed {fmt_num(hosts.mem_committed_mb[i])} MB"
            f" - reserved {fmt_num(hosts.reserved_mem_mb[i])} MB"
            f" - pending {fmt_num(hosts.pending_mem_mb[i])} MB)"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def _memory_need(hosts: HostTable, vm: VmSpec) -> tuple[float | FloatArray, FloatArray | None]:
    """The VM's memory need on each host (one number without huge pages), and with huge pages the
    MB its free huge pages do not cover."""
    if not vm.hugepages:
        return vm_memory_need_mb(vm), None
    size = vm.hugepage_size_kb
    _, free_pages, pending_pages = _free_hugepages(hosts, size)
    covered = np.maximum(free_pages - pending_pages, 0.0)
    uncovered_mb = np.ceil(np.maximum(hugepages_needed(vm.mem_mb, size) - covered, 0.0) * size / 1024.0)
    return uncovered_mb + float(vm.overhead_mb), uncovered_mb


def _at(value: float | FloatArray, i: int) -> float:
    return float(value[i]) if isinstance(value, np.ndarray) else value


# ------------------------------------------------------------------------------------------ Swap
def swap_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """A host is swapping when the swap it uses beyond its free memory, as a share of its physical
    memory, exceeds MaximumAllowedSwapUsage: (swap total - swap free - mem free) x 100 / physical
    (integer division, as oVirt's longs) > allowed.

    As in oVirt, a host without the information (no swap, no free memory or no physical memory
    reported) passes. oVirt's engine-wide EnableSwapCheck switch is "include the unit in the policy".
    """
    allowed = prop_int(props, "MaximumAllowedSwapUsage", 0)
    has_swap = hosts.derived("swap_known", ("swap_total_mb", "physical_mem_mb"), _swap_known)
    if not any_true(has_swap):  # no host reports swap (and memory): none is known to swap
        return FilterVerdict.keep_all(hosts)
    known = has_swap & (hosts.mem_free_mb > 0)
    beyond = hosts.swap_total_mb - hosts.swap_free_mb - hosts.mem_free_mb
    used_pct = np.trunc(beyond * 100.0 / np.where(known, hosts.physical_mem_mb, 1.0))
    keep = ~known | (used_pct <= allowed)

    def reason(i: int) -> str:
        return (
            f"swapping: (swap {fmt_num(hosts.swap_total_mb[i])} MB - free swap {fmt_num(hosts.swap_free_mb[i])} MB"
            f" - free memory {fmt_num(hosts.mem_free_mb[i])} MB) x 100 / physical"
            f" {fmt_num(hosts.physical_mem_mb[i])} MB = {fmt_num(used_pct[i])}% > allowed {allowed}%"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def _swap_known(hosts: HostTable) -> BoolArray:
    out: BoolArray = (hosts.swap_total_mb > 0) & (hosts.physical_mem_mb > 0)
    return out


# ------------------------------------------------------------------------------------- HugePages
def hugepages_needed(mem_mb: float | FloatArray, size_kb: int) -> FloatArray:
    """Huge pages of `size_kb` that `mem_mb` of guest memory takes: ceil(mem_mb x 1024 / size_kb)."""
    return np.ceil(np.asarray(mem_mb, dtype=np.float64) * 1024.0 / size_kb)


def _free_hugepages(hosts: HostTable, size_kb: int) -> tuple[BoolArray, FloatArray, FloatArray]:
    """Per host: whether it reports pages of `size_kb`, how many are free, and how many the
    pending records may take (their whole memory as pages of that size; see hugepages_filter)."""
    n = len(hosts)
    has_size = np.fromiter((size_kb in pages for pages in hosts.hugepages_free), dtype=np.bool_, count=n)
    free = np.fromiter((pages.get(size_kb, 0) for pages in hosts.hugepages_free), dtype=np.float64, count=n)
    return has_size, free, hugepages_needed(hosts.pending_mem_mb, size_kb)


def hugepages_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """A VM backed by static huge pages needs ceil(memory x 1024 / page size) free pages of its page
    size on the host, after the pending ones; a host without pages of that size is removed. As in
    oVirt, a VM without huge pages passes everywhere and the host the VM already runs on passes.

    Pending huge pages: vmsched's pending records carry memory, not pages by size. The filter counts
    a host's whole pending memory as pages of the VM's size (ceil(pending MB x 1024 / size)). That
    can over-count (pending VMs without huge pages, or with another size) but never under-counts,
    so two concurrent decisions cannot promise the same pages; an over-count lasts only while the
    pending records live, and the retry-on-pending-change step (oVirt's: no host but
    pending resources -> wait for them to change and try again) covers it. Exact accounting would
    need a pending huge-pages-by-size column.
    """
    if not vm.hugepages:
        return FilterVerdict.keep_all(hosts)
    size = vm.hugepage_size_kb
    need = float(hugepages_needed(vm.mem_mb, size))
    has_size, free, pending = _free_hugepages(hosts, size)
    available = free - pending
    keep = or_current_host(has_size & (available >= need), hosts, vm)

    def reason(i: int) -> str:
        if not has_size[i]:
            sizes = sorted(hosts.hugepages_free[i])
            offered = ", ".join(f"{s} KiB" for s in sizes) if sizes else "none"
            return f"no {size} KiB huge pages on the host (sizes reported: {offered}); required {fmt_num(need)}"
        if pending[i]:
            return (
                f"free {size} KiB huge pages {fmt_num(free[i])} - pending {fmt_num(pending[i])}"
                f" (for {fmt_num(hosts.pending_mem_mb[i])} MB) = {fmt_num(available[i])} < required {fmt_num(need)}"
            )
        return f"free {size} KiB huge pages {fmt_num(free[i])} < required {fmt_num(need)}"

    return FilterVerdict.from_mask(hosts, keep, reason)


MEMORY = PolicyUnit(
    name="Memory",
    description="Filters out hosts without enough free physical or overcommit memory for the VM.",
    summary="insufficient free memory",
    filter=memory_filter,
    filter_by_row=True,
)
SWAP = PolicyUnit(
    name="Swap",
    description="Filters out hosts that are swapping more than MaximumAllowedSwapUsage.",
    summary="host swapping",
    filter=swap_filter,
    filter_by_row=True,
    properties={"MaximumAllowedSwapUsage": MAX_ALLOWED_SWAP_USAGE},
)
HUGEPAGES = PolicyUnit(
    name="HugePages",
    description="Filters out hosts without enough free huge pages of the VM's page size (pending included).",
    summary="not enough free huge pages",
    filter=hugepages_filter,
    filter_by_row=True,
)

__all__ = [
    "HUGEPAGES",
    "MAX_ALLOWED_SWAP_USAGE",
    "MEMORY",
    "SWAP",
    "hugepages_filter",
    "hugepages_needed",
    "memory_filter",
    "swap_filter",
]
