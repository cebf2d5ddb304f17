// Line plots as inline SVG (no chart library): one plot, several named series of [x, y] points.
"use strict";

(function () {
  const { el } = vm;
  const W = 560, H = 220, L = 52, R = 12, T = 14, B = 34;
  const COLOURS = ["#1f6fb2", "#d9480f", "#2b8a3e", "#862e9c"];

  function ticks(lo, hi, n) {
    if (hi <= lo) return [lo];
    const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => (hi - lo) / s <= n) || step * 10;
    const out = [];
    for (let v = Math.ceil(lo / nice) * nice; v <= hi + 1e-9; v += nice) out.push(Number(v.toPrecision(12)));
    return out;
  }

  function label(v) {
    const a = Math.abs(v);
    return a >= 1e6 ? (v / 1e6).toFixed(1) + "M" : a >= 1e4 ? (v / 1e3).toFixed(0) + "k" : Number.isInteger(v) ? String(v) : v.toFixed(a < 1 ? 2 : 1);
  }

  // series: [{name, points: [[x, y], ...]}]; returns a <figure> with the SVG and its caption.
  function linePlot(title, series, xLabel) {
    const all = series.flatMap((s) => s.points).filter((p) => isFinite(p[0]) && isFinite(p[1]));
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs);
    const y0 = Math.min(0, ...ys), y1 = Math.max(...ys) || 1;
    const sx = (x) => L + ((x - x0) / ((x1 - x0) || 1)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / ((y1 - y0) || 1)) * (H - T - B);
    const svg = el("svg:svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": title + ": " + series.map((s) => s.name).join(" and "), class: "plot" });
    for (const v of ticks(y0, y1, 5)) {
      svg.appendChild(el("svg:line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), class: "grid" }));
      svg.appendChild(el("svg:text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end", class: "tick" }, label(v)));
    }
    for (const v of ticks(x0, x1, 6)) {
      svg.appendChild(el("svg:text", { x: sx(v), y: H - B + 16, "text-anchor": "middle", class: "tick" }, label(v)));
    }
    svg.appendChild(el("svg:line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    svg.appendChild(el("svg:line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    if (xLabel) svg.appendChild(el("svg:text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "tick" }, xLabel));
    series.forEach((s, i) => {
      const pts = s.points.filter((p) => isFinite(p[0]) && isFinite(p[1]));
      if (!pts.length) return;
      const d = pts.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
      svg.appendChild(el("svg:path", { d, fill: "none", stroke: COLOURS[i % COLOURS.length], "stroke-width": 2, "stroke-dasharray": i % 2 ? "6 3" : null, class: "series" },
        el("svg:title", {}, s.name)));
    });
    const legend = el("ul", { class: "plot-legend" }, series.map((s, i) => {
      const swatch = el("span", { class: "swatch" + (i % 2 ? " dashed" : "") });
      swatch.style.borderColor = COLOURS[i % COLOURS.length];
      return el("li", {}, swatch, s.name);
    }));
    return el("figure", { class: "plot-figure" }, el("figcaption", {}, title), svg, legend);
  }

  window.linePlot = linePlot;
})();
