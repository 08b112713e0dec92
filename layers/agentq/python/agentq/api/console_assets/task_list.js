// Tasks, newest first: status filters with live counts, search by id, goal or metadata. A search
// of key=value pairs is the API's (GET /tasks?metadata=...: every task of the tenant, not only the
// pages loaded); any other text filters the loaded tasks here.

import { get } from "./api.js";
import { newTaskForm } from "./new_task.js";
import { STATUSES, badge, fmtAgo, fmtInt, fmtUsd, h, replace, shortId, taskLink } from "./dom.js";

const PAGE = 100;
const CATCH_UP_PAGES = 10; // newer pages read at most in one poll to reach the newest task shown
const ID = /^[A-Za-z0-9_-]{1,128}$/;

// Where a task stands in the listing: the API's own order (its index's sort key, creation time in
// epoch milliseconds then the task id: storage/keys.tenant_index_sk); a newer task's sorts after.
function order(t) {
  return `${String(Math.trunc(t.created_at * 1000)).padStart(15, "0")}#${t.task_id}`;
}

export function taskListPage(ctx) {
  const params = new URLSearchParams(window.location.hash.split("?")[1] || "");
  const state = { status: params.get("status") || "", query: "", meta: null, children: false, rows: null, older: false, cursor: null };
  let asked = 0; // the latest refresh: only its answer is drawn
  let searchTimer = null;

  const counts = h("div", { class: "filters", role: "group", "aria-label": "Filter by status" });
  const countNote = h("p", { class: "muted small" });
  // This tenant's running slots (GET /usage): running and waiting tasks against its limit.
  const usageNote = h("p", { id: "tenant-usage", class: "muted small" });
  // Every tenant's slots (GET /usage/tenants), for an operator's key only (GET /usage says
  // whether the key is one, so a tenant's key never makes a request bound to be refused).
  const tenantsBody = h("tbody");
  const tenantsTable = h("section", { id: "tenants-usage", hidden: true },
    h("h2", {}, "Tenants"),
    h("table", { class: "tenants" },
      h("thead", {}, h("tr", {}, ["Tenant", "Running", "Waiting", "Limit", "Weight"].map((c) => h("th", { scope: "col" }, c)))),
      tenantsBody));
  const search = h("input", {
    id: "task-search",
    type: "search",
    placeholder: "id, goal, or key=value (metadata)",
    oninput: () => {
      state.query = search.value.trim();
      const meta = metadataPairs(state.query);
      if (JSON.stringify(meta) === JSON.stringify(state.meta)) {
        draw();
        return;
      }
      state.meta = meta;
      state.older = false;
      window.clearTimeout(searchTimer);
      searchTimer = window.setTimeout(() => refresh().catch(ctx.showError), 300);
    },
  });
  const childrenBox = h("input", {
    id: "include-children",
    type: "checkbox",
    onchange: () => {
      state.children = childrenBox.checked;
      state.older = false;
      refresh().catch(() => {});
    },
  });
  const body = h("tbody");
  const more = h("button", { type: "button", class: "quiet", hidden: true, onclick: () => loadOlder() }, "Load older tasks");
  const lookup = h("p", { class: "muted", hidden: true });

  replace(
    ctx.main,
    h("h1", {}, "Tasks"),
    newTaskForm(ctx),
    counts,
    usageNote,
    tenantsTable,
    countNote,
    h("div", { class: "row" },
      h("label", { for: "task-search" }, "Search"), search,
      h("label", { class: "check" }, childrenBox, " include sub-agents")),
    lookup,
    h("table", { class: "tasks" },
      h("thead", {}, h("tr", {}, ["Task", "Status", "Goal", "Step", "Tokens", "Cost", "Created", "Metadata"].map((c) => h("th", { scope: "col" }, c)))),
      body),
    more,
  );

  function query(extra) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (state.children) q.set("include_children", "true");
    for (const [k, v] of Object.entries(extra || {})) if (v) q.set(k, v);
    for (const pair of state.meta || []) q.append("metadata", pair);
    return `tasks?${q}`;
  }

  function drawUsage(u) {
    const limit = u.max_running === null ? "no running limit" : `limit ${fmtInt(u.max_running)} running`;
    usageNote.textContent =
      `${fmtInt(u.running)} running, ${fmtInt(u.waiting)} waiting for a slot (${limit}), weight ${fmtInt(u.weight)}`;
    if (u.operator) get("usage/tenants").then(drawTenants, () => { tenantsTable.hidden = true; });
    else tenantsTable.hidden = true;
  }

  function drawTenants(all) {
    replace(tenantsBody, all.tenants.map((t) =>
      h("tr", { "data-tenant": t.tenant },
        h("td", {}, t.tenant),
        h("td", { class: "num" }, fmtInt(t.running)),
        h("td", { class: "num" }, fmtInt(t.waiting)),
        h("td", { class: "num" }, t.max_running === null ? "none" : fmtInt(t.max_running)),
        h("td", { class: "num" }, fmtInt(t.weight)))));
    tenantsTable.hidden = false;
  }

  // Once older pages are loaded (state.older), the first page read again is merged by id: pages are
  // read from the top until they reach the newest task shown, and what they cover replaces what was
  // shown there; the older tasks below stay. The first page alone, shown above the older pages as
  // they were loaded, left out every task that newer ones had pushed off it.
  async function refresh() {
    const ask = ++asked;
    const everything = await get(query());
    get("usage").then(drawUsage, () => { usageNote.textContent = ""; tenantsTable.hidden = true; }); // once the key is known to work
    const page = state.status ? await get(query({ status: state.status })) : everything;
    let fresh = page.tasks;
    let next = page.next_cursor;
    // Does `fresh` reach the newest task shown (with older pages loaded; else there is none to reach)?
    const reached = () => state.older && state.rows.length > 0 && fresh.length > 0
      && order(fresh[fresh.length - 1]) <= order(state.rows[0]);
    for (let n = 0; state.older && next && !reached() && n < CATCH_UP_PAGES; n += 1) {
      const more = await get(`${query({ status: state.status })}&cursor=${encodeURIComponent(next)}`);
      fresh = fresh.concat(more.tasks);
      next = more.next_cursor;
    }
    if (ask !== asked) return;
    if (next && reached()) {
      // Everything from the top of the listing down to `edge` is in `fresh`: a task shown above
      // it and not in `fresh` has left the listing (a status filter's, or gone).
      const edge = order(fresh[fresh.length - 1]);
      const ids = new Set(fresh.map((t) => t.task_id));
      const kept = state.rows.filter((t) => !ids.has(t.task_id) && order(t) < edge);
      state.rows = fresh.concat(kept);
      if (!kept.length) state.cursor = next; // `fresh` reaches past every task that was shown
    } else {
      state.rows = fresh; // the whole listing, or more newer tasks than a poll reads: from the top again
      state.cursor = next;
      state.older = Boolean(next) && fresh.length > PAGE;
    }
    drawCounts(everything);
    draw();
  }

  async function loadOlder() {
    const from = state.cursor;
    if (!from) return;
    const page = await get(`${query({ status: state.status })}&cursor=${encodeURIComponent(from)}`);
    if (state.cursor !== from) return; // a refresh or another press moved on meanwhile
    const ids = new Set(state.rows.map((t) => t.task_id));
    state.rows = state.rows.concat(page.tasks.filter((t) => !ids.has(t.task_id)));
    state.older = true;
    state.cursor = page.next_cursor;
    draw();
  }

  function drawCounts(everything) {
    const tally = Object.fromEntries(STATUSES.map((s) => [s, 0]));
    for (const t of everything.tasks) tally[t.status] += 1;
    const chip = (status, label, n) =>
      h("button", {
        type: "button",
        class: `chip${status ? ` s-${status}` : ""}`,
        "aria-pressed": String(state.status === status),
        "data-status": status || "all",
        onclick: () => {
          state.status = status;
          state.older = false;
          refresh().catch(() => {});
        },
      }, label, " ", h("span", { class: "count" }, fmtInt(n)));
    replace(counts, chip("", "all", everything.tasks.length), STATUSES.map((s) => chip(s, s.replace("_", " "), tally[s])));
    countNote.textContent = state.meta
      ? `Tasks whose metadata has ${state.meta.join(" and ")}${everything.next_cursor ? `: counts are over the first ${everything.tasks.length} found` : ""}.`
      : everything.next_cursor ? `Counts are over the newest ${PAGE} tasks.` : "";
  }

  // "customer=acme region=eu": every word a key=value pair, searched for by the API.
  function metadataPairs(q) {
    const words = q.split(/\s+/).filter(Boolean);
    return words.length && words.every((w) => /^[^=]+=/.test(w)) ? words : null;
  }

  function matches(t, q) {
    if (state.meta) return true; // the API already matched every pair
    const needle = q.toLowerCase();
    if (t.task_id.toLowerCase().includes(needle) || t.goal.toLowerCase().includes(needle)) return true;
    return Object.entries(t.metadata || {}).some(([k, v]) => `${k}=${v}`.toLowerCase().includes(needle));
  }

  function draw() {
    const rows = (state.rows || []).filter((t) => !state.query || matches(t, state.query));
    replace(body, rows.map((t) =>
      h("tr", { "data-task": t.task_id },
        h("td", {}, taskLink(t.task_id, shortId(t.task_id))),
        h("td", {}, badge(t.status)),
        h("td", { class: "goal" }, t.parent_id ? h("span", { class: "muted" }, "↳ ") : null, t.goal),
        h("td", { class: "num" }, t.step),
        h("td", { class: "num" }, fmtInt(t.tokens_total)),
        h("td", { class: "num" }, fmtUsd(t.cost_usd)),
        h("td", { title: new Date(t.created_at * 1000).toISOString() }, fmtAgo(t.created_at)),
        h("td", { class: "meta" }, Object.entries(t.metadata || {}).map(([k, v]) => h("span", { class: "kv" }, `${k}=${v}`))),
      )));
    if (!rows.length) {
      body.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, state.meta ? "No task's metadata has that." : state.query ? "No loaded task matches." : "No tasks yet. Submit one: agentq submit \"...\"")));
    }
    const idLike = state.query && ID.test(state.query) && !rows.some((t) => t.task_id === state.query);
    lookup.hidden = !idLike;
    if (idLike) replace(lookup, "Not among the loaded tasks: ", h("a", { href: `#/tasks/${encodeURIComponent(state.query)}` }, `open task ${state.query}`));
    more.hidden = !state.cursor;
  }

  // A metadata search reads up to a thousand tasks a call: kept live, but every 15 s, not 3.
  let searched = { meta: null, at: 0 };
  return ctx.every(3000, () => {
    const same = JSON.stringify(state.meta) === JSON.stringify(searched.meta);
    if (state.meta && same && Date.now() - searched.at < 15000) return undefined;
    searched = { meta: state.meta, at: Date.now() };
    return refresh();
  });
}
