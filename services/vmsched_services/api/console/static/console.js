// The console's shared helpers: the JSON API over fetch, the error banner, safe DOM building.
// Plain JavaScript, no build step. Data is only ever put in the page as text (textContent,
// createTextNode, attribute values), never parsed as HTML.
"use strict";

(function () {
  const API = "/api/v1";

  class ApiError extends Error {
    constructor(status, message, hint, code, location) {
      super(message);
      this.status = status;
      this.hint = hint || "";
      this.code = code || "";
      this.location = location || "";
    }
  }

  function toLogin() {
    const here = location.pathname + location.search;
    location.assign("/console/login?next=" + encodeURIComponent(here));
  }

  // One call to the JSON API. Unsafe methods carry X-Vmsched-Console (the API's CSRF check for
  // cookie-authenticated requests). 401 goes back to the login page; other errors become an
  // ApiError with the API's message and hint.
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (method !== "GET" && method !== "HEAD") headers["X-Vmsched-Console"] = "1";
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(API + path, {
        method,
        headers,
        credentials: "same-origin",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError(0, "The console cannot reach the vmsched API.", "Check that the api service is running, then try again.");
    }
    if (response.status === 401) {
      toLogin();
      throw new ApiError(401, "Your session has ended.", "Sign in again with your token.");
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = null; }
    }
    if (!response.ok) {
      const err = (data && data.error) || {};
      let message = err.message || (data && typeof data.detail === "string" ? data.detail : "") || ("The API answered " + response.status + ".");
      let hint = err.hint || "";
      if (!err.message && data && Array.isArray(data.detail)) {
        message = data.detail.map((d) => (d.loc || []).join(".") + ": " + d.msg).join("; ");
      }
      if (response.status === 403 && !hint) hint = "Your token's role does not allow this; ask an administrator.";
      throw new ApiError(response.status, message, hint, err.code, err.location);
    }
    return data;
  }

  // Build an element: el("td", {class: "x", title: t}, "text", child). Strings become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElementNS(tag.startsWith("svg:") ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml", tag.replace(/^svg:/, ""));
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function banner(error) {
    const box = document.getElementById("banner");
    if (!box) return;
    const message = error instanceof Error ? error.message : String(error);
    box.querySelector(".banner-message").textContent = message;
    box.querySelector(".banner-hint").textContent = (error && error.hint) || "";
    box.hidden = false;
  }

  function clearBanner() {
    const box = document.getElementById("banner");
    if (box) box.hidden = true;
  }

  let noticeTimer = null;
  function notice(text) {
    const box = document.getElementById("notice");
    if (!box) return;
    box.textContent = text;
    box.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => { box.hidden = true; }, 6000);
  }

  function initial() {
    const node = document.getElementById("initial");
    if (!node) return { params: {}, data: null, who: null };
    try { return JSON.parse(node.textContent); } catch (e) { return { params: {}, data: null, who: null }; }
  }

  function debounce(fn, ms) {
    let timer = null;
    return function (...args) {
      clearTimeout(timer);
      timer = setTimeout(() => fn.apply(this, args), ms);
    };
  }

  // Run an async action, showing its failure in the banner instead of the console.
  function guarded(fn) {
    return async function (...args) {
      try {
        return await fn.apply(this, args);
      } catch (e) {
        if (!(e instanceof ApiError && e.status === 401)) banner(e);
        return undefined;
      }
    };
  }

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleString();
  }

  function num(x, digits) {
    if (x === null || x === undefined || x === "") return "";
    const n = Number(x);
    if (!isFinite(n)) return String(x);
    return Number.isInteger(n) ? String(n) : n.toFixed(digits === undefined ? 2 : digits);
  }

  function list(x, key) {
    // The API may answer a bare list or an object wrapping one ({clusters: [...]}, {decisions: [...]}).
    if (Array.isArray(x)) return x;
    if (x && Array.isArray(x[key])) return x[key];
    return [];
  }

  // Whether the signed-in token's role reaches `needed` (viewer < operator < admin). The API decides
  // (403 otherwise); this only keeps controls the role cannot use from looking usable.
  const ROLES = ["viewer", "operator", "admin"];
  function may(needed) {
    return ROLES.indexOf(document.body.dataset.role || "") >= ROLES.indexOf(needed);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const close = document.querySelector("#banner .banner-close");
    if (close) close.addEventListener("click", clearBanner);
    for (const control of document.querySelectorAll("[data-needs]")) {
      if (!may(control.dataset.needs)) {
        control.disabled = true;
        control.title = "Needs a token with the " + control.dataset.needs + " role";
        control.after(el("span", { class: "small needs-role" }, " needs a token with the " + control.dataset.needs + " role"));
      }
    }
  });
  window.addEventListener("unhandledrejection", (event) => {
    banner(event.reason instanceof Error ? event.reason : new Error(String(event.reason)));
    event.preventDefault();
  });

  window.vm = { api, ApiError, el, clear, banner, clearBanner, notice, initial, debounce, guarded, when, num, list, toLogin, may };
})();
