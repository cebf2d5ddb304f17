// The policies page: every stored policy, built-ins marked locked, each with edit and clone.
"use strict";

(function () {
  const { el, clear, api } = vm;

  function cloneForm(name) {
    const id = "clone-" + name.replace(/[^A-Za-z0-9_-]/g, "_");
    const input = el("input", { id, required: true, placeholder: "new name", size: 14, pattern: "[A-Za-z0-9_.\\-]+" });
    const form = el("form", { class: "inline clone" },
      el("label", { for: id, class: "sr-only" }, "Name of the copy of " + name), input,
      el("button", { type: "submit" }, "Clone"));
    form.addEventListener("submit", vm.guarded(async (e) => {
      e.preventDefault();
      const copy = input.value.trim();
      if (!copy) return;
      await api("POST", "/schedulingpolicies/" + encodeURIComponent(name) + "/clone", { name: copy });
      location.assign("/console/policies/" + encodeURIComponent(copy));
    }));
    return form;
  }

  document.addEventListener("DOMContentLoaded", vm.guarded(async () => {
    const start = vm.initial();
    const data = start.data && start.data.policies ? start.data.policies : await api("GET", "/schedulingpolicies");
    const body = clear(document.querySelector("#policies tbody"));
    for (const p of vm.list(data, "policies")) {
      const href = "/console/policies/" + encodeURIComponent(p.name);
      body.appendChild(el("tr", {},
        el("th", { scope: "row" }, el("a", { href }, p.name), p.locked ? el("span", { class: "badge locked", title: "Built-in: clone it to change it" }, "locked") : null,
          p.default ? el("span", { class: "badge" }, "default") : null),
        el("td", {}, p.description || ""),
        el("td", {}, String(p.version ?? "")),
        el("td", {}, (p.clusters || []).join(", ")),
        el("td", {}, el("a", { href, class: "button" }, p.locked ? "View" : "Edit"), " ", cloneForm(p.name))));
    }
  }));
})();
