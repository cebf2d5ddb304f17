// The cluster page: hosts as a heat map (CPU, memory or VMs), the pending resources, HA status and
// the latest decisions, kept live by the API's event stream (EventSource) and a slow poll of the
// state (host reports do not come as events).
"use strict";

(function () {
  const { el, clear, api, num } = vm;
  const start = vm.initial();
  const clusterId = start.params.cluster_id;
  const base = "/clusters/" + encodeURIComponent(clusterId);
  const STATE_POLL_MS = 10000;
  const MAX_DECISIONS = 25;
  let state = null;

  function memUsedPct(r) {
    return r.physical_mem_mb > 0 ? (100 * (r.physical_mem_mb - r.mem_free_mb)) / r.physical_mem_mb : 0;
  }

  // 0 → green, 1 → red, through yellow; text stays dark on light cells and light on dark ones.
  function colour(fraction) {
    const f = Math.max(0, Math.min(1, fraction));
    return "hsl(" + Math.round(120 * (1 - f)) + ", 65%, " + Math.round(42 + 10 * (1 - Math.abs(f - 0.5) * 2)) + "%)";
  }

  function drawHeatmap() {
    const box = clear(document.getElementById("heatmap"));
    if (!state) return;
    const metric = document.getElementById("metric").value;
    const hosts = (state.hosts || []).slice().sort((a, b) => a.report.host_id.localeCompare(b.report.host_id, undefined, { numeric: true }));
    const maxVms = Math.max(1, ...hosts.map((h) => h.vm_count || 0));
    if (!hosts.length) box.appendChild(el("p", { class: "muted" }, "No host has reported in this cluster."));
    for (const h of hosts) {
      const r = h.report;
      const cpu = r.cpu_usage_pct || 0;
      const mem = memUsedPct(r);
      const vms = h.vm_count || 0;
      const value = metric === "cpu" ? cpu / 100 : metric === "mem" ? mem / 100 : vms / maxVms;
      const shown = metric === "cpu" ? num(cpu, 0) + "%" : metric === "mem" ? num(mem, 0) + "%" : vms + " VMs";
      const up = r.status === "up";
      const label = r.host_id + ": " + r.status + ", CPU " + num(cpu, 0) + "%, memory " + num(mem, 0) + "% used (" +
        num(r.mem_free_mb) + " of " + num(r.physical_mem_mb) + " MB free), " + vms + " VMs";
      const cell = el("div", { role: "listitem", class: "cell" + (up ? "" : " down"), tabindex: 0, title: label, "aria-label": label, "data-host": r.host_id },
        el("span", { class: "cell-host" }, r.host_id),
        el("span", { class: "cell-value" }, up ? shown : r.status));
      if (up) cell.style.backgroundColor = colour(value);
      box.appendChild(cell);
    }
  }

  function drawPending() {
    const body = clear(document.querySelector("#pending tbody"));
    const rows = [];
    for (const p of (state && state.pending) || []) rows.push(p);
    for (const h of (state && state.hosts) || []) for (const p of h.pending || []) rows.push(Object.assign({ host_id: h.report.host_id }, p));
    const listed = state && (state.pending !== undefined || (state.hosts || []).some((h) => h.pending !== undefined));
    if (!rows.length) {
      body.appendChild(el("tr", {}, el("td", { colspan: 5, class: "muted" }, listed
        ? "None: every placement has been reported running (or has expired)."
        : "This API's cluster state does not list pending records; the latest decisions (right) show recent placements.")));
      return;
    }
    for (const p of rows) {
      const expires = typeof p.expires_at === "number" ? new Date(p.expires_at * 1000).toLocaleTimeString() : vm.when(p.expires_at);
      body.appendChild(el("tr", {}, el("td", {}, p.host_id || ""), el("td", {}, p.vm_id || ""), el("td", {}, num(p.mem_mb)), el("td", {}, num(p.vcpus)), el("td", {}, expires)));
    }
  }

  function drawSummary() {
    const hosts = (state && state.hosts) || [];
    const up = hosts.filter((h) => h.report.status === "up").length;
    const vms = hosts.reduce((n, h) => n + (h.vm_count || 0), 0);
    const policy = state && state.policy ? " Policy: " + (state.policy.name || state.policy) + "." : "";
    document.getElementById("cluster-summary").textContent =
      hosts.length + " hosts (" + up + " up), " + vms + " VMs, state version " + (state ? state.version : "?") + "." + policy;
  }

  function drawHa(report) {
    const p = clear(document.getElementById("ha"));
    p.className = "";
    if (!report) { p.textContent = "Unknown."; return; }
    if (!report.enabled) {
      p.className = "muted";
      p.textContent = "HA reservation is off for this cluster (" + num(report.ha_vms) + " highly available VMs).";
    } else if (report.ok) {
      p.className = "ok";
      p.textContent = "OK: the HA VMs of any one failed host could restart elsewhere (" + num(report.hosts) + " hosts, " + num(report.ha_vms) + " HA VMs).";
    } else {
      p.className = "bad";
      p.textContent = "At risk: if one of " + (report.failing_hosts || []).join(", ") + " failed, its HA VMs could not all restart elsewhere.";
    }
    if (report.checked_at) p.appendChild(el("span", { class: "small block" }, "Checked " + vm.when(report.checked_at)));
  }

  function decisionItem(d) {
    const where = d.status === "placed" ? "→ " + (d.host_id || "?") : d.status;
    const href = "/console/clusters/" + encodeURIComponent(d.cluster_id || clusterId) + "/decisions/" + encodeURIComponent(d.request_id);
    return el("li", { class: "decision " + d.status, "data-request": d.request_id },
      el("a", { href }, el("strong", {}, d.vm_id), " ", where),
      el("span", { class: "small block" }, vm.when(d.decided_at) + (d.policy ? " · " + d.policy + (d.policy_version ? " v" + d.policy_version : "") : "")),
      el("span", { class: "small block muted" }, (d.explanation && d.explanation.summary) || ""));
  }

  function drawDecisions(decisions) {
    const list = clear(document.getElementById("decisions"));
    if (!decisions.length) list.appendChild(el("li", { class: "muted empty" }, "No decision yet."));
    for (const d of decisions.slice(0, MAX_DECISIONS)) list.appendChild(decisionItem(d));
  }

  function addDecision(d) {
    const list = document.getElementById("decisions");
    const empty = list.querySelector(".empty");
    if (empty) empty.remove();
    if (list.querySelector('[data-request="' + CSS.escape(String(d.request_id)) + '"]')) return;
    const item = decisionItem(d);
    item.classList.add("fresh");
    list.insertBefore(item, list.firstChild);
    while (list.children.length > MAX_DECISIONS) list.removeChild(list.lastChild);
  }

  const refreshState = vm.debounce(vm.guarded(async () => {
    state = await api("GET", base);
    drawSummary(); drawHeatmap(); drawPending();
  }), 300);
  const refreshHa = vm.guarded(async () => drawHa(await api("GET", base + "/ha")));

  function listen() {
    const live = document.getElementById("live");
    const source = new EventSource("/api/v1/events?cluster=" + encodeURIComponent(clusterId));
    source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
    source.addEventListener("error", () => {
      live.textContent = source.readyState === EventSource.CLOSED ? "not live (reload the page)" : "reconnecting…";
      live.className = "live off";
      // A stream refused for an expired session closes: check the session, which goes to the login page if so.
      if (source.readyState === EventSource.CLOSED) vm.guarded(() => api("GET", "/whoami"))();
    });
    source.addEventListener("decision", (e) => {
      const d = JSON.parse(e.data);
      if (d.cluster_id && d.cluster_id !== clusterId) return;
      addDecision(d);
      refreshState();
    });
    for (const kind of ["migration", "power"]) {
      source.addEventListener(kind, (e) => {
        const m = JSON.parse(e.data);
        vm.notice(kind === "migration" ? "Migration: " + (m.vm_id || "") + " " + (m.source_host || "") + " → " + (m.target_host || m.host_id || "") : "Power advice: " + (m.summary || m.action || ""));
        refreshState();
      });
    }
    source.addEventListener("maintenance", (e) => {
      const plan = JSON.parse(e.data);
      const moves = (plan.steps || []).reduce((n, step) => n + step.length, 0);
      vm.notice(plan.refused && plan.refused.length
        ? "Maintenance of " + plan.host_id + " refused: " + plan.refused.map((r) => r.vm_id + ": " + r.reason).join("; ")
        : "Maintenance of " + plan.host_id + ": " + moves + " VMs to move in " + (plan.steps || []).length + " steps");
      refreshState();
    });
    for (const kind of ["ha-alert", "ha-recovered"]) {
      source.addEventListener(kind, (e) => {
        const m = JSON.parse(e.data);
        vm.notice(m.message || kind);
        refreshHa();
      });
    }
    window.addEventListener("pagehide", () => source.close());
  }

  document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
    document.getElementById("metric").addEventListener("change", drawHeatmap);
    const data = start.data || {};
    listen();
    const [st, ha, decisions] = await Promise.all([
      data.state ? Promise.resolve(data.state) : api("GET", base).catch((e) => { vm.banner(e); return null; }),
      data.ha ? Promise.resolve(data.ha) : api("GET", base + "/ha").catch(() => null),
      data.decisions ? Promise.resolve(data.decisions) : api("GET", base + "/decisions?limit=" + MAX_DECISIONS).catch((e) => { vm.banner(e); return []; }),
    ]);
    state = st;
    drawSummary(); drawHeatmap(); drawPending(); drawHa(ha);
    const listed = vm.list(decisions, "decisions");
    // Decisions that arrived on the stream while the page was loading stay on top.
    const seen = new Set(Array.from(document.querySelectorAll("#decisions [data-request]")).map((n) => n.dataset.request));
    if (!seen.size) drawDecisions(listed);
    else for (const d of listed.slice().reverse()) if (!seen.has(String(d.request_id))) document.getElementById("decisions").appendChild(decisionItem(d));
    setInterval(refreshState, STATE_POLL_MS);
  }));
})();
