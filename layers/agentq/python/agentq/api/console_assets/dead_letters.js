// Dead letters per tier: each message's reason and its task's status; redrive a tier's messages,
// the ones the page shows (by their message ids): a dead letter that came after the last poll
// (every 5 s) was never shown, and stays where it is.

import { get, post } from "./api.js";
import { badge, fmtTime, h, replace, shortId, taskLink } from "./dom.js";

const TIERS = ["high", "normal", "low"];

export function deadLettersPage(ctx) {
  const notice = h("p", { class: "notice", role: "status", hidden: true });
  const sections = Object.fromEntries(TIERS.map((t) => [t, h("section", { class: "card", "aria-labelledby": `dlq-${t}` })]));
  replace(ctx.main,
    h("h1", {}, "Dead letters"),
    h("p", { class: "muted" }, "Messages of your tasks that agentq or SQS gave up on. A redrive sends them back; each task resumes from its last committed step."),
    notice,
    TIERS.map((t) => sections[t]));

  const listed = Object.fromEntries(TIERS.map((t) => [t, []])); // tier -> the message ids drawn
  // A tier's redrive in flight (a slow one: a tier holding many other tenants' messages): its button
  // is drawn disabled until it is done, also the new one each poll draws meanwhile. Drawn enabled,
  // a press on it sent a second redrive.
  const running = new Set();
  const buttons = {}; // tier -> its button as drawn last

  async function redrive(tier) {
    const ids = listed[tier];
    if (running.has(tier) || !ids.length) return;
    running.add(tier);
    buttons[tier].disabled = true;
    try {
      const out = await post(`dead-letters/${tier}/redrive`, { message_ids: ids });
      ctx.showError(null);
      const gone = ids.length - out.moved; // redriven meanwhile (another tab, the CLI): no longer there
      notice.textContent = `Redrove ${out.moved} message(s) of the ${tier} tier${out.task_ids.length ? `: ${out.task_ids.join(", ")}` : ""}.`
        + (gone > 0 ? ` ${gone} of those shown were no longer there.` : "");
      notice.hidden = false;
      await refresh();
    } catch (err) {
      ctx.showError(err);
    } finally {
      running.delete(tier);
      buttons[tier].disabled = !listed[tier].length;
    }
  }

  let shown = "";
  let asked = 0;

  async function refresh() {
    // The poll and a redrive's own refresh can be in flight together: only the answer to the
    // latest request is drawn, so a slow older one never puts back rows the redrive moved.
    const ask = ++asked;
    const page = await get("dead-letters");
    if (ask !== asked) return;
    const sig = JSON.stringify(page);
    if (sig === shown) return;
    shown = sig;
    for (const tier of TIERS) {
      const letters = page.dead_letters.filter((d) => d.tier === tier);
      listed[tier] = letters.map((d) => d.message_id);
      const button = h("button", { type: "button", id: `redrive-${tier}`, disabled: running.has(tier) || !letters.length }, `Redrive ${tier}`);
      button.addEventListener("click", () => redrive(tier));
      buttons[tier] = button;
      replace(sections[tier],
        h("div", { class: "row spread" }, h("h2", { id: `dlq-${tier}` }, `${tier} (${letters.length})`), button),
        letters.length
          ? h("table", {},
            h("thead", {}, h("tr", {}, ["Task", "Task status", "Reason", "Dead-lettered"].map((c) => h("th", { scope: "col" }, c)))),
            h("tbody", {}, letters.map((d) => h("tr", { "data-task": d.task_id },
              h("td", {}, taskLink(d.task_id, shortId(d.task_id))), h("td", {}, badge(d.task_status)),
              h("td", { class: "reason" }, d.reason), h("td", {}, fmtTime(d.sent_at))))))
          : h("p", { class: "muted" }, "Empty."));
    }
  }

  return ctx.every(5000, refresh);
}
