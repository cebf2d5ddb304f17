// The decision page: the decision's head and its explanation table; ?why=HOST answers at once.
"use strict";

document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
  const start = vm.initial();
  const p = start.params;
  const d = start.data || await vm.api("GET", "/clusters/" + encodeURIComponent(p.cluster_id) + "/decisions/" + encodeURIComponent(p.request_id));
  if (!d) return;
  window.decisionHead(document.getElementById("decision-head"), d);
  const table = window.decisionTable(document.getElementById("explain"), d);
  const why = new URLSearchParams(location.search).get("why");
  if (why) {
    document.getElementById("why-host").value = why;
    table.explain(why);
  }
}));
