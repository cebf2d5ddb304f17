"""The fault suite's results as a table for a terminal (`vmsched chaos`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One block per experiment: verdict and time, then one row per threshold (figure, bound, value)."""
    lines = [f"{'experiment':<15} {'verdict':<8} {'figure':<28} {'want':>12} {'got':>12}", "-" * 79]
    for r in results:
        verdict = "PASS" if r.get("passed") else "FAIL"
        if "error" in r:
            lines.append(f"{r['experiment']:<15} {verdict:<8} could not run: {r['error']}"[:200])
            continue
        first = True
        for ch in r["checks"]:
            head = f"{r['experiment']:<15} {verdict:<8}" if first else " " * 24
            mark = "" if ch["passed"] else "  <-"
            want = f"{ch['op']} {_num(ch['bound'])}"
            lines.append(f"{head} {ch['figure']:<28} {want:>12} {_num(ch['value']):>12}{mark}")
            first = False
        notes = "; ".join(r.get("notes", [])[:2])[:160]
        lines.append(f"{'':<24} ({r['elapsed_s']} s{': ' + notes if notes else ''})")
    return "\n".join(lines)


def _num(v: float) -> str:
    return f"{v:g}"
