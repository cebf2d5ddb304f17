// The what-if page: a VM's size and a policy in, the per-host explanation table out.
"use strict";

(function () {
  const { el, clear, api } = vm;
  const start = vm.initial();

  function overrides(text) {
    const out = {};
    for (const raw of text.split("\n")) {
      const line = raw.trim();
      if (!line) continue;
      const at = line.indexOf("=");
      if (at <= 0) throw new vm.ApiError(0, "Property override \"" + line + "\" is not name=value.", "Write one override a line, e.g. CpuOverCommitDurationMinutes=4.");
      out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    return out;
  }

  document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
    const data = start.data || {};
    const [clusters, policies] = await Promise.all([
      data.clusters || api("GET", "/clusters"),
      data.policies || api("GET", "/schedulingpolicies"),
    ]);
    const cs = clear(document.getElementById("cluster"));
    for (const c of vm.list(clusters, "clusters")) cs.appendChild(el("option", { value: c.cluster_id, selected: c.cluster_id === start.params.cluster_id }, c.cluster_id));
    if (!cs.options.length) cs.appendChild(el("option", { value: "" }, "no cluster has reported"));
    const ps = document.getElementById("policy");
    for (const p of vm.list(policies, "policies")) ps.appendChild(el("option", { value: p.name }, p.name));

    document.getElementById("whatif").addEventListener("submit", vm.guarded(async (e) => {
      e.preventDefault();
      vm.clearBanner();
      const cluster = cs.value;
      if (!cluster) throw new vm.ApiError(0, "Choose a cluster.", "Only clusters whose hosts have reported can be tried.");
      const networks = document.getElementById("networks").value.split(",").map((s) => s.trim()).filter(Boolean);
      const body = {
        vm: {
          vm_id: "whatif-" + Date.now().toString(36),
          mem_mb: Number(document.getElementById("mem").value),
          vcpus: Number(document.getElementById("vcpus").value),
          cpu_usage_pct: Number(document.getElementById("cpu").value || 0),
          networks,
          ha: document.getElementById("ha").checked,
        },
        policy: ps.value || null,
        properties: overrides(document.getElementById("props").value),
      };
      const button = e.submitter || document.querySelector("#whatif button[type=submit]");
      button.disabled = true;
      try {
        const reply = await api("POST", "/clusters/" + encodeURIComponent(cluster) + "/whatif", body);
        document.getElementById("result").hidden = false;
        window.decisionHead(document.getElementById("result-head"), Object.assign({ vm_id: body.vm.vm_id }, reply));
        window.decisionTable(document.getElementById("explain"), reply);
        document.getElementById("res-h").scrollIntoView({ block: "start" });
      } finally {
        button.disabled = false;
      }
    }));
  }));
})();
