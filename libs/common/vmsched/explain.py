"""Decisions rendered for a human: the aggregate line, why each host was removed, the score table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from vmsched.contracts import (
    FilteredHost,
    HaAlert,
    HaRecovered,
    MaintenancePlan,
    Message,
    MigrationDecision,
    PowerAction,
    ScheduleDecision,
    ScoreTable,
)


def render_decision(d: ScheduleDecision, *, max_hosts: int = 12, max_removed: int = 20) -> str:
    lines = [f"request {d.request_id}  cluster {d.cluster_id}  vm {d.vm_id}  policy {d.policy or '-'}"]
    if d.status.value == "placed":
        alt = f"  (alternates: {', '.join(d.alternates)})" if d.alternates else ""
        lines.append(f"PLACED on {d.host_id}{alt}")
    else:
        lines.append(d.status.value.upper() + (f": {d.error.code}: {d.error.message}" if d.error else ""))
    lines.append(d.explanation.summary)
    if d.explanation.filtered:
        lines.append("removed:")
        for f in d.explanation.filtered[:max_removed]:
            lines.append(f"  {f.host_id:<24} {f.filter:<14} {f.reason}")
        if len(d.explanation.filtered) > max_removed:
            lines.append(f"  ... and {len(d.explanation.filtered) - max_removed} more")
    table = d.explanation.scores
    if table is not None and table.units:
        hosts = table.hosts[:max_hosts]
        width = max([12, *(len(h) for h in hosts)])
        lines.append(f"scores ({table.selector}; raw weight / points, best host first):")
        lines.append(f"  {'unit':<36}{'factor':>7}  " + "".join(f"{h:>{width + 2}}" for h in hosts))
        for u in table.units:
            cells = "".join(f"{f'{r:.4g}/{p:g}':>{width + 2}}" for r, p in zip(u.raw, u.points, strict=False))
            lines.append(f"  {u.unit:<36}{u.factor:>7g}  {cells}")
        lines.append(f"  {'total':<36}{'':>7}  " + "".join(f"{t:>{width + 2}g}" for t in table.totals[:max_hosts]))
        if len(table.hosts) > max_hosts:
            lines.append(f"  ... {len(table.hosts) - max_hosts} more hosts")
    lines.append(f"decided in {d.elapsed_ms:.1f} ms at state version {d.state_version}")
    return "\n".join(lines)


def _filter_rows(
    filters: Sequence[str],
    shown: Sequence[str],
    removed_by: Mapping[str, FilteredHost],
    notes: list[str],
    label_w: int,
    cell: Callable[[str], str],
) -> list[str]:
    """A row per filter: kept, removed (footnoted in `notes`), or · when an earlier filter removed it."""
    lines = ["filters"] if filters else []
    order = {name: i for i, name in enumerate(filters)}
    for i, name in enumerate(filters):
        row = []
        for h in shown:
            f = removed_by.get(h)
            if f is None:
                row.append(cell("kept"))
            elif f.filter == name:
                notes.append(f"[{len(notes) + 1}] {h}: {f.filter}: {f.reason}")
                row.append(cell(f"removed [{len(notes)}]"))
            elif order.get(f.filter, len(order)) < i:
                row.append(cell("·"))
            else:
                row.append(cell("kept"))
        lines.append(f"  {name:<{label_w - 2}}{'':>7}" + "".join(row))
    return lines


def _weight_rows(table: ScoreTable, shown: Sequence[str], label_w: int, cell: Callable[[str], str]) -> list[str]:
    """A row per weight unit (raw weight / points, factor), then the totals."""
    points = "rank points" if table.selector == "RankSelector" else "normalized"
    lines = [f"weights ({table.selector}: raw / {points})"]
    position = {h: i for i, h in enumerate(table.hosts)}
    for u in table.units:
        row = [
            cell(f"{u.raw[position[h]]:.4g} / {u.points[position[h]]:.3g}") if h in position else cell("")
            for h in shown
        ]
        lines.append(f"  {u.unit:<{label_w - 2}}{u.factor:>7g}" + "".join(row))
    totals = [cell(f"{table.totals[position[h]]:.4g}") if h in position else cell("") for h in shown]
    lines.append(f"  {'total':<{label_w - 2}}{'':>7}" + "".join(totals))
    return lines


def render_table(d: ScheduleDecision, *, max_hosts: int = 8, width: int = 16) -> str:
    """`vmsched explain`: hosts as columns; a row per filter (kept, removed, or already gone) and per
    weight unit (raw weight / points, factor); then the totals. Removal reasons are footnoted below.

    Columns: the ranked survivors best first, then the removed hosts in the order they went;
    `max_hosts=0` shows every host.
    """
    e = d.explanation
    ranked = list(e.scores.hosts) if e.scores is not None else ([d.host_id] if d.host_id else [])
    removed_by = {f.host_id: f for f in e.filtered}
    hosts = ranked + [f.host_id for f in e.filtered if f.host_id not in ranked]
    shown = hosts if max_hosts <= 0 else hosts[:max_hosts]
    label_w = max(
        [20, *(len(n) + 2 for n in e.filters), *(len(u.unit) + 2 for u in (e.scores.units if e.scores else []))]
    )

    def cell(text: str) -> str:
        return f"{text[: width - 1]:>{width}}"

    outcome = f"PLACED on {d.host_id}" if d.host_id else d.status.value.upper()
    lines = [f"request {d.request_id}  cluster {d.cluster_id}  vm {d.vm_id}  policy {d.policy or '-'}: {outcome}"]
    lines += [e.summary, ""]
    lines.append(f"{'':<{label_w}}{'factor':>7}" + "".join(cell(h) for h in shown))
    notes: list[str] = []
    lines += _filter_rows(e.filters, shown, removed_by, notes, label_w, cell)
    if e.scores is not None and e.scores.units:
        lines += _weight_rows(e.scores, shown, label_w, cell)
    elif e.scores is None and d.status.value == "placed":
        lines.append("(no score table: the request did not ask for one; `vmsched schedule --scores` does)")
    if len(shown) < len(hosts):
        lines.append(f"({len(hosts) - len(shown)} more hosts not shown; --hosts 0 shows all)")
    if notes:
        lines.append("")
        lines.extend(notes)
    if d.placements and len(d.placements) > 1:
        lines.append("")
        lines.append("placements:")
        lines.extend(f"  {p.vm_id} -> {p.host_id}  ({p.summary})" for p in d.placements)
    return "\n".join(lines)


def render_event(event: Message) -> str:
    """One line per event for `vmsched watch`."""
    when = datetime.now(UTC).strftime("%H:%M:%S")
    if isinstance(event, ScheduleDecision):
        where = f"-> {event.host_id}" if event.host_id else event.status.value
        return f"{when} decision   {event.cluster_id} {event.vm_id} {where}  ({event.explanation.summary})"
    if isinstance(event, MigrationDecision):
        return (
            f"{when} migration  {event.cluster_id} {event.vm_id} {event.source_host} -> {event.target_host}"
            f"  [{event.balance_unit}] {event.reason}"
        )
    if isinstance(event, PowerAction):
        return f"{when} power      {event.cluster_id} {event.action.value} {event.host_id}  {event.reason}"
    if isinstance(event, HaAlert):
        return f"{when} HA ALERT   {event.cluster_id} {', '.join(event.failing_hosts)}: {event.message}"
    if isinstance(event, HaRecovered):
        return f"{when} HA ok      {event.cluster_id}: {event.message}"
    if isinstance(event, MaintenancePlan):
        if event.refused:
            why = "; ".join(f"{r.vm_id}: {r.reason}" for r in event.refused)
            return f"{when} maintenance {event.cluster_id} {event.host_id} REFUSED: {why}"
        moves = sum(len(step) for step in event.steps)
        return f"{when} maintenance {event.cluster_id} {event.host_id}: {moves} VMs in {len(event.steps)} steps"
    return f"{when} {type(event).__name__} {event.model_dump_json()}"
