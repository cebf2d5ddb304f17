// The clusters page: every cluster, linking to its page and to a what-if on it.
"use strict";

document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
  const { el, clear, list } = vm;
  const start = vm.initial();
  const data = start.data && start.data.clusters ? start.data.clusters : await vm.api("GET", "/clusters");
  const body = clear(document.querySelector("#clusters tbody"));
  const clusters = list(data, "clusters");
  if (!clusters.length) {
    body.appendChild(el("tr", {}, el("td", { colspan: 5, class: "muted" },
      "No cluster has reported yet. Hosts appear here once the engine reports them (vmsched hosts register, or the engine's host reports).")));
    return;
  }
  for (const c of clusters) {
    const id = c.cluster_id;
    body.appendChild(el("tr", {},
      el("th", { scope: "row" }, el("a", { href: "/console/clusters/" + encodeURIComponent(id) }, id)),
      el("td", {}, vm.num(c.hosts)),
      el("td", {}, vm.num(c.vms)),
      el("td", {}, c.policy ? el("a", { href: "/console/policies/" + encodeURIComponent(c.policy) }, c.policy) : el("span", { class: "muted" }, "default")),
      el("td", {}, el("a", { href: "/console/whatif?cluster=" + encodeURIComponent(id) }, "What-if"))));
  }
}));
