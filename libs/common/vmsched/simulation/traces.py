"""Public VM traces turned into workloads: the Azure public dataset's VM table (vmtable.csv).

The Azure trace (github.com/Azure/AzurePublicDataset, 2017 and 2019 releases) lists each VM as a CSV
row, without a header: vmid, subscriptionid, deploymentid, vmcreated, vmdeleted, maxcpu, avgcpu,
p95maxcpu, vmcategory, vmcorecountbucket, vmmemorybucket; times are seconds from the trace's start,
CPU figures percent of the VM's cores, and sizes buckets (cores 2, 4, 8, 12, 24, >24; memory GB 2,
4, 8, 32, 64, >64). A VM becomes an arrival at vmcreated (less the first vmcreated), with vmdeleted
- vmcreated as its lifetime, its vmid as its id (+ and / made - and .) and avgcpu as its load
(p95maxcpu with `load="p95"`); a ">" bucket is
taken as twice its bound. The trace has no hosts: they are `hosts` identical ones the caller gives.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Literal

from vmsched.errors import InvalidRequest
from vmsched.simulation.workload import HostSpec, VmArrival, Workload

AZURE_COLUMNS = (
    "vmid",
    "subscriptionid",
    "deploymentid",
    "vmcreated",
    "vmdeleted",
    "maxcpu",
    "avgcpu",
    "p95maxcpu",
    "vmcategory",
    "vmcorecountbucket",
    "vmmemorybucket",
)
#: Traces the converter reads (`vmsched simulate --trace FORMAT FILE`).
TRACE_FORMATS = ("azure",)


def _vm_id(vmid: str) -> str:
    """An Azure vmid (base64: letters, digits, + / =) as a vmsched id (letters, digits, . _ : @ -)."""
    ident = vmid.strip().rstrip("=").replace("+", "-").replace("/", ".")
    if not ident[:1].isalnum():
        ident = "v" + ident
    return ident[:64]


def _bucket(value: str) -> float:
    """A size bucket's value: the number, or twice the bound of an open one (>24 cores: 48)."""
    value = value.strip()
    return 2 * float(value[1:]) if value.startswith(">") else float(value)


def azure_workload(
    lines: Iterable[str],
    source: str,
    hosts: HostSpec,
    *,
    load: Literal["avg", "p95"] = "avg",
    max_vms: int | None = None,
) -> Workload:
    """The workload of an Azure VM table (rows as text lines, a header row allowed) on `hosts`."""
    rows: list[tuple[float, float, str, int, int, float]] = []
    for line, row in enumerate(csv.reader(lines), start=1):
        if not row or (line == 1 and row[0].strip().lower() == "vmid"):
            continue
        if len(row) != len(AZURE_COLUMNS):
            raise InvalidRequest(
                f"{source}: line {line}: {len(row)} columns, not the Azure VM table's {len(AZURE_COLUMNS)} "
                f"({', '.join(AZURE_COLUMNS)})"
            )
        cell = dict(zip(AZURE_COLUMNS, row, strict=True))
        try:
            created, deleted = float(cell["vmcreated"]), float(cell["vmdeleted"])
            cpu = float(cell["p95maxcpu" if load == "p95" else "avgcpu"])
            cores, mem_gb = _bucket(cell["vmcorecountbucket"]), _bucket(cell["vmmemorybucket"])
        except ValueError as exc:
            raise InvalidRequest(f"{source}: line {line}: {exc} (times, CPU and buckets are numbers)") from None
        rows.append((created, deleted, _vm_id(cell["vmid"]), int(cores), int(mem_gb * 1024), cpu))
        if max_vms is not None and len(rows) >= max_vms:
            break
    if not rows:
        raise InvalidRequest(f"{source}: no VMs (an Azure VM table has a row per VM: {', '.join(AZURE_COLUMNS)})")
    origin = min(r[0] for r in rows)
    arrivals = [
        VmArrival(
            at_s=created - origin,
            vm_id=vm,
            vcpus=max(1, cores),
            mem_mb=max(1, mem),
            cpu_usage_pct=min(100.0, max(0.0, cpu)),
            lifetime_s=deleted - created if deleted > created else None,
        )
        for created, deleted, vm, cores, mem, cpu in sorted(rows)
    ]
    name = source.rsplit("/", 1)[-1]
    return Workload(
        name=f"azure-{name}",
        description=f"Azure VM table {name}: {len(arrivals)} VMs ({load} CPU) on {hosts.count} hosts of "
        f"{hosts.cpu_cores} cores and {hosts.mem_mb // 1024} GB",
        hosts=[hosts],
        arrivals=arrivals,
    )


__all__ = ["AZURE_COLUMNS", "TRACE_FORMATS", "azure_workload"]
