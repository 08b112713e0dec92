// The console's shell: hash routes, the key dialog, the alert line, and a poller per page.

import { ApiError, getKey, setKey, stats } from "./api.js";
import { agentListPage, agentPage } from "./agents.js";
import { breakersPage } from "./breakers.js";
import { deadLettersPage } from "./dead_letters.js";
import { memoryListPage, memoryStorePage } from "./memory.js";
import { policiesPage } from "./policies.js";
import { comparePage } from "./compare.js";
import { replace } from "./dom.js";
import { schedulesPage } from "./schedules.js";
import { taskListPage } from "./task_list.js";
import { taskPage } from "./task.js";
import { usagePage } from "./usage.js";
import { vaultPage } from "./vault.js";
import { stopsPage } from "./stops.js";

const main = document.getElementById("main");
const alertBox = document.getElementById("alert");
const live = document.getElementById("live");
const dialog = document.getElementById("key-dialog");
const keyInput = document.getElementById("key-input");

// A page is a function (ctx) that renders into ctx.main and may call ctx.every(ms, fn) to poll.
const routes = [
  [/^#\/tasks\/([^/]+)$/, (ctx, m) => taskPage(ctx, decodeURIComponent(m[1]))],
  [/^#\/agents\/([^/]+)$/, (ctx, m) => agentPage(ctx, decodeURIComponent(m[1]))],
  [/^#\/agents$/, (ctx) => agentListPage(ctx)],
  [/^#\/memory\/([^/]+)$/, (ctx, m) => memoryStorePage(ctx, decodeURIComponent(m[1]))],
  [/^#\/memory$/, (ctx) => memoryListPage(ctx)],
  [/^#\/vault\/([^/]+)$/, (ctx, m) => vaultPage(ctx, decodeURIComponent(m[1]))],
  [/^#\/vault$/, (ctx) => vaultPage(ctx, "")],
  [/^#\/stops$/, (ctx) => stopsPage(ctx)],
  [/^#\/policies$/, (ctx) => policiesPage(ctx)],
  [/^#\/compare\/([^/]+)\/([^/]+)$/, (ctx, m) => comparePage(ctx, decodeURIComponent(m[1]), decodeURIComponent(m[2]))],
  [/^#\/schedules$/, (ctx) => schedulesPage(ctx)],
  [/^#\/dead-letters$/, (ctx) => deadLettersPage(ctx)],
  [/^#\/breakers$/, (ctx) => breakersPage(ctx)],
  [/^#\/usage$/, (ctx) => usagePage(ctx)],
  [/^(#\/?(tasks)?)?$/, (ctx) => taskListPage(ctx)],
];

let current = null;

export function showError(err) {
  if (!err) {
    alertBox.hidden = true;
    alertBox.textContent = "";
    return;
  }
  const status = err instanceof ApiError && err.status ? `${err.status} ${err.code}: ` : "";
  alertBox.textContent = `${status}${err.message}`;
  alertBox.hidden = false;
  if (err instanceof ApiError && err.status === 401) {
    if (current) current.stop(); // nothing to poll without a key; the page is drawn again once one is given
    openKeyDialog();
  }
}

function openKeyDialog() {
  if (dialog.open) return;
  keyInput.value = getKey();
  dialog.returnValue = "";
  dialog.showModal();
  keyInput.focus();
}

class Context {
  constructor() {
    this.main = main;
    this.showError = showError;
    this.timers = [];
    this.stopped = false;
    this.abort = new AbortController(); // ends the page's event streams when it is left
  }

  // Run fn now and then every ms while this page is shown; an error is shown, and polling goes on.
  every(ms, fn) {
    const tick = async () => {
      if (this.stopped) return;
      if (!document.hidden) {
        try {
          await fn();
        } catch (err) {
          if (!this.stopped) showError(err);
        }
      }
      if (!this.stopped) this.timers.push(window.setTimeout(tick, ms));
    };
    return tick();
  }

  stop() {
    this.stopped = true;
    this.timers.forEach((t) => window.clearTimeout(t));
    this.abort.abort();
  }

  go(hash) {
    window.location.hash = hash;
  }
}

function render() {
  if (current) current.stop();
  showError(null);
  const hash = window.location.hash;
  for (const link of document.querySelectorAll("[data-nav]")) {
    const section = (hash.match(/^#\/([a-z-]+)/) || [null, "tasks"])[1];
    const active = section === link.dataset.nav;
    if (active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  current = new Context();
  replace(main);
  for (const [pattern, page] of routes) {
    const m = hash.match(pattern);
    if (m) {
      Promise.resolve(page(current, m)).catch(showError);
      return;
    }
  }
  current.go("#/tasks");
}

function updateLive() {
  const when = stats.last ? stats.last.toLocaleTimeString("en-GB", { hour12: false }) : "–";
  live.textContent = `live · ${when} · ${stats.requests} calls, ${stats.notModified} not modified`;
}

dialog.addEventListener("close", () => {
  if (dialog.returnValue !== "cancel" && keyInput.value.trim()) {
    setKey(keyInput.value.trim());
    render();
  }
});
document.getElementById("key-form").addEventListener("submit", () => {
  dialog.returnValue = "save";
});
document.getElementById("key-forget").addEventListener("click", () => {
  setKey("");
  keyInput.value = "";
  dialog.close("cancel");
  render();
});
document.getElementById("key-button").addEventListener("click", openKeyDialog);
window.addEventListener("hashchange", render);
window.setInterval(updateLive, 1000);
render();
