// Circuit breakers: each provider/model the fleet recorded a failed call or a 429 for, its
// circuit (closed, open, half-open), the failures counted and when an open one probes again.
// The one place besides the worker logs and the table that says why tasks are deferred.

import { get } from "./api.js";
import { fmtInt, fmtTime, h, replace } from "./dom.js";

export function breakersPage(ctx) {
  const rules = h("p", { class: "muted" });
  const body = h("tbody");
  replace(ctx.main,
    h("h1", {}, "Circuit breakers"),
    h("p", { class: "muted" }, "Shared by the whole fleet, per provider and model. While a circuit is open its tasks are deferred (not failed) or sent to a fallback; after the cooldown one probe call decides. Also ",
      h("code", {}, "agentq breakers"), " and GET /breakers."),
    rules,
    h("table", { class: "breakers" },
      h("thead", {}, h("tr", {}, ["Provider / model", "State", "Failures", "Since", "Opened", "Probe after", "Slowed until"].map((c) => h("th", { scope: "col" }, c)))),
      body));

  let shown = "";
  async function refresh() {
    const view = await get("breakers");
    const sig = JSON.stringify(view);
    if (sig === shown) return;
    shown = sig;
    rules.textContent = `A circuit opens after ${view.failures_to_open} failed calls within ${view.window_seconds} s and probes after ${view.cooldown_seconds} s.`;
    replace(body, view.breakers.length
      ? view.breakers.map((b) => h("tr", { "data-breaker": `${b.provider}/${b.model}` },
        h("td", { class: "mono" }, `${b.provider}/${b.model}`),
        h("td", {}, h("span", { class: b.state === "closed" ? "tag" : "tag err" }, b.state.replace("_", "-"))),
        h("td", { class: "num" }, fmtInt(b.failures)),
        h("td", {}, fmtTime(b.window_started_at)),
        h("td", {}, fmtTime(b.opened_at)),
        h("td", {}, fmtTime(b.probe_after)),
        h("td", {}, fmtTime(b.slowed_until))))
      : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No failures recorded: every circuit is closed.")));
  }

  return ctx.every(5000, refresh);
}
