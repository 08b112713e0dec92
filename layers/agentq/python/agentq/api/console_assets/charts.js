// Pictures where people would rather look than read: the budget gauge and the per-step chart.
// Plain SVG, sized by viewBox; every shape has a <title> and each chart an aria-label.

import { fmtInt, fmtUsd, svg } from "./dom.js";

// A half-ring: used (solid) then reserved (light) out of the cap. `fmt` writes an amount
// (tokens or dollars), `unit` names it in the label a screen reader reads.
export function gauge({ cap, used, reserved, fmt, unit, id }) {
  const r = 80;
  const cx = 100;
  const cy = 95;
  const frac = (x) => Math.max(0, Math.min(1, cap ? x / cap : 0));
  const arc = (from, to) => {
    const a0 = Math.PI * (1 - from);
    const a1 = Math.PI * (1 - to);
    const p = (a) => `${(cx + r * Math.cos(a)).toFixed(2)} ${(cy - r * Math.sin(a)).toFixed(2)}`;
    return `M ${p(a0)} A ${r} ${r} 0 0 1 ${p(a1)}`;
  };
  const u = frac(used);
  const ur = frac(used + reserved);
  const level = u >= 0.9 ? "hot" : u >= 0.7 ? "warm" : "ok";
  const pct = cap ? Math.round((100 * used) / cap) : 0;
  return svg("svg", { viewBox: "0 0 200 120", class: "gauge", id, role: "img", "aria-label": `${fmt(used)} of ${fmt(cap)} ${unit} used (${pct}%)` },
    svg("path", { d: arc(0, 1), class: "gauge-track" }),
    ur > u ? svg("path", { d: arc(u, ur), class: "gauge-reserved" }, svg("title", {}, `${fmt(reserved)} reserved`)) : null,
    u > 0 ? svg("path", { d: arc(0, u), class: `gauge-used ${level}` }, svg("title", {}, `${fmt(used)} used`)) : null,
    svg("text", { x: cx, y: cy - 12, class: "gauge-pct" }, `${pct}%`),
    svg("text", { x: cx, y: cy + 14, class: "gauge-label" }, `${fmt(used)} / ${fmt(cap)}`),
  );
}

// The token budget: the ledger's (the whole tree's, for a root) or, without one, the task's own count.
export function budgetGauge(budget, tokens) {
  return gauge({
    cap: budget ? budget.cap : tokens.budget,
    used: budget ? budget.used : tokens.total,
    reserved: budget ? budget.reserved : 0,
    fmt: fmtInt,
    unit: "tokens",
    id: "token-gauge",
  });
}

// The money budget (max_cost_usd): the same ledger in dollars, held calls at the most they can cost.
export function moneyGauge(money) {
  return gauge({
    cap: Number(money.cap_usd),
    used: Number(money.used_usd),
    reserved: Number(money.reserved_usd),
    fmt: fmtUsd,
    unit: "dollars",
    id: "money-gauge",
  });
}

// Two aligned bar charts over the LLM calls: tokens (input + output, stacked) and latency.
export function stepChart(calls) {
  const w = 640;
  const bandH = 90;
  const left = 48;
  const gap = 26;
  const n = Math.max(calls.length, 1);
  const bw = Math.min(36, (w - left - 10) / n - 4);
  const x = (i) => left + i * ((w - left - 10) / n) + 2;
  const maxTok = Math.max(1, ...calls.map((c) => c.tokens.input + c.tokens.output));
  const maxMs = Math.max(1, ...calls.map((c) => c.duration_ms));
  const h = bandH * 2 + gap + 34;
  const parts = [
    svg("text", { x: 0, y: 12, class: "axis" }, "tokens"),
    svg("text", { x: 0, y: 26, class: "axis" }, fmtInt(maxTok)),
    svg("text", { x: 0, y: bandH + gap + 12, class: "axis" }, "latency"),
    svg("text", { x: 0, y: bandH + gap + 26, class: "axis" }, `${fmtInt(maxMs)} ms`),
    svg("line", { x1: left, x2: w, y1: bandH, y2: bandH, class: "baseline" }),
    svg("line", { x1: left, x2: w, y1: 2 * bandH + gap, y2: 2 * bandH + gap, class: "baseline" }),
  ];
  calls.forEach((c, i) => {
    const hin = (bandH - 4) * (c.tokens.input / maxTok);
    const hout = (bandH - 4) * (c.tokens.output / maxTok);
    const hl = (bandH - 4) * (c.duration_ms / maxMs);
    const label = `step ${c.step}: ${fmtInt(c.tokens.input)} in, ${fmtInt(c.tokens.output)} out, ${fmtInt(c.duration_ms)} ms`;
    parts.push(
      svg("rect", { x: x(i), y: bandH - hin, width: bw, height: hin, class: `bar-in${c.orphan ? " orphan" : ""}` }, svg("title", {}, `${label} (input)`)),
      svg("rect", { x: x(i), y: bandH - hin - hout, width: bw, height: hout, class: "bar-out" }, svg("title", {}, `${label} (output)`)),
      svg("rect", { x: x(i), y: 2 * bandH + gap - hl, width: bw, height: hl, class: `bar-ms${c.attempts > 1 ? " retried" : ""}` }, svg("title", {}, `${label}${c.attempts > 1 ? `, ${c.attempts} attempts` : ""}`)),
      svg("text", { x: x(i) + bw / 2, y: h - 8, class: "tick" }, String(c.step)),
    );
  });
  return svg("svg", { viewBox: `0 0 ${w} ${h}`, class: "chart", role: "img", "aria-label": `Tokens and latency of ${calls.length} LLM calls, by step` }, parts);
}
