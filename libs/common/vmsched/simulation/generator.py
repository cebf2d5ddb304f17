"""Seeded workloads with the shapes a real datacenter has.

Sizes come from a few common flavours (most VMs are small); arrivals follow a day's rhythm
(busiest mid-afternoon, quietest before dawn) with a few bursts (a deployment starting many VMs
at once), and so does the VMs' CPU load (a load curve: half the base load before dawn, one and a
half times it mid-afternoon); a VM takes half a minute to start; most VMs are short-lived, some
stay for the whole run; a share is highly available; a few small anti-affinity groups (replicas
kept apart). Hosts may be powered off and on by power saving's advice (power management on, two
hosts in reserve, unless a policy says otherwise). The same seed gives the same workload.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vmsched.scheduling.properties import HOSTS_IN_RESERVE_PROPERTY, POWER_MANAGEMENT_PROPERTY
from vmsched.simulation.workload import AffinityGroupSpec, ClusterSettings, HostSpec, VmArrival, Workload

#: (vCPUs, memory GB, weight): small VMs dominate, as in public and private clouds alike.
FLAVOURS: tuple[tuple[int, int, float], ...] = ((1, 2, 0.35), (2, 4, 0.30), (4, 8, 0.20), (8, 16, 0.10), (16, 32, 0.05))
#: (cores, memory GB, weight) of host models.
HOST_MODELS: tuple[tuple[int, int, float], ...] = ((32, 256, 0.7), (64, 512, 0.3))
#: cores -> (idle, maximum) watts of the host models (two-socket servers of those sizes).
HOST_WATTS: dict[int, tuple[float, float]] = {32: (150.0, 420.0), 64: (220.0, 740.0)}
NETWORK = "ovirtmgmt"


@dataclass(frozen=True)
class GeneratorSpec:
    hosts: int = 50
    vms: int = 1000
    hours: float = 24.0
    seed: int = 1
    #: Share of VMs that are highly available.
    ha_share: float = 0.2
    #: Share of VMs that stay until the end.
    long_lived_share: float = 0.3
    #: Mean lifetime of the others, hours (exponential).
    short_mean_hours: float = 2.0
    #: Share of VMs that arrive in bursts.
    burst_share: float = 0.15
    #: Share of VMs in anti-affinity groups of three.
    affinity_share: float = 0.05
    sample_interval_s: float = 300.0
    #: The cluster keeps HA reservation (the HA check runs every 5 simulated minutes).
    ha_reservation: bool = False
    start_delay_s: float = 30.0
    #: The load curve's swing: CPU load is (1 - swing) of the base at 03:00, (1 + swing) at 15:00.
    load_swing: float = 0.5


#: Power saving's power management for generated workloads (a policy that sets these keeps its own).
POWER_DEFAULTS: dict[str, str] = {POWER_MANAGEMENT_PROPERTY: "true", HOSTS_IN_RESERVE_PROPERTY: "2"}


def load_curve(swing: float) -> list[float]:
    """24 hourly factors following the arrivals' rhythm: 1 - swing at 03:00, 1 + swing at 15:00."""
    return [round(1.0 + swing * float(np.sin(2 * np.pi * (h + 0.5 - 9.0) / 24.0)), 3) for h in range(24)]


def _diurnal_times(rng: np.random.Generator, n: int, span_s: float) -> np.ndarray:
    """`n` arrival times over [0, span_s) with rate 1 + 0.6 sin: peak at 15:00, trough at 03:00."""
    grid = np.linspace(0.0, span_s, 2049)
    hours = grid / 3600.0
    rate = 1.0 + 0.6 * np.sin(2 * np.pi * (hours - 9.0) / 24.0)
    cdf = np.concatenate(([0.0], np.cumsum((rate[1:] + rate[:-1]) / 2)))
    cdf /= cdf[-1]
    times: np.ndarray = np.interp(rng.random(n), cdf, grid)
    return times


def generate(spec: GeneratorSpec) -> Workload:
    """A workload of `spec.hosts` hosts and `spec.vms` arrivals over `spec.hours` hours."""
    rng = np.random.default_rng(spec.seed)
    span = spec.hours * 3600.0
    models = rng.choice(len(HOST_MODELS), size=spec.hosts, p=[m[2] for m in HOST_MODELS])
    width = len(str(spec.hosts))
    hosts = [
        HostSpec(
            id=f"h{i + 1:0{width}d}",
            cpu_cores=HOST_MODELS[m][0],
            cpu_threads=2 * HOST_MODELS[m][0],
            mem_mb=HOST_MODELS[m][1] * 1024,
            networks=[NETWORK],
            is_spm=(i == 0),
            idle_watts=HOST_WATTS.get(HOST_MODELS[m][0], (None, None))[0],
            max_watts=HOST_WATTS.get(HOST_MODELS[m][0], (None, None))[1],
        )
        for i, m in enumerate(models.tolist())
    ]

    n_burst = int(spec.vms * spec.burst_share)
    steady = _diurnal_times(rng, spec.vms - n_burst, span)
    burst_parts: list[np.ndarray] = []
    left = n_burst
    while left > 0:
        size = min(left, int(rng.integers(10, 60)))
        at = rng.random() * span * 0.95
        burst_parts.append(at + rng.random(size) * 120.0)  # a burst lasts two minutes
        left -= size
    times = np.sort(np.concatenate([steady, *burst_parts]) if burst_parts else steady)

    flavours = rng.choice(len(FLAVOURS), size=spec.vms, p=[f[2] for f in FLAVOURS])
    ha = rng.random(spec.vms) < spec.ha_share
    long_lived = rng.random(spec.vms) < spec.long_lived_share
    lifetimes = rng.exponential(spec.short_mean_hours * 3600.0, size=spec.vms) + 60.0
    loads = np.round(rng.beta(2.0, 5.0, size=spec.vms) * 100.0, 1)
    in_group = rng.random(spec.vms) < spec.affinity_share

    width = len(str(spec.vms))
    groups: list[AffinityGroupSpec] = []
    open_group: tuple[str, int] | None = None
    arrivals: list[VmArrival] = []
    for i in range(spec.vms):
        vcpus, mem_gb, _ = FLAVOURS[int(flavours[i])]
        member_of: list[str] = []
        if in_group[i]:
            if open_group is None or open_group[1] == 3:
                open_group = (f"g{len(groups) + 1}", 0)
                groups.append(AffinityGroupSpec(id=open_group[0], positive=False, enforcing=False))
            open_group = (open_group[0], open_group[1] + 1)
            member_of = [open_group[0]]
        arrivals.append(
            VmArrival(
                at_s=round(float(times[i]), 3),
                vm_id=f"vm{i + 1:0{width}d}",
                mem_mb=mem_gb * 1024,
                vcpus=vcpus,
                ha=bool(ha[i]),
                cpu_usage_pct=float(loads[i]),
                networks=[NETWORK],
                affinity_groups=member_of,
                lifetime_s=None if long_lived[i] else round(float(lifetimes[i]), 3),
            )
        )
    return Workload(
        name=f"generated-{spec.hosts}h-{spec.vms}vm-{spec.hours:g}h-seed{spec.seed}",
        description="generated: flavours 1/2 to 16/32 vCPU/GB, diurnal arrivals with bursts and a diurnal load "
        "curve, 30 s starts, power management with 2 hosts in reserve",
        duration_s=span,
        sample_interval_s=spec.sample_interval_s,
        start_delay_s=spec.start_delay_s,
        load_curve=load_curve(spec.load_swing) if spec.load_swing else [],
        cluster=ClusterSettings(ha_reservation=spec.ha_reservation),
        policy_defaults=dict(POWER_DEFAULTS),
        hosts=hosts,
        affinity_groups=groups,
        arrivals=arrivals,
    )


__all__ = ["FLAVOURS", "HOST_MODELS", "HOST_WATTS", "POWER_DEFAULTS", "GeneratorSpec", "generate", "load_curve"]
