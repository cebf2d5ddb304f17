// The simulation page: two policies on one generated workload, the report side by side and the
// time series as inline SVG plots (svgplot.js).
"use strict";

(function () {
  const { el, clear, api, num } = vm;
  const start = vm.initial();

  // The API's answer as [{name, report}], whether a list, {reports: [...]} or {policies: {name: report}}.
  function reportsOf(resp) {
    const list = Array.isArray(resp) ? resp : Array.isArray(resp && resp.reports) ? resp.reports : Array.isArray(resp && resp.policies) ? resp.policies : null;
    if (list) return list.map((r, i) => ({ name: r.policy || r.name || "policy " + (i + 1), report: r }));
    const keyed = resp && resp.policies && !Array.isArray(resp.policies) ? resp.policies : resp || {};
    return Object.entries(keyed).filter(([, r]) => r && typeof r === "object").map(([name, report]) => ({ name, report }));
  }

  //: The samples worth a plot, in this order, when the report has them (a sample has more).
  const PLOTTED = ["vms", "hosts_used", "ffd_hosts", "hosts_on", "cpu_mean_in_use", "mem_mean_in_use", "cpu_spread", "mem_spread", "vm_count_spread"];

  function drawTargets(targets, names) {
    const box = clear(document.getElementById("targets"));
    if (!targets || !targets.length) return;
    const byTarget = new Map();
    for (const v of targets) {
      const row = byTarget.get(v.target) || { limit: v.limit, how: v.how, by: {} };
      row.by[v.policy] = v;
      byTarget.set(v.target, row);
    }
    const head = el("tr", {}, el("th", { scope: "col" }, "Target"), el("th", { scope: "col" }, "Limit"), names.map((n) => el("th", { scope: "col" }, n)));
    const body = el("tbody");
    for (const [target, row] of byTarget) {
      body.appendChild(el("tr", {}, el("th", { scope: "row", title: row.how || "" }, target.replace(/_/g, " ")), el("td", { class: "num" }, num(row.limit)),
        names.map((n) => { const v = row.by[n]; return v ? el("td", { class: "num " + (v.met ? "ok" : "bad") }, num(v.value) + (v.met ? " ✓ met" : " ✗ missed")) : el("td", {}, ""); })));
    }
    box.append(el("h3", {}, "Targets (met when the value is at most the limit)"), el("table", { class: "data" }, el("thead", {}, head), body));
  }

  // Scalar figures of a report (its own, its summary's, its targets'), as [label, value].
  function figures(report) {
    const out = new Map();
    const take = (obj, prefix) => {
      for (const [k, v] of Object.entries(obj || {})) {
        if (v === null || ["string", "number", "boolean"].includes(typeof v)) { if (!["policy", "name"].includes(k)) out.set(prefix + k, v); }
        else if (!Array.isArray(v) && typeof v === "object" && ["summary", "summaries", "targets", "counts", "timing"].includes(k)) take(v, k === "summary" || k === "summaries" ? "" : k + ".");
      }
    };
    take(report, "");
    return out;
  }

  // Time series of a report as {metric: [[t, v], ...]}: {t|at_s|times: [...], metric: [...]},
  // a list of samples [{at_s, metric, ...}], or {metric: [[t, v], ...]}.
  function seriesOf(report) {
    const raw = report.series || report.time_series || report.timeseries || report.samples || null;
    const out = {};
    if (!raw) return out;
    if (Array.isArray(raw)) {
      for (const sample of raw) {
        const t = sample.at_s ?? sample.t ?? sample.time_s;
        for (const [k, v] of Object.entries(sample)) if (typeof v === "number" && !["at_s", "t", "time_s"].includes(k)) (out[k] = out[k] || []).push([t, v]);
      }
      return out;
    }
    const t = raw.t || raw.at_s || raw.times || raw.time_s || null;
    for (const [k, v] of Object.entries(raw)) {
      if (!Array.isArray(v) || v === t) continue;
      if (Array.isArray(v[0])) out[k] = v;
      else if (t && v.length && typeof v[0] === "number") out[k] = v.map((y, i) => [t[i], y]);
    }
    return out;
  }

  function drawReport(resp, names) {
    const reports = reportsOf(resp);
    const head = clear(document.querySelector("#summary thead"));
    const body = clear(document.querySelector("#summary tbody"));
    head.appendChild(el("tr", {}, el("th", { scope: "col" }, "Measure"), reports.map((r) => el("th", { scope: "col" }, r.name))));
    const figs = reports.map((r) => figures(r.report));
    const keys = [...new Set(figs.flatMap((f) => [...f.keys()]))];
    for (const k of keys) {
      body.appendChild(el("tr", {}, el("th", { scope: "row" }, k.replace(/_/g, " ")),
        figs.map((f) => el("td", { class: typeof f.get(k) === "number" ? "num" : "" }, f.has(k) ? (typeof f.get(k) === "number" ? num(f.get(k)) : String(f.get(k))) : ""))));
    }
    const plots = clear(document.getElementById("plots"));
    const series = reports.map((r) => seriesOf(r.report));
    const found = [...new Set(series.flatMap((s) => Object.keys(s)))];
    const wanted = PLOTTED.filter((m) => found.includes(m));
    const metrics = wanted.length ? wanted : found;
    for (const m of metrics) {
      const lines = reports.map((r, i) => ({ name: r.name, points: (series[i][m] || []).map(([t, v]) => [t / 3600, v]) }));
      plots.appendChild(window.linePlot(m.replace(/_/g, " "), lines, "hours"));
    }
    if (!metrics.length) plots.appendChild(el("p", { class: "muted" }, "The report has no time series to plot."));
    document.getElementById("report").hidden = false;
    document.getElementById("rep-h").textContent = "Report: " + names.join(" vs ");
  }

  document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
    const policies = vm.list(start.data && start.data.policies ? start.data.policies : await api("GET", "/schedulingpolicies"), "policies");
    const a = document.getElementById("policy-a"), b = document.getElementById("policy-b");
    policies.forEach((p, i) => {
      a.appendChild(el("option", { value: p.name, selected: i === 0 }, p.name));
      b.appendChild(el("option", { value: p.name, selected: i === 1 }, p.name));
    });
    document.getElementById("simulate").addEventListener("submit", vm.guarded(async (e) => {
      e.preventDefault();
      vm.clearBanner();
      const names = [a.value, b.value];
      const status = document.getElementById("sim-status");
      const button = document.querySelector("#simulate button[type=submit]");
      button.disabled = true;
      status.textContent = "Simulating " + names.join(" and ") + "…";
      try {
        const resp = await api("POST", "/simulations", {
          hosts: Number(document.getElementById("hosts").value), vms: Number(document.getElementById("vms").value),
          hours: Number(document.getElementById("hours").value), seed: Number(document.getElementById("seed").value || 0), policies: names,
        });
        drawReport(resp, names);
        drawTargets(resp && resp.targets, names);
        status.textContent = "Done.";
      } catch (err) {
        status.textContent = "";
        throw err;
      } finally {
        button.disabled = false;
      }
    }));
  }));
  window.simulationParts = { reportsOf, figures, seriesOf };
})();
