"""The figures an operator pays for, per sample: watts drawn (and the idle watts of the hosts powered
off), CPU wanted and not given, hosts over HighUtilization, vCPU and memory overcommit."""

from __future__ import annotations

from typing import Any

import numpy as np

from vmsched.scheduling.hosts import FloatArray, HostTable, IndexArray
from vmsched.simulation.power import PowerModel, default_watts
from vmsched.simulation.records import Snapshot


class Operator:
    """What the operator figures of a sample need besides the snapshot: each host's (idle,
    maximum) watts (a host not named: power.default_watts of its cores) and HighUtilization."""

    def __init__(self, watts: PowerModel | None = None, high_utilization: float = 80.0) -> None:
        self.watts = dict(watts or {})
        self.high_utilization = high_utilization
        self._cached: tuple[tuple[str, ...], FloatArray, FloatArray] | None = None

    def model(self, table: HostTable) -> tuple[FloatArray, FloatArray]:
        """Idle and maximum watts in the table's host order (kept while the hosts are the same)."""
        ids = tuple(table.ids)
        if self._cached is None or self._cached[0] != ids:
            cores = table.cpu_cores.tolist()
            pairs = [self.watts.get(h) or default_watts(int(c)) for h, c in zip(ids, cores, strict=True)]
            idle = np.array([p[0] for p in pairs], dtype=np.float64)
            self._cached = ids, idle, np.array([p[1] for p in pairs], dtype=np.float64)
        return self._cached[1], self._cached[2]


def operator_figures(snapshot: Snapshot, idx: IndexArray, op: Operator) -> dict[str, Any]:
    table = snapshot.table
    idle_all, peak_all = op.model(table)
    off = np.zeros(len(table), dtype=np.bool_)
    off[table.index_of(sorted(snapshot.off))] = True
    on = ~off[idx]
    cpu = table.cpu_usage_pct[idx]
    idle, peak = idle_all[idx], peak_all[idx]
    drawn = idle + (peak - idle) * np.clip(cpu, 0.0, 100.0) / 100.0
    cpus = table.effective_cpus[idx]
    unmet = sum(
        (pct - 100.0) / 100.0 * float(table.effective_cpus[table.index[h]]) for h, pct in snapshot.overload.items()
    )
    in_use = table.vm_count[idx] > 0
    usable = np.maximum(table.physical_mem_mb[idx] - table.reserved_mem_mb[idx], 1.0)
    vcpus, mem = table.vcpus_committed[idx], table.mem_committed_mb[idx]
    return {
        "cpu_max": float(cpu.max()) if len(idx) else 0.0,
        "power_w": float(drawn[on].sum()),
        "off_idle_w": float(idle[~on].sum()),
        "cpu_wanted": float((cpu * cpus).sum() / 100.0) + unmet,
        "cpu_unmet": unmet,
        "hosts_over_high": int((on & (cpu > op.high_utilization)).sum()),
        "vcpu_ratio": float(vcpus[in_use].sum() / max(float(cpus[in_use].sum()), 1e-9)) if in_use.any() else 0.0,
        "vcpu_ratio_max": float((vcpus[in_use] / np.maximum(cpus[in_use], 1e-9)).max()) if in_use.any() else 0.0,
        "mem_ratio": float(mem[in_use].sum() / float(usable[in_use].sum())) if in_use.any() else 0.0,
        "mem_ratio_max": float((mem[in_use] / usable[in_use]).max()) if in_use.any() else 0.0,
    }


__all__ = ["Operator", "operator_figures"]
