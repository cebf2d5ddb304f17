// The policy editor page: the form (policy_form.js), validation as you type, the diff before
// apply, apply, history with rollback, attachment to clusters, and clone for locked built-ins.
"use strict";

(function () {
  const { el, clear, api } = vm;
  const start = vm.initial();
  const name = start.params.name;
  const path = "/schedulingpolicies/" + encodeURIComponent(name);
  let form = null;
  let policy = null;

  // "+ added", "- removed", "~ changed" (policy-admin's diff lines).
  function lineClass(line) {
    return { "+": "add", "-": "del", "~": "chg" }[line.charAt(0)] || "";
  }

  function diffLines(report) {
    // An ApplyReport {changes: [{kind, name, action, diff: [...], version}]}, or a bare diff.
    const out = [];
    const changes = report && Array.isArray(report.changes) ? report.changes : null;
    if (changes) {
      for (const c of changes) {
        out.push({ cls: "hunk", text: c.kind + " " + c.name + ": " + c.action + (c.version ? " (version " + c.version + ")" : "") });
        for (const line of c.diff || []) out.push({ cls: lineClass(line), text: line });
      }
    } else if (report && report.diff) {
      const lines = Array.isArray(report.diff) ? report.diff : String(report.diff).split("\n");
      for (const line of lines) out.push({ cls: lineClass(String(line)), text: String(line) });
    }
    return out;
  }

  function showDiff(report) {
    const pre = clear(document.getElementById("diff"));
    const lines = diffLines(report);
    const unchanged = !lines.length || (report.changes && report.changes.every((c) => c.action === "unchanged"));
    if (unchanged) pre.appendChild(el("span", { class: "muted" }, "No change: the policy as shown is the policy stored."));
    else for (const l of lines) pre.appendChild(el("span", { class: "line " + l.cls }, l.text + "\n"));
    document.getElementById("diff-box").hidden = false;
  }

  let validation = 0;
  const validate = vm.debounce(vm.guarded(async () => {
    const mine = ++validation;
    const status = document.getElementById("validity");
    status.className = "validity";
    status.textContent = "Checking…";
    const result = await api("POST", path + "/validate", form.value());
    if (mine !== validation) return; // a later edit's check is under way
    const errors = (result && result.errors) || [];
    form.showErrors(errors);
    status.className = "validity " + (result.valid ? "ok" : "bad");
    status.textContent = result.valid ? "Valid: the policy can be applied." : errors.length + " problem" + (errors.length > 1 ? "s" : "") + " to fix before it can be applied.";
  }), 350);

  function drawHead() {
    const badges = clear(document.getElementById("badges"));
    badges.append(el("span", { class: "badge" }, "version " + policy.version));
    if (policy.locked) badges.append(" ", el("span", { class: "badge locked" }, "locked (built-in)"));
    document.getElementById("locked-note").hidden = !policy.locked;
    const attached = clear(document.getElementById("attached"));
    for (const c of policy.clusters || []) attached.appendChild(el("li", {}, el("a", { href: "/console/clusters/" + encodeURIComponent(c) }, c)));
    if (!(policy.clusters || []).length) attached.appendChild(el("li", { class: "muted" }, "No cluster is attached to it."));
  }

  async function drawHistory() {
    const data = await api("GET", path + "/history");
    const body = clear(document.querySelector("#history tbody"));
    const versions = vm.list(data, "versions");
    for (const v of versions) {
      const current = v.version === policy.version;
      const cell = current ? el("span", { class: "muted" }, "current")
        : el("button", { type: "button", class: "rollback", "data-version": v.version, "data-needs": "admin", disabled: policy.locked || !vm.may("admin"), onclick: vm.guarded(async () => {
          const report = await api("POST", path + "/rollback", { version: v.version });
          vm.notice("Rolled back to version " + v.version + (report && report.version ? ": stored as version " + report.version : "") + ".");
          await reload();
        }) }, "Roll back to version " + v.version);
      body.appendChild(el("tr", {}, el("th", { scope: "row" }, String(v.version)), el("td", {}, vm.when(v.stored_at)),
        el("td", {}, typeof v.author === "string" ? v.author : (v.author && (v.author.name || v.author.actor)) || ""), el("td", {}, cell)));
    }
    if (!versions.length) body.appendChild(el("tr", {}, el("td", { colspan: 4, class: "muted" }, "No history.")));
  }

  async function reload() {
    policy = await api("GET", path);
    form.load(policy);
    drawHead();
    document.getElementById("diff-box").hidden = true;
    await drawHistory();
    if (!policy.locked) validate();
  }

  async function drawClusters(known) {
    const data = known || await api("GET", "/clusters");
    const select = clear(document.getElementById("attach-cluster"));
    for (const c of vm.list(data, "clusters")) select.appendChild(el("option", { value: c.cluster_id }, c.cluster_id + (c.policy ? " (now " + c.policy + ")" : "")));
    if (!select.options.length) select.appendChild(el("option", { value: "" }, "no cluster has reported"));
  }

  document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
    const data = start.data || {};
    const catalogue = data.units || await api("GET", "/schedulingpolicyunits");
    form = new window.PolicyForm(catalogue, () => { document.getElementById("diff-box").hidden = true; validate(); });
    document.getElementById("add-filter-btn").addEventListener("click", () => form.addUnit("filter"));
    document.getElementById("add-weight-btn").addEventListener("click", () => form.addUnit("weight"));
    document.getElementById("editor").addEventListener("submit", (e) => e.preventDefault());
    document.getElementById("preview").addEventListener("click", vm.guarded(async () => {
      showDiff(await api("PUT", path + "?dry_run=true", form.value()));
      document.getElementById("diff").focus();
    }));
    document.getElementById("apply").addEventListener("click", vm.guarded(async () => {
      const report = await api("PUT", path + "?dry_run=false", form.value());
      const change = report && report.changes ? report.changes.find((c) => c.kind === "policy") : null;
      vm.clearBanner();
      vm.notice("Applied" + (change && change.version ? ": " + name + " is now version " + change.version : "") + ".");
      await reload();
    }));
    document.getElementById("attach").addEventListener("submit", vm.guarded(async (e) => {
      e.preventDefault();
      const cluster = document.getElementById("attach-cluster").value;
      if (!cluster) return;
      await api("PUT", "/clusters/" + encodeURIComponent(cluster) + "/policy", { policy: name });
      vm.notice("Cluster " + cluster + " now runs " + name + ".");
      await reload();
      const option = document.querySelector("#attach-cluster option[value='" + CSS.escape(cluster) + "']");
      if (option) option.textContent = cluster + " (now " + name + ")";
    }));
    document.getElementById("clone").addEventListener("submit", vm.guarded(async (e) => {
      e.preventDefault();
      const copy = document.getElementById("clone-name").value.trim();
      if (!copy) return;
      await api("POST", path + "/clone", { name: copy });
      location.assign("/console/policies/" + encodeURIComponent(copy));
    }));
    if (data.policy) { policy = data.policy; form.load(policy); drawHead(); await drawHistory(); if (!policy.locked) validate(); }
    else await reload();
    await drawClusters(data.clusters);
  }));
})();
