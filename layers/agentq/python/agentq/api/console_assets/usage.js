// Usage: the last 24 hours by end user (GET /usage's users: a key sees its tenant's users, a
// user's token only its own row), and the caps per end user, agent and API key with what each
// window holds now against its cap (GET /usage's caps; set them with `agentq caps set` or PUT /caps).

import { get } from "./api.js";
import { fmtInt, fmtUsd, h, replace } from "./dom.js";

function capText(limits, window) {
  const prefix = window === "hour" ? "hourly" : "daily";
  const parts = [];
  if (limits[`${prefix}_tokens`] !== null && limits[`${prefix}_tokens`] !== undefined) {
    const soft = limits[`soft_${prefix}_tokens`];
    parts.push(`${fmtInt(limits[`${prefix}_tokens`])} tokens` + (soft !== null && soft !== undefined ? ` (ask above ${fmtInt(soft)})` : ""));
  }
  if (limits[`${prefix}_usd`] !== null && limits[`${prefix}_usd`] !== undefined) {
    const soft = limits[`soft_${prefix}_usd`];
    parts.push(fmtUsd(limits[`${prefix}_usd`]) + (soft !== null && soft !== undefined ? ` (ask above ${fmtUsd(soft)})` : ""));
  }
  return parts.join(", ") || "none";
}

export function usagePage(ctx) {
  const users = h("tbody");
  const caps = h("tbody");
  const since = h("p", { class: "muted small" });
  replace(ctx.main,
    h("h1", {}, "Usage"),
    h("h2", {}, "By end user, last 24 hours"),
    since,
    h("table", { class: "users-usage" },
      h("thead", {}, h("tr", {}, ["User", "Trees", "Running", "Tokens", "Cost", "Unknown tokens"].map((c) => h("th", { scope: "col" }, c)))),
      users),
    h("h2", {}, "Caps"),
    h("p", { class: "muted" }, "Per end user, agent and API key: a call that would pass a cap waits for its window; one past a soft threshold pauses for approval. Set them with ",
      h("code", {}, "agentq caps set"), " or PUT /caps."),
    h("table", { class: "caps" },
      h("thead", {}, h("tr", {}, ["Scope", "Name", "Hourly cap", "This hour", "Daily cap", "Today"].map((c) => h("th", { scope: "col" }, c)))),
      caps));

  let shown = "";
  async function refresh() {
    const u = await get("usage");
    const sig = JSON.stringify([u.users, u.caps]);
    if (sig === shown) return;
    shown = sig;
    since.textContent = u.users_complete ? "" : "More trees than one read counts: the newest are shown.";
    replace(users, u.users.length
      ? u.users.map((r) => h("tr", { "data-user": r.user },
        h("td", { class: "mono" }, r.user),
        h("td", { class: "num" }, fmtInt(r.trees)),
        h("td", { class: "num" }, fmtInt(r.running)),
        h("td", { class: "num" }, fmtInt(r.known_tokens)),
        h("td", { class: "num" }, fmtUsd(r.known_usd)),
        h("td", { class: "num" }, fmtInt(r.unknown_tokens))))
      : h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No task acted for an end user in the last 24 hours.")));
    replace(caps, u.caps.length
      ? u.caps.map((c) => h("tr", { "data-cap": `${c.scope}/${c.name}` },
        h("td", {}, c.scope),
        h("td", { class: "mono" }, c.name),
        h("td", {}, capText(c.limits, "hour")),
        h("td", { class: "num" }, `${fmtInt(c.hour.tokens)} tokens, ${fmtUsd(c.hour.usd)}`),
        h("td", {}, capText(c.limits, "day")),
        h("td", { class: "num" }, `${fmtInt(c.day.tokens)} tokens, ${fmtUsd(c.day.usd)}`)))
      : h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No caps.")));
  }

  return ctx.every(5000, refresh);
}
