// Online evaluation on an agent's page: each version's pass rate and cost per task, hour by hour
// (GET /agents/{name}/quality: the counters its aliases' sampled grades add to, one query).
// A chart of the pass rate and the mean cost per task by version, and the table it is drawn from.
// A sampled task that ended without an answer is "unanswered", a fail of the pass rate.

import { get } from "./api.js";
import { fmtUsd, h, replace, svg } from "./dom.js";

const HOURS = 48;

function byVersion(buckets) {
  const out = new Map();
  for (const b of buckets) {
    if (!out.has(b.version)) out.set(b.version, []);
    out.get(b.version).push(b);
  }
  return out;
}

// Two bands over the same hours: the pass rate (0-100%) and the mean cost of a graded task,
// one line and its points per version; every point has a <title> with its numbers.
export function qualityChart(report) {
  const w = 640;
  const left = 52;
  const bandH = 90;
  const gap = 28;
  const first = report.first_hour;
  const span = Math.max(1, report.last_hour - first);
  const x = (hour) => left + ((w - left - 12) * (hour - first)) / span;
  const maxCost = Math.max(1e-9, ...report.buckets.map((b) => Number(b.mean_task_cost_usd || 0)));
  const yRate = (r) => bandH - 4 - (bandH - 8) * r;
  const yCost = (c) => 2 * bandH + gap - 4 - (bandH - 8) * (c / maxCost);
  const parts = [
    svg("text", { x: 0, y: 12, class: "axis" }, "pass rate"),
    svg("text", { x: 0, y: 26, class: "axis" }, "100%"),
    svg("text", { x: 0, y: bandH + gap + 12, class: "axis" }, "cost/task"),
    svg("text", { x: 0, y: bandH + gap + 26, class: "axis" }, fmtUsd(maxCost)),
    svg("line", { x1: left, x2: w, y1: bandH, y2: bandH, class: "baseline" }),
    svg("line", { x1: left, x2: w, y1: 2 * bandH + gap, y2: 2 * bandH + gap, class: "baseline" }),
  ];
  [...byVersion(report.buckets)].forEach(([version, buckets], i) => {
    const cls = `series-${i % 4}`;
    const scored = buckets.filter((b) => b.pass_rate !== null);
    if (scored.length > 1) parts.push(svg("polyline", { class: `line ${cls}`, points: scored.map((b) => `${x(b.hour)},${yRate(b.pass_rate)}`).join(" ") }));
    if (buckets.length > 1) parts.push(svg("polyline", { class: `line ${cls}`, points: buckets.map((b) => `${x(b.hour)},${yCost(Number(b.mean_task_cost_usd || 0))}`).join(" ") }));
    for (const b of buckets) {
      const when = new Date(b.start * 1000).toISOString().slice(0, 13).replace("T", " ");
      const label = `v${version} ${when}:00 UTC: ${b.passed}/${b.graded - b.errors + b.unanswered} passed${b.unanswered ? `, ${b.unanswered} never answered` : ""}${b.errors ? `, ${b.errors} failed to grade` : ""}`;
      if (b.pass_rate !== null) parts.push(svg("circle", { cx: x(b.hour), cy: yRate(b.pass_rate), r: 4, class: `dot ${cls}`, "data-version": version }, svg("title", {}, label)));
      parts.push(svg("circle", { cx: x(b.hour), cy: yCost(Number(b.mean_task_cost_usd || 0)), r: 4, class: `dot ${cls}` }, svg("title", {}, `v${version} ${when}:00 UTC: ${fmtUsd(b.mean_task_cost_usd)} a task, grading ${fmtUsd(b.grade_cost_usd)}`)));
    }
    parts.push(svg("text", { x: left + 8 + i * 70, y: 2 * bandH + gap + 24, class: `q-legend ${cls}` }, `● v${version}`));
  });
  const h2 = 2 * bandH + gap + 32;
  return svg("svg", { viewBox: `0 0 ${w} ${h2}`, class: "chart", id: "quality-chart", role: "img", "aria-label": `Pass rate and cost per task by version over the last ${HOURS} hours` }, parts);
}

export async function qualityCard(ctx, name) {
  const card = h("section", { class: "card", id: "quality", "aria-labelledby": "quality-h" },
    h("h2", { id: "quality-h" }, "Quality (online evaluation)"));
  let report;
  try {
    report = await get(`agents/${encodeURIComponent(name)}/quality?hours=${HOURS}`);
  } catch (err) {
    ctx.showError(err);
    return card;
  }
  if (!report.buckets.length) {
    card.append(h("p", { class: "muted" }, `No online grades in the last ${HOURS} hours. Grade a share of an alias's tasks with `,
      h("code", {}, `agentq agents alias set ${name} prod N --sample 0.1 --rubric "..."`), "."));
    return card;
  }
  const rate = (b) => (b.pass_rate === null ? "–" : `${Math.round(100 * b.pass_rate)}%`);
  replace(card, h("h2", { id: "quality-h" }, "Quality (online evaluation)"),
    h("p", { class: "muted" }, `Each version's sampled answers, graded by its alias, per hour (last ${HOURS} hours, UTC); a sampled task that ended without an answer is unanswered, a fail of the pass rate.`),
    qualityChart(report),
    h("table", { class: "quality" },
      h("thead", {}, h("tr", {}, ["Hour", "Version", "Graded", "Passed", "Errors", "Unanswered", "Pass rate", "Cost/task", "Grading"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, report.buckets.map((b) => h("tr", { "data-version": b.version, "data-hour": b.hour },
        h("td", {}, new Date(b.start * 1000).toISOString().slice(0, 13).replace("T", " ") + ":00"),
        h("td", { class: "mono" }, `v${b.version}`),
        h("td", { class: "num" }, b.graded),
        h("td", { class: "num" }, b.passed),
        h("td", { class: "num" }, b.errors),
        h("td", { class: "num" }, b.unanswered),
        h("td", { class: "num pass-rate" }, rate(b)),
        h("td", { class: "num" }, b.mean_task_cost_usd === null ? "–" : fmtUsd(b.mean_task_cost_usd)),
        h("td", { class: "num" }, fmtUsd(b.grade_cost_usd)))))));
  return card;
}
