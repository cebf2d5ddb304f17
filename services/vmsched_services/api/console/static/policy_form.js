// The policy editor's form: filters (ordered, with positions), weights with factors, balance,
// selector and properties, drawn from a policy document and read back into one.
"use strict";

(function () {
  const { el, clear } = vm;
  const POSITIONS = ["first", "any", "last"];

  // The unit catalogue answers oVirt's shape (type: filter|weight|balance|selector) or vmsched's
  // (filter/weight/balance flags); either way: the unit names usable as each type.
  function unitsByType(catalogue) {
    const out = { filter: new Map(), weight: new Map(), balance: new Map(), selector: new Map() };
    for (const u of vm.list(catalogue, "units")) {
      const types = u.type ? [u.type] : ["filter", "weight", "balance", "selector"].filter((t) => u[t]);
      for (const t of types) if (out[t]) out[t].set(u.name, u);
    }
    return out;
  }

  class PolicyForm {
    constructor(catalogue, onChange) {
      this.units = unitsByType(catalogue);
      this.onChange = onChange;
      this.doc = null;
      this.locked = false;
    }

    load(policy) {
      this.doc = {
        name: policy.name,
        description: policy.description || "",
        filters: (policy.filters || []).map((f) => ({ unit: f.unit, position: f.position || "any" })),
        weights: (policy.weights || []).map((w) => ({ unit: w.unit, factor: w.factor ?? 1 })),
        balances: policy.balances ? policy.balances.map((b) => ({ unit: b.unit })) : policy.balance ? [{ unit: policy.balance }] : [],
        selector: policy.selector || "RankSelector",
        properties: Object.assign({}, policy.properties || {}),
      };
      this.locked = !!policy.locked;
      this.draw();
    }

    // The document as the API takes it (oVirt's shape).
    value() {
      const d = this.doc;
      return { name: d.name, description: d.description, filters: d.filters, weights: d.weights, balances: d.balances, selector: d.selector, properties: d.properties };
    }

    changed() { this.draw(); this.onChange(); }

    draw() {
      const d = this.doc;
      const desc = document.getElementById("description");
      desc.value = d.description;
      desc.disabled = this.locked;
      desc.oninput = () => { d.description = desc.value; this.onChange(); };
      this.drawFilters();
      this.drawWeights();
      this.drawSelect("balance", ["", ...this.units.balance.keys()], d.balances.length ? d.balances[0].unit : "", (v) => { d.balances = v ? [{ unit: v }] : []; this.changed(); }, "none");
      const selectors = new Set(["RankSelector", "MinMaxSelector", ...this.units.selector.keys(), d.selector]);
      this.drawSelect("selector", [...selectors], d.selector, (v) => { d.selector = v; this.changed(); });
      this.drawAdd("add-filter", this.units.filter, d.filters);
      this.drawAdd("add-weight", this.units.weight, d.weights);
      this.drawProperties();
      for (const node of document.querySelectorAll("#editor button, #editor select, #editor input")) {
        if (this.locked && !["preview"].includes(node.id)) node.disabled = true;
      }
    }

    drawSelect(id, options, current, onPick, emptyLabel) {
      const select = clear(document.getElementById(id));
      for (const o of options) select.appendChild(el("option", { value: o, selected: o === current }, o || emptyLabel || ""));
      select.onchange = () => onPick(select.value);
    }

    drawAdd(id, available, used) {
      const names = [...available.keys()].filter((n) => !used.some((u) => u.unit === n)).sort();
      const select = clear(document.getElementById(id));
      for (const n of names) select.appendChild(el("option", { value: n, title: available.get(n).description || "" }, n));
    }

    addUnit(kind) {
      const select = document.getElementById(kind === "filter" ? "add-filter" : "add-weight");
      if (!select.value) return;
      if (kind === "filter") this.doc.filters.push({ unit: select.value, position: "any" });
      else this.doc.weights.push({ unit: select.value, factor: 1 });
      this.changed();
    }

    unitRow(kind, list, i, extra) {
      const entry = list[i];
      const info = this.units[kind].get(entry.unit);
      const move = (delta) => { const j = i + delta; [list[i], list[j]] = [list[j], list[i]]; this.changed(); document.querySelector("#" + kind + "s li:nth-child(" + (j + 1) + ") .up, #" + kind + "s li:nth-child(" + (j + 1) + ") .down")?.focus(); };
      return el("li", { "data-unit": entry.unit },
        el("span", { class: "unit-name", title: (info && info.description) || "" }, entry.unit),
        extra,
        el("button", { type: "button", class: "up", "aria-label": "Move " + entry.unit + " up", disabled: i === 0, onclick: () => move(-1) }, "↑"),
        el("button", { type: "button", class: "down", "aria-label": "Move " + entry.unit + " down", disabled: i === list.length - 1, onclick: () => move(1) }, "↓"),
        el("button", { type: "button", class: "remove", "aria-label": "Remove " + entry.unit, onclick: () => { list.splice(i, 1); this.changed(); } }, "Remove"),
        el("span", { class: "field-error", "data-loc": kind + "s." + i }));
    }

    drawFilters() {
      const box = clear(document.getElementById("filters"));
      this.doc.filters.forEach((f, i) => {
        const id = "pos-" + i;
        const select = el("select", { id, "aria-label": "Position of " + f.unit }, POSITIONS.map((p) => el("option", { value: p, selected: p === f.position }, p)));
        select.onchange = () => { f.position = select.value; this.onChange(); };
        box.appendChild(this.unitRow("filter", this.doc.filters, i, el("span", { class: "pos" }, el("label", { for: id, class: "small" }, "position"), select)));
      });
      if (!this.doc.filters.length) box.appendChild(el("li", { class: "muted" }, "No filters: every up host is a candidate."));
    }

    drawWeights() {
      const box = clear(document.getElementById("weights"));
      this.doc.weights.forEach((w, i) => {
        const id = "factor-" + i;
        const input = el("input", { id, type: "number", step: "1", value: w.factor, class: "factor", "aria-label": "Factor of " + w.unit });
        input.oninput = () => { w.factor = input.value === "" ? input.value : Number(input.value); this.onChange(); };
        box.appendChild(this.unitRow("weight", this.doc.weights, i, el("span", { class: "pos" }, el("label", { for: id, class: "small" }, "factor"), input)));
      });
      if (!this.doc.weights.length) box.appendChild(el("li", { class: "muted" }, "No weights: hosts that pass the filters are equal."));
    }

    // Every property a unit of the policy declares, plus those the policy sets that none declares.
    drawProperties() {
      const body = clear(document.querySelector("#properties tbody"));
      const declared = new Map();
      const used = [...this.doc.filters.map((f) => ["filter", f.unit]), ...this.doc.weights.map((w) => ["weight", w.unit]), ...this.doc.balances.map((b) => ["balance", b.unit])];
      for (const [kind, name] of used) {
        const info = this.units[kind].get(name);
        for (const p of (info && info.properties) || []) {
          const row = declared.get(p.name) || { prop: p, units: [] };
          row.units.push(name);
          declared.set(p.name, row);
        }
      }
      for (const key of Object.keys(this.doc.properties)) if (!declared.has(key)) declared.set(key, { prop: { name: key, description: "Not declared by any unit of this policy." }, units: [] });
      if (!declared.size) body.appendChild(el("tr", {}, el("td", { colspan: 4, class: "muted" }, "The units of this policy take no properties.")));
      [...declared.values()].sort((a, b) => a.prop.name.localeCompare(b.prop.name)).forEach(({ prop, units }, i) => {
        const id = "prop-" + i;
        const value = this.doc.properties[prop.name];
        const input = el("input", { id, name: prop.name, value: value ?? "", placeholder: prop.default !== undefined && prop.default !== null ? "default " + prop.default : "", "aria-describedby": id + "-err", "data-prop": prop.name });
        input.oninput = () => {
          if (input.value === "") delete this.doc.properties[prop.name];
          else this.doc.properties[prop.name] = input.value;
          // The unit's own pattern, at once; the API's validation follows (debounced).
          const bad = prop.regex && input.value !== "" && !new RegExp("^(?:" + prop.regex + ")$").test(input.value);
          input.setAttribute("aria-invalid", bad ? "true" : "false");
          document.getElementById(id + "-err").textContent = bad ? "Does not match " + prop.regex : "";
          this.onChange();
        };
        body.appendChild(el("tr", {},
          el("th", { scope: "row" }, el("label", { for: id }, prop.name)),
          el("td", {}, input, el("span", { id: id + "-err", class: "field-error", "data-loc": "properties." + prop.name })),
          el("td", { class: "small" }, units.join(", ")),
          el("td", { class: "small" }, prop.description || "")));
      });
    }

    // Errors from the API's validation, each next to its field when its location names one.
    showErrors(errors) {
      document.querySelectorAll("#editor [data-loc]").forEach((n) => { n.textContent = ""; });
      document.querySelectorAll("#editor input[data-prop]").forEach((n) => n.setAttribute("aria-invalid", "false"));
      const general = [];
      for (const e of errors) {
        const loc = String(e.location || "");
        // policy-admin names a property in its message ("policy P: property K: ..."); the API's
        // own checks in the location (body.properties.K).
        const keys = Object.keys(this.doc.properties).concat([...document.querySelectorAll("#editor input[data-prop]")].map((n) => n.dataset.prop));
        const names = (k) => new RegExp("(^|[^A-Za-z0-9_])" + k.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "($|[^A-Za-z0-9_])");
        const prop = keys.find((k) => loc.endsWith("properties." + k)) || keys.find((k) => names(k).test(String(e.message)));
        const m = /(filters|weights)[.[](\d+)/.exec(loc);
        const slot = prop ? document.querySelector('[data-loc="properties.' + CSS.escape(prop) + '"]') : m ? document.querySelector('[data-loc="' + m[1] + "." + m[2] + '"]') : null;
        if (slot) {
          slot.textContent = e.message;
          const input = prop && document.querySelector('#editor input[data-prop="' + CSS.escape(prop) + '"]');
          if (input) input.setAttribute("aria-invalid", "true");
        } else general.push((loc ? loc + ": " : "") + e.message);
      }
      document.getElementById("form-errors").textContent = general.join(" ");
    }
  }

  window.PolicyForm = PolicyForm;
})();
