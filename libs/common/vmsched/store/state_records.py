"""Stored state records: parsing them back into models, and what a host's VMs add up to.

Shared by the writer (StateWriter, which derives each HostState) and the readers (StateCache,
which parses the stored ones).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

from pydantic import ValidationError

from vmsched.contracts import HostReport, HostState, Message, VmReport, VmStatus
from vmsched.logging import get_logger
from vmsched.scheduling.cost import vm_cost

log = get_logger(__name__)

#: VM states that use resources on their host. A migrating VM counts on the host it is reported
#: on (VmReport has one host); the engine reports the destination once the migration ends.
COUNTED_STATUSES: frozenset[VmStatus] = frozenset({VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING})


def counts_on_host(vm: VmReport) -> bool:
    """Whether the VM uses resources on a host (a counted status, and a host to count it on)."""
    return vm.status in COUNTED_STATUSES and vm.host_id is not None


def aggregate_host(
    report: HostReport,
    vms: Iterable[VmReport],
    cpu_samples: Sequence[tuple[float, float]] = (),
    build_failures: int = 0,
) -> HostState:
    """A host's report plus the aggregates of the VMs that count on it (oVirt's mem_commited etc.)
    and what the tracker remembers of it (load history, failed starts)."""
    vm_count = mem = vcpus = pinned = ha = 0
    vms = list(vms)
    for vm in vms:
        vm_count += 1
        cost = vm_cost(vm)
        mem += cost.mem_mb
        vcpus += cost.vcpus
        pinned += cost.cpus_pinned
        if vm.ha:
            ha += 1
    return HostState(
        report=report,
        vm_count=vm_count,
        mem_committed_mb=mem,
        vcpus_committed=vcpus,
        cpus_pinned=pinned,
        ha_vm_count=ha,
        vm_ids=sorted(vm.vm_id for vm in vms),
        cpu_samples=list(cpu_samples),
        build_failures=build_failures,
    )


M = TypeVar("M", bound=Message)

#: The pydantic validation context of a stored record (`info.context` in a validator). Every
#: record in Redis was validated when the state tracker took it off the bus, so a validator that
#: re-walks a whole JSON tree for its bounds (vmsched.contracts.base.json_bounds) may skip the
#: walk when the context says `stored`: a full load parses every host of a cluster, and walking
#: each host's capabilities again costs more than parsing them. Every field's type and each
#: field's own limits are still checked, and messages from the bus never get this context.
STORED: Mapping[str, bool] = MappingProxyType({"stored": True})

#: Records larger than this (bytes, or characters for text) are validated as messages off the bus
#: are (no STORED context): the walks a stored record may skip are bounded by its size, and a
#: record the tracker writes for a valid report is a few KB (a host's report, its VM ids, its CPU
#: samples).
MAX_TRUSTED_BYTES = 256 * 1024


def parse_stored(model: type[M], raw: bytes | str) -> M:
    """Parse a record that this or an older version stored, in the STORED validation context
    unless it is larger than MAX_TRUSTED_BYTES.

    Messages on the wire refuse unknown fields; stored state must survive an upgrade that removed
    one, or the state tracker could not load its clusters at all. Fields the model no longer has
    are dropped with a warning; any other problem still raises.
    """
    context = STORED if len(raw) <= MAX_TRUSTED_BYTES else None
    try:
        return model.model_validate_json(raw, context=context)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(e["type"] != "extra_forbidden" for e in errors):
            raise
        data = json.loads(raw)
        for e in errors:
            node = data
            for part in e["loc"][:-1]:
                node = node[part]
            node.pop(e["loc"][-1], None)
        log.warning(
            "stored record has fields this version does not know: dropped",
            model=model.__name__,
            fields=[".".join(str(p) for p in e["loc"]) for e in errors],
        )
        return model.model_validate(data, context=context)


__all__ = ["COUNTED_STATUSES", "MAX_TRUSTED_BYTES", "STORED", "aggregate_host", "counts_on_host", "parse_stored"]
