// Elements are built with textContent only: goals, tool inputs and model output are data, never markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const STATUSES = [
  "queued", "blocked", "running", "waiting", "paused", "idle", "succeeded", "failed", "cancelled", "cost_exceeded", "timed_out",
  "failed_outcome",
];
export const TERMINAL = new Set(["succeeded", "failed", "cancelled", "cost_exceeded", "timed_out", "failed_outcome"]);

export function badge(status) {
  return h("span", { class: `badge s-${status}` }, status.replace("_", " "));
}

// Long ids shortened to their ends: a sub-agent's id starts with its parent's, so the tail tells them apart.
export function shortId(id) {
  return id.length > 24 ? `${id.slice(0, 8)}…${id.slice(-8)}` : id;
}

export function taskLink(id, text) {
  return h("a", { href: `#/tasks/${encodeURIComponent(id)}`, class: "mono" }, text || id);
}

export function fmtInt(n) {
  return Number(n || 0).toLocaleString("en-US");
}

export function fmtUsd(s) {
  const n = Number(s || 0);
  return `$${n < 1 ? n.toFixed(4) : n.toFixed(2)}`;
}

export function fmtTime(epoch) {
  if (!epoch) return "–";
  const d = new Date(epoch * 1000);
  return d.toLocaleTimeString("en-GB", { hour12: false }) + (isToday(d) ? "" : ` ${d.toISOString().slice(0, 10)}`);
}

function isToday(d) {
  const now = new Date();
  return d.toDateString() === now.toDateString();
}

export function fmtAgo(epoch) {
  if (!epoch) return "–";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  return s < 10 ? `${s.toFixed(2)} s` : `${s.toFixed(1)} s`;
}

export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

// What a page shows when the API refused what it asked for (unknown id, another tenant's): the
// API's own code and message, never a blank page. A 401 (a link opened in a tab that has no key
// yet) goes to ctx.showError, which asks for the key and draws the page again once it is given:
// drawn here, it said "401 unauthorized" and never asked.
export function errorPage(ctx, title, err, back) {
  if (err.status === 401) {
    ctx.showError(err);
    return;
  }
  replace(ctx.main,
    h("h1", {}, title),
    h("div", { class: "error-page", role: "alert" },
      h("p", {}, h("strong", {}, `${err.status || ""} ${err.code || "error"}`.trim())),
      h("p", { class: "error-message" }, err.message),
      h("p", {}, h("a", { href: back.href }, back.text))));
}
