// The explanation table of a decision (or a what-if): one row per host with its verdict (chosen,
// filtered by <filter>: reason, scored), each weight unit's raw weight and points, and the total.
// Sortable by its column headers (buttons, so the keyboard works), filtered by a text box, and a
// "why not this host?" box that highlights the host's row and answers in a sentence.
"use strict";

(function () {
  const { el, clear, num } = vm;

  // Rows from a decision: ranked hosts (the score table, best first), then the removed ones.
  function rowsOf(d) {
    const e = d.explanation || {};
    const table = e.scores || null;
    const rows = [];
    const seen = new Set();
    if (table) {
      table.hosts.forEach((host, i) => {
        const chosen = host === d.host_id;
        rows.push({
          host, kind: chosen ? "chosen" : "scored", rank: i + 1,
          verdict: chosen ? "chosen" : "scored (rank " + (i + 1) + " of " + table.hosts.length + ")",
          raw: table.units.map((u) => u.raw[i]), points: table.units.map((u) => u.points[i]),
          total: table.totals[i],
        });
        seen.add(host);
      });
    } else if (d.host_id) {
      rows.push({ host: d.host_id, kind: "chosen", rank: 1, verdict: "chosen", raw: [], points: [], total: null });
      seen.add(d.host_id);
      (d.alternates || []).forEach((host, i) => {
        if (seen.has(host)) return;
        rows.push({ host, kind: "scored", rank: i + 2, verdict: "alternate (rank " + (i + 2) + ")", raw: [], points: [], total: null });
        seen.add(host);
      });
    }
    for (const f of e.filtered || []) {
      if (seen.has(f.host_id)) continue;
      rows.push({ host: f.host_id, kind: "filtered", rank: null, verdict: "filtered by " + f.filter + ": " + f.reason, filter: f.filter, reason: f.reason, raw: [], points: [], total: null });
      seen.add(f.host_id);
    }
    // A what-if lists every host of the cluster: those that were no candidate (down, not reported) too.
    for (const h of d.hosts || []) {
      if (seen.has(h.host_id)) continue;
      const verdict = h.filter ? "filtered by " + h.filter + ": " + (h.reason || "") : "not a candidate" + (h.reason ? ": " + h.reason : "");
      rows.push({ host: h.host_id, kind: "filtered", rank: null, verdict, filter: h.filter || "", reason: h.reason || "not a candidate", raw: [], points: [], total: null });
      seen.add(h.host_id);
    }
    return rows;
  }

  function compare(a, b) {
    const na = typeof a === "number", nb = typeof b === "number";
    if (a === null || a === undefined) return 1;
    if (b === null || b === undefined) return -1;
    if (na && nb) return a - b;
    return String(a).localeCompare(String(b), undefined, { numeric: true });
  }

  // A sentence for "why not `host`?".
  function whyNot(d, rows, host) {
    const row = rows.find((r) => r.host === host);
    const e = d.explanation || {};
    if (!row) {
      const partial = !e.scores;
      return host + " is not in this decision. " + (partial
        ? "This decision recorded only the chosen host and the removed hosts it was asked to keep (explain_scores / explain_hosts were off): run a What-if on the cluster to see every host."
        : "It was not a candidate: it had not reported, was not up, or belongs to another cluster.");
    }
    if (row.kind === "chosen") {
      const others = rows.filter((r) => r.kind === "scored").length;
      return host + " was chosen" + (row.total !== null ? ", with the best total (" + num(row.total) + " points)" : "") +
        (others ? ", ahead of " + others + " other host" + (others > 1 ? "s" : "") + " that passed every filter." : ".");
    }
    if (row.kind === "filtered") {
      const order = e.filters || [];
      const at = order.indexOf(row.filter);
      if (!row.filter) return host + " was not a candidate: " + row.reason + ".";
      return host + " was removed by the " + row.filter + " filter" + (at >= 0 ? " (filter " + (at + 1) + " of " + order.length + ")" : "") +
        ": " + row.reason + ". A removed host is not weighed, so it could not be chosen.";
    }
    const best = rows.find((r) => r.kind === "chosen");
    let sentence = host + " passed every filter but ranked " + row.rank + (e.scores ? " of " + e.scores.hosts.length : "");
    if (best && row.total !== null && best.total !== null) {
      sentence += ": it totalled " + num(row.total) + " points against " + num(best.total) + " for " + best.host + ", which was chosen.";
      const units = (e.scores && e.scores.units) || [];
      const higherBetter = e.scores.totals.length < 2 || e.scores.totals[0] >= e.scores.totals[e.scores.totals.length - 1];
      const gaps = units.map((u, i) => ({ unit: u.unit, gap: (higherBetter ? 1 : -1) * u.factor * (best.points[i] - row.points[i]) }))
        .filter((g) => g.gap > 0).sort((a, b) => b.gap - a.gap).slice(0, 3);
      if (gaps.length) sentence += " It lost most on " + gaps.map((g) => g.unit + " (" + num(g.gap) + " weighted points)").join(", ") + ".";
    } else if (best) {
      sentence += "; " + best.host + " was chosen ahead of it (the scores were not recorded for this decision).";
    }
    return sentence;
  }

  // Draw the table into `container`; returns {whyNot(host)} for tests and links.
  function decisionTable(container, d) {
    clear(container);
    const rows = rowsOf(d);
    const units = ((d.explanation || {}).scores || { units: [] }).units;
    const columns = [
      { key: "host", label: "Host", get: (r) => r.host },
      { key: "verdict", label: "Verdict", get: (r) => (r.kind === "chosen" ? 0 : r.kind === "scored" ? r.rank : 1e9) + "|" + r.verdict, show: (r) => r.verdict },
    ];
    // One column per weight unit: "raw → points" (the CLI's raw / points), sorted by points.
    units.forEach((u, i) => {
      columns.push({
        key: "unit" + i, label: u.unit + " ×" + num(u.factor), unit: true,
        title: u.unit + ": raw weight (the unit's own scale) → points after the selector; factor " + num(u.factor) + ". Sorts by points.",
        get: (r) => r.points[i], show: (r) => (r.raw[i] === undefined ? "" : num(r.raw[i], 3) + " → " + num(r.points[i], 3)), numeric: true,
      });
    });
    columns.push({ key: "total", label: "Total", get: (r) => r.total, show: (r) => num(r.total, 3), numeric: true });

    const filterBox = el("input", { id: "table-filter", type: "search", placeholder: "host, filter, reason…" });
    const whyBox = el("input", { id: "why-host", list: "host-ids", placeholder: "host id", autocomplete: "off" });
    const answer = el("p", { id: "why-answer", class: "why-answer", role: "status", "aria-live": "polite" });
    const datalist = el("datalist", { id: "host-ids" }, rows.map((r) => el("option", { value: r.host })));
    const whyForm = el("form", { class: "why inline", id: "why-form" },
      el("label", { for: "why-host" }, "Why not host"), whyBox, datalist, el("button", { type: "submit" }, "Explain"));
    const tools = el("div", { class: "toolbar" }, el("label", { for: "table-filter" }, "Filter rows"), filterBox, whyForm);
    const head = el("tr");
    const tbody = el("tbody");
    const table = el("table", { class: "data explain", id: "explain-table" },
      el("caption", {}, (d.explanation && d.explanation.summary) || ""), el("thead", {}, head), tbody);
    const count = el("p", { class: "small", id: "row-count" });
    const scroller = el("div", { class: "scroll" }, table);
    container.append(tools, answer, scroller, count);
    if (!units.length) {
      container.appendChild(el("p", { class: "small muted" }, d.explanation && !d.explanation.scores
        ? "The weight units' scores were not recorded for this decision (the request did not ask explain_scores). A What-if on the cluster shows them for every host."
        : ""));
    }

    let sortKey = null, sortDir = 1, highlighted = null;
    columns.forEach((c) => {
      const button = el("button", { type: "button", class: "sort", title: c.title || "Sort by " + c.label }, c.label);
      const th = el("th", { scope: "col", "aria-sort": "none", class: (c.numeric ? "num" : "") + (c.unit ? " unit-col" : "") + " col-" + c.key }, button);
      button.addEventListener("click", () => {
        sortDir = sortKey === c.key ? -sortDir : 1;
        sortKey = c.key;
        head.querySelectorAll("th").forEach((t) => t.setAttribute("aria-sort", "none"));
        th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
        draw();
      });
      head.appendChild(th);
    });

    function draw() {
      const needle = filterBox.value.trim().toLowerCase();
      let shown = rows.filter((r) => !needle || columns.some((c) => String((c.show || c.get)(r) ?? "").toLowerCase().includes(needle)));
      if (sortKey) {
        const c = columns.find((x) => x.key === sortKey);
        shown = shown.slice().sort((a, b) => sortDir * compare(c.get(a), c.get(b)));
      }
      clear(tbody);
      for (const r of shown) {
        const tr = el("tr", { class: "row-" + r.kind + (r.host === highlighted ? " highlight" : ""), "data-host": r.host, tabindex: -1 });
        columns.forEach((c, i) => {
          const text = String((c.show || c.get)(r) ?? "");
          tr.appendChild(i === 0 ? el("th", { scope: "row", class: "col-host" }, text) : el("td", { class: (c.numeric ? "num" : "") + " col-" + c.key }, text));
        });
        tbody.appendChild(tr);
      }
      count.textContent = shown.length + " of " + rows.length + " hosts shown.";
    }

    function explain(host) {
      tbody.querySelectorAll("tr.highlight").forEach((t) => t.classList.remove("highlight"));
      highlighted = host;
      answer.textContent = whyNot(d, rows, host);
      if (filterBox.value) { filterBox.value = ""; draw(); }
      const tr = tbody.querySelector('tr[data-host="' + CSS.escape(host) + '"]');
      if (tr) {
        tr.classList.add("highlight");
        tr.scrollIntoView({ block: "nearest" });
      }
    }

    filterBox.addEventListener("input", draw);
    whyForm.addEventListener("submit", (e) => { e.preventDefault(); const h = whyBox.value.trim(); if (h) explain(h); });
    draw();
    return { explain, rows };
  }

  // The head of a decision: outcome, policy, summary.
  function decisionHead(container, d) {
    clear(container);
    const outcome = d.status === "placed" ? "Placed on " + d.host_id : d.status === "unplaceable" ? "No host can run it" : d.status;
    container.append(
      el("p", { class: "outcome " + d.status }, el("strong", {}, outcome), d.vm_id ? " — VM " + d.vm_id : ""),
      el("dl", { class: "facts" },
        el("dt", {}, "Policy"), el("dd", {}, (d.policy || "(the default)") + (d.policy_version ? " version " + d.policy_version : "")),
        el("dt", {}, "Summary"), el("dd", {}, (d.explanation && d.explanation.summary) || ""),
        el("dt", {}, "Filters, in order"), el("dd", {}, ((d.explanation && d.explanation.filters) || []).join(" → ") || "none"),
        d.decided_at ? [el("dt", {}, "Decided"), el("dd", {}, vm.when(d.decided_at) + (d.elapsed_ms ? " in " + num(d.elapsed_ms, 1) + " ms" : ""))] : null,
        el("dt", {}, "State version"), el("dd", {}, String(d.state_version ?? "")),
        d.error ? [el("dt", {}, "Error"), el("dd", { class: "bad" }, d.error.code + ": " + d.error.message)] : null));
  }

  window.decisionTable = decisionTable;
  window.decisionHead = decisionHead;
  window.decisionWhyNot = whyNot;
})();
