// The stop button: stop every task of an end user, an agent, an API key or the whole tenant, and
// refuse new ones until resumed. A stop is asked for in a confirmation dialog that names the
// scope and what it will do (a cancel cannot be undone); a resume is one click.

import { get, post } from "./api.js";
import { fmtAgo, h, replace } from "./dom.js";

const KINDS = [["user", "End user"], ["agent", "Agent"], ["key", "API key id"], ["tenant", "Whole tenant"]];

export function stopsPage(ctx) {
  const notice = h("p", { class: "notice", role: "status", hidden: true });
  const body = h("tbody");
  const kind = h("select", { id: "stop-kind" }, KINDS.map(([k, label]) => h("option", { value: k }, label)));
  const value = h("input", { id: "stop-value", class: "mono", placeholder: "alice, shopper, key_…, your tenant", maxlength: 128 });
  const reason = h("input", { id: "stop-reason", placeholder: "why (optional)", maxlength: 500 });
  const form = h("form", { id: "stop-form", class: "row" },
    h("label", { for: "stop-kind" }, "Stop"), kind, value, reason,
    h("button", { type: "submit", class: "danger" }, "Stop…"));
  const question = h("p", { id: "stop-question" });
  const confirm = h("dialog", { id: "stop-dialog", "aria-labelledby": "stop-question" },
    h("form", { method: "dialog" }, question,
      h("p", { class: "muted" }, "Running and queued tasks are cancelled now, sub-agents included (a cancel cannot be ",
        "undone), and new ones are refused until you resume."),
      h("div", { class: "row" },
        h("button", { value: "cancel", type: "submit", id: "stop-no" }, "Keep running"),
        h("button", { value: "stop", type: "submit", class: "danger", id: "stop-yes" }, "Stop them"))));
  replace(ctx.main,
    h("h1", {}, "Stops"),
    h("p", { class: "muted" }, "A stopped scope has every task cancelled and takes no new one (423) until it is resumed. ",
      "Same as ", h("code", {}, "agentq stop --user U"), " and ", h("code", {}, "agentq resume --user U"), "."),
    form, notice, confirm,
    h("table", { class: "stops" },
      h("thead", {}, h("tr", {}, ["Scope", "Stopped", "By", "Why", ""].map((c) => h("th", { scope: "col" }, c)))),
      body));

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!value.value.trim()) {
      ctx.showError(new Error("name what to stop"));
      return;
    }
    const what = kind.value === "tenant" ? `the whole tenant ${value.value.trim()}` : `${kind.value} ${value.value.trim()}`;
    question.textContent = `Stop every task of ${what}?`;
    confirm.returnValue = "";
    confirm.showModal();
  });
  confirm.addEventListener("close", async () => {
    if (confirm.returnValue !== "stop") return;
    const scope = { [kind.value]: value.value.trim() };
    try {
      const done = await post("stops", { ...scope, reason: reason.value });
      ctx.showError(null);
      notice.textContent = `Stopped ${done.stop.kind} ${done.stop.value}: ${done.cancelled.length} tasks cancelled` +
        `${done.created ? "" : " (it was stopped already)"}.`;
      notice.hidden = false;
      await refresh(true);
    } catch (err) {
      ctx.showError(err);
    }
  });

  let shown = "";
  async function refresh(force) {
    const page = await get("stops");
    const sig = JSON.stringify(page);
    if (sig === shown && !force) return;
    shown = sig;
    replace(body, page.stops.length
      ? page.stops.map(row)
      : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "Nothing is stopped.")));
  }

  function row(s) {
    const resume = h("button", { type: "button", id: `resume-${s.kind}-${s.value}` }, "Resume");
    resume.addEventListener("click", async () => {
      resume.disabled = true;
      try {
        await post("stops/resume", { [s.kind]: s.value });
        ctx.showError(null);
        notice.textContent = `Resumed ${s.kind} ${s.value}: new tasks are accepted; the cancelled ones stay cancelled.`;
        notice.hidden = false;
        await refresh(true);
      } catch (err) {
        ctx.showError(err);
        resume.disabled = false;
      }
    });
    return h("tr", { "data-stop": `${s.kind}:${s.value}` },
      h("td", { class: "mono" }, `${s.kind} ${s.value}`),
      h("td", {}, fmtAgo(s.stopped_at)),
      h("td", { class: "mono" }, s.by || "–"),
      h("td", {}, s.reason || "–"),
      h("td", { class: "actions" }, resume));
  }

  return ctx.every(5000, () => refresh(false));
}
