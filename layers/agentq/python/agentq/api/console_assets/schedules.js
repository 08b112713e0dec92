// Schedules: each one's expression, next fire, what it submits, the task it last started and
// the fires refused (their latest reason on hover);
// delete one (asked twice: the button turns into a confirmation).

import { all, del } from "./api.js";
import { fmtInt, fmtTime, h, json, replace, shortId, taskLink } from "./dom.js";

export function schedulesPage(ctx) {
  const notice = h("p", { class: "notice", role: "status", hidden: true });
  const body = h("tbody");
  replace(ctx.main,
    h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "Tasks submitted on a cron or rate expression (UTC), one per fire time. Create one with ",
      h("code", {}, "agentq schedules create"), " or POST /schedules."),
    notice,
    h("table", { class: "schedules" },
      h("thead", {}, h("tr", {}, ["Schedule", "Expression", "Next fire", "Overlap", "Fired", "Skipped", "Failed", "Last task", "Submits", ""].map((c) => h("th", { scope: "col" }, c)))),
      body));

  let shown = "";
  async function refresh(force) {
    const page = { schedules: await all("schedules", "schedules", 100) };  // every page
    const sig = JSON.stringify(page);
    if (sig === shown && !force) return;
    shown = sig;
    replace(body, page.schedules.length
      ? page.schedules.map(row)
      : h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No schedules.")));
  }

  function row(s) {
    const remove = h("button", { type: "button", class: "danger", id: `delete-${s.name}` }, "Delete");
    let armed = false;
    remove.addEventListener("click", async () => {
      if (!armed) {
        armed = true;
        remove.textContent = `Delete ${s.name}? Click again`;
        return;
      }
      remove.disabled = true;
      try {
        await del(`schedules/${encodeURIComponent(s.name)}`);
        ctx.showError(null);
        notice.textContent = `Deleted schedule ${s.name}: it fires no more; tasks it started go on.`;
        notice.hidden = false;
        await refresh(true);
      } catch (err) {
        ctx.showError(err);
        remove.disabled = false;
      }
    });
    const sub = s.submission;
    return h("tr", { "data-schedule": s.name },
      h("td", { class: "mono" }, s.name),
      h("td", { class: "mono" }, s.expression),
      h("td", {}, fmtTime(s.next_fire_at)),
      h("td", {}, s.overlap),
      h("td", { class: "num" }, fmtInt(s.fired)),
      h("td", { class: "num" }, fmtInt(s.skipped)),
      // a fire whose stored submission was refused: why the latest one was, on hover
      h("td", { class: "num", title: s.last_error || null }, fmtInt(s.failed || 0)),
      h("td", {}, s.last_task_id ? taskLink(s.last_task_id, shortId(s.last_task_id)) : "–"),
      h("td", {}, h("details", {}, h("summary", {}, sub.agent ? `agent ${sub.agent}: ` : "", String(sub.goal || "").slice(0, 60)), json(sub))),
      h("td", { class: "actions" }, remove));
  }

  return ctx.every(5000, () => refresh(false));
}
