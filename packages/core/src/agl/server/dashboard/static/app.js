// agl dashboard: draws the learning curve (inline SVG) and keeps the overview's numbers current while a run
// trains. Hand-written, no libraries; the pages work without it.
"use strict";

const SERIES = [
  ["train_reward", "train reward (mean)"],
  ["train_success", "train success rate"],
  ["eval_accuracy", "held-out accuracy"],
];
const SVG_NS = "http://www.w3.org/2000/svg";

function el(name, attrs, text) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawCurve(figure, data) {
  const svg = figure.querySelector("svg");
  const W = 640, H = 300, left = 44, right = 150, top = 12, bottom = 32;
  const points = SERIES.flatMap(([key]) => data[key] || []);
  svg.replaceChildren();
  figure.dataset.points = String(points.length);
  if (points.length === 0) {
    svg.append(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no training steps yet"));
    return;
  }
  const steps = points.map((p) => p[0]);
  const values = points.map((p) => p[1]).concat([0, 1]);
  const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
  const y0 = Math.min(...values), y1 = Math.max(...values);
  const x = (s) => left + ((s - x0) / (x1 - x0)) * (W - left - right);
  const y = (v) => top + (1 - (v - y0) / (y1 - y0 || 1)) * (H - top - bottom);
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4;
    svg.append(el("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
    svg.append(el("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, v.toFixed(2)));
  }
  svg.append(el("line", { class: "axis", x1: left, x2: W - right, y1: H - bottom, y2: H - bottom }));
  svg.append(el("text", { x: (left + W - right) / 2, y: H - 6, "text-anchor": "middle" }, "step"));
  for (const s of [x0, x1]) {
    svg.append(el("text", { x: x(s), y: H - bottom + 14, "text-anchor": "middle" }, String(s)));
  }
  SERIES.forEach(([key, label], i) => {
    const series = data[key] || [];
    const group = el("g", { class: "series s" + i, "data-series": key });
    if (series.length > 1) {
      group.append(el("polyline", { class: "s" + i, points: series.map((p) => x(p[0]) + "," + y(p[1])).join(" ") }));
    }
    for (const [s, v] of series) {
      const dot = el("circle", { class: "point s" + i, cx: x(s), cy: y(v), r: 3 });
      dot.append(el("title", {}, label + " at step " + s + ": " + v.toFixed(3)));
      group.append(dot);
    }
    svg.append(group);
    svg.append(el("rect", { class: "s" + i, x: W - right + 12, y: top + 6 + i * 18, width: 10, height: 10 }));
    svg.append(el("text", { x: W - right + 28, y: top + 15 + i * 18 }, label));
  });
}

async function refresh(url, apply) {
  try {
    const response = await fetch(url, { credentials: "same-origin" });
    if (response.ok) apply(await response.json());
  } catch (error) {
    // the server went away (the run ended): keep what is shown
  }
}

function updateCounts(counts) {
  const values = { ...counts.rollouts_by_status, rollouts: counts.rollouts, llm_calls: counts.llm_calls,
    last_step: counts.last_step ?? "", untrainable_calls: counts.untrainable_calls };
  const calls = counts.llm_calls_by_attribution || {};
  values.unattributed = (calls.unattributed || 0) + (calls.unhooked || 0) + (calls.missed || 0);
  document.querySelectorAll("[data-count]").forEach((node) => {
    const key = node.dataset.count;
    node.textContent = String(values[key] ?? 0);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const figure = document.getElementById("curve");
  if (figure) {
    drawCurve(figure, JSON.parse(document.getElementById("curve-data").textContent));
    setInterval(() => refresh(figure.dataset.src, (data) => drawCurve(figure, data)), 5000);
  }
  const counts = document.getElementById("counts");
  if (counts) setInterval(() => refresh(counts.dataset.src, updateCounts), 5000);
});
