// The simulation page: two policies on one generated workload, the report side by side and the
// time series as inline SVG plots (svgplot.js).
"use strict";

(function () {
  const { el, clear, api, num } = vm;
  const start = vm.initial();

  // The API's answer as [{name, report}], whether a list, {reports: [...]} or {policies: {name: report}}.
  function reportsOf(resp) {
    const list = Array.isArray(resp) ? resp : Array.isArray(resp && resp.reports) ? resp.reports : null;
    if (list) return list.map((r, i) => ({ name: r.policy || r.name || "policy " + (i + 1), report: r }));
    const keyed = resp && resp.policies && !Array.isArray(resp.policies) ? resp.policies : resp || {};
    return Object.entries(keyed).filter(([, r]) => r && typeof r === "object").map(([name, report]) => ({ name, report }));
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
    const metrics = [...new Set(series.flatMap((s) => Object.keys(s)))];
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
