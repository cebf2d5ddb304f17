"""What a VM costs the host it runs on: one definition for the filters, the balancer, the state
tracker's per-host aggregates and the selector's pending records, so they never disagree.

oVirt charges a VM its guest memory plus its overhead (QEMU, video RAM) against a host's memory,
its vCPUs against the host's CPUs, and, when its CPUs are dedicated (exclusively pinned), as many
physical CPUs as it has vCPUs that no other VM may use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SizedVm(Protocol):
    """A VM's size as both a VmSpec (to be placed) and a VmReport (running) give it."""

    @property
    def mem_mb(self) -> int: ...
    @property
    def overhead_mb(self) -> int: ...
    @property
    def vcpus(self) -> int: ...
    @property
    def exclusive_cpus(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class VmCost:
    #: Guest memory plus overhead.
    mem_mb: int
    vcpus: int
    #: Physical CPUs taken exclusively (dedicated CPU policy), 0 for a shared-CPU VM.
    cpus_pinned: int


def vm_cost(vm: SizedVm) -> VmCost:
    return VmCost(
        mem_mb=vm.mem_mb + vm.overhead_mb,
        vcpus=vm.vcpus,
        cpus_pinned=vm.vcpus if vm.exclusive_cpus else 0,
    )


__all__ = ["SizedVm", "VmCost", "vm_cost"]
