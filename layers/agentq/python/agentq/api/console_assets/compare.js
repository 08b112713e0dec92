// Two runs side by side (GET /tasks/{a}/compare/{b}, the comparison `agentq diff` prints): each
// task's totals, each step beside the other's, and the first step that differs highlighted and
// scrolled to. Reached from a task page ("Compare with…") and from a fork to its original. While
// either task runs the page polls (a conditional GET: an unchanged comparison costs a 304).

import { get } from "./api.js";
import { TERMINAL, badge, errorPage, fmtInt, fmtUsd, h, replace, taskLink } from "./dom.js";

const POLL_MS = 2000;
const FACTS = [
  ["status", "Status"], ["model", "Model"], ["steps", "Steps"], ["llm_calls", "LLM calls"], ["tool_calls", "Tool calls"],
  ["tokens_in", "Tokens in"], ["tokens_out", "Tokens out"], ["cost_usd", "Cost"], ["grade", "Grade"],
];

export async function comparePage(ctx, a, b) {
  const path = `tasks/${encodeURIComponent(a)}/compare/${encodeURIComponent(b)}`;
  let result;
  try {
    result = await get(path);
  } catch (err) {
    errorPage(ctx, "Compare two runs", err, { href: `#/tasks/${encodeURIComponent(a)}`, text: "Back to the task" });
    return;
  }
  const head = h("section", { class: "head" });
  const totals = h("section", { class: "card", "aria-labelledby": "compare-totals-h" });
  const steps = h("section", { class: "card", "aria-labelledby": "compare-steps-h" });
  replace(ctx.main, head, totals, steps);

  let shown = "";
  let scrolled = false;
  function draw() {
    const sig = JSON.stringify(result);
    if (sig === shown) return;
    shown = sig;
    drawHead(head, result, a, b);
    drawTotals(totals, result);
    drawSteps(steps, result);
    const first = steps.querySelector("#first-diff");
    if (first && !scrolled) {
      scrolled = true;
      first.scrollIntoView({ block: "center" });
    }
  }
  draw();
  const running = () => !TERMINAL.has(result.a.status) || !TERMINAL.has(result.b.status);
  if (!running()) return;
  return ctx.every(POLL_MS, async () => {
    if (!running()) return;
    result = await get(path);
    draw();
  });
}

function drawHead(el, r, a, b) {
  const fork = r.b.forked_from && r.b.forked_from.task_id === a ? ` (forked from A at step ${r.b.forked_from.step})`
    : r.a.forked_from && r.a.forked_from.task_id === b ? ` (A forked from B at step ${r.a.forked_from.step})` : "";
  const swap = h("a", { href: `#/compare/${encodeURIComponent(b)}/${encodeURIComponent(a)}`, id: "compare-swap" }, "swap");
  replace(el,
    h("p", { class: "crumbs" }, h("a", { href: "#/tasks" }, "Tasks"), " / ", taskLink(a)),
    h("h1", {}, "Compare two runs"),
    h("p", {}, "A ", taskLink(a), " ", badge(r.a.status), " · B ", taskLink(b), " ", badge(r.b.status), fork, " · ", swap),
    h("p", { id: "diverged", class: r.diverged_at === null ? "notice" : "diverged", role: "status" },
      r.diverged_at === null
        ? "The same steps, in the same order."
        : ["First difference at ", h("button", { type: "button", class: "quiet", id: "diverged-link", onclick: () => {
          const row = document.getElementById("first-diff");
          if (row) row.scrollIntoView({ block: "center" });
        } }, `step ${r.diverged_at}`), "."]),
    r.complete ? null : h("p", { class: "small muted" }, "Only the first 2,000 steps of each task were compared."));
}

function fact(t, key) {
  if (key === "cost_usd") return fmtUsd(t.cost_usd);
  if (key === "grade") return t.grade === null ? "–" : `${t.grade.toFixed(2)} (${t.passed ? "passed" : "below the bar"})`;
  if (key === "status") return badge(t.status);
  return typeof t[key] === "number" ? fmtInt(t[key]) : t[key];
}

function drawTotals(el, r) {
  const signed = (n) => (n > 0 ? `+${fmtInt(n)}` : n < 0 ? `−${fmtInt(-n)}` : "0");
  const shownDelta = (key) => {
    if (key === "cost_usd") {
      const n = Number(r.delta.cost_usd);
      const abs = Math.abs(n);
      return n === 0 ? "0" : `${n > 0 ? "+" : "−"}$${abs < 0.01 ? abs.toFixed(6) : abs.toFixed(2)}`;
    }
    return typeof r.a[key] === "number" && typeof r.b[key] === "number" && key !== "grade" ? signed(r.b[key] - r.a[key]) : "";
  };
  replace(el,
    h("h2", { id: "compare-totals-h" }, "Totals"),
    h("table", { class: "compare-totals" },
      h("thead", {}, h("tr", {}, ["", "A", "B", "B − A"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, FACTS.map(([key, label]) => h("tr", { "data-fact": key, class: String(r.a[key]) === String(r.b[key]) ? "" : "differs" },
        h("th", { scope: "row" }, label), h("td", {}, fact(r.a, key)), h("td", {}, fact(r.b, key)),
        h("td", { class: "num" }, shownDelta(key)))),
      h("tr", { "data-fact": "tokens" }, h("th", { scope: "row" }, "Tokens, all"),
        h("td", {}, fmtInt(r.a.tokens_in + r.a.tokens_out)), h("td", {}, fmtInt(r.b.tokens_in + r.b.tokens_out)),
        h("td", { class: "num" }, signed(r.delta.tokens))))));
}

function side(s) {
  if (!s) return [h("td", { class: "muted" }, "–"), h("td", {})];
  return [
    h("td", {}, h("span", { class: "tag" }, s.kind || "?"), " ", s.what || ""),
    h("td", { class: "num small" }, s.tokens ? `${fmtInt(s.tokens)} tok` : ""),
  ];
}

function drawSteps(el, r) {
  replace(el,
    h("h2", { id: "compare-steps-h" }, "Steps side by side"),
    r.steps.length
      ? h("table", { class: "compare-steps" },
        h("thead", {}, h("tr", {}, ["Step", "A", "", "B", ""].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, r.steps.map((row) => h("tr", {
          "data-step": row.step,
          "data-same": String(row.same),
          id: row.step === r.diverged_at ? "first-diff" : null,
          class: row.same ? "" : row.step === r.diverged_at ? "differs first" : "differs",
        }, h("td", { class: "num" }, row.same ? String(row.step) : `≠ ${row.step}`), side(row.a), side(row.b)))))
      : h("p", { class: "muted" }, "Neither task has committed a step yet."));
}
