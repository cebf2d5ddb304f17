"""The bench's figures as a human reads them."""

from __future__ import annotations

from typing import Any

from vmsched_services.tools.bench.data import policies
from vmsched_services.tools.bench.suite import render_suite


def render(result: dict[str, Any]) -> str:
    """The figures as a human reads them: the floors first, then decisions per size and policy."""
    if "batches" in result:
        return _batches(result["batches"])
    if "suite" in result:
        return render_suite(result["suite"])
    hop, lock = result["hop"], result["lock"]
    lines = [
        f"vmsched bench ({result['when']}, {result['machine']['cpus']} CPUs, policy {result['policy']})",
        f"floors: one bus hop (RPC to an empty handler) p50 {hop['p50_ms']} ms, p99 {hop['p99_ms']} ms; "
        f"Redis lock take + release p50 {lock['p50_ms']} ms",
        "HA reservation check: " + ", ".join(f"{k} {v}" for k, v in result["ha_check"].items()),
        _balance_line(result["balance_pass"]),
        "",
        f"{'hosts':>6}  {'policy, mode':<56}{'p50 ms':>9}{'p99 ms':>9}{'decisions/s':>13}",
    ]
    for n, r in result["sizes"].items():
        for name in policies():
            lines += _decision_rows(n, name, r[name])
    lines.append("")
    lines.append(f"{'hosts':>6}  {'message':<46}{'bytes':>9}{'encode us':>11}{'decode us':>11}")
    for n, r in result["sizes"].items():
        for name, c in r["codec"].items():
            lines.append(f"{n:>6}  {name:<46}{c['bytes']:>9}{c['encode_us']:>11}{c['decode_us']:>11}")
    return "\n".join(lines)


def _balance_line(b: dict[str, Any]) -> str:
    units = ", ".join(f"{name} {u['ms']} ({u['no_fit_ms']})" for name, u in b["units"].items())
    return (
        f"balance pass, {b['hosts']} hosts / {b['vms']} VMs, table + unit ms (nothing fits): {units};"
        f" table alone {b['table_ms']} ms"
    )


def _decision_rows(n: str, name: str, p: dict[str, Any]) -> list[str]:
    runs = [("in process, no bus", p["in_process"])]
    runs += [(f"bus, {k}", v) for k, v in p["bus"].items() if k not in ("logs", "rss_mb")]
    lines = []
    for label, s in runs:
        text = f"{name} ({p['units']} units) {label}"
        lines.append(f"{n:>6}  {text:<56}{s['p50_ms']:>9}{s['p99_ms']:>9}{s['decisions_per_s']:>13}")
        if "cpu_ms_per_decision" in s:
            cpu = s["cpu_ms_per_decision"]
            parts = ", ".join(f"{k} {v}" for k, v in cpu.items())
            lines.append(f"{'':>8}CPU ms per decision: {parts}; total {round(sum(cpu.values()), 2)}")
    rss = ", ".join(f"{k} {v:.0f}" for k, v in p["bus"]["rss_mb"].items() if v is not None)
    lines.append(f"{'':>6}  bus / in process (sequential p50): {p['bus_over_in_process']}x;  RSS MB: {rss}")
    return lines


def _batches(b: dict[str, Any]) -> str:
    alone, during = b["other_cluster_alone"], b["other_cluster_during_batches"]
    ended = ", ".join(f"{r['ended']} in {r['seconds']} s" for r in b["batch_results"])
    return "\n".join(
        [
            f"one batch placed in process, CPU s by VMs: {b['cpu_s']}",
            f"{b['batches']} batches of {b['batch_size']} VMs on {b['hosts']} hosts: {ended}",
            f"another cluster alone: p50 {alone['p50_ms']} ms, p99 {alone['p99_ms']} ms, max {alone['max_ms']} ms",
            f"another cluster during the batches ({during['decisions']} requests): p50 {during['p50_ms']} ms, "
            f"p99 {during['p99_ms']} ms, max {during['max_ms']} ms; not placed: {len(b['other_cluster_not_placed'])}",
        ]
    )


__all__ = ["render"]
