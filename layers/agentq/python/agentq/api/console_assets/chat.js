// A task as a conversation: the goal, each answer and each message a person sent, as chat
// bubbles in commit order, with a box to send the next message and a button to interrupt the
// agent while it works. Everything here goes through the public API (POST /tasks/{id}/messages,
// /interrupt); text is set with textContent only.

import { post } from "./api.js";
import { TERMINAL, h, replace } from "./dom.js";

// The statuses POST /tasks/{id}/interrupt takes (storage.messages.interrupt): a waiting or paused
// task is 409, so the button is offered only here (it was offered on those too, each click refused).
const INTERRUPTIBLE = new Set(["running", "queued"]);
const CLOSED_TO_MESSAGES = new Set(["failed", "cancelled", "timed_out", "failed_outcome"]);

// What the conversation (and the steps table) says of a follow-up, an interrupt and the stop it
// caused: the trace's transitions of those names (their detail: the message's number).
export const MARKS = {
  follow_up: (d) => `↳ new turn: your follow-up (message ${d.message}) reopened the conversation`,
  interrupt_requested: (d) => d.message ? `■ you interrupted the agent with message ${d.message}` : "■ you interrupted the agent",
  interrupted: () => "the agent stopped at its first safe point: idle until your next message",
};

// The conversation as it happened: user turns are the goal and the messages as their steps
// delivered them, agent turns the answers of LLM calls (a discarded answer, an orphan, never
// joined it); between them, in the order they happened, the interrupts and the stops they caused.
// A follow-up's message is its new turn; the moment it reopened the task is the steps table's.
export function turns(goal, events) {
  const out = [{ who: "you", text: goal, id: "turn-goal" }];
  let marks = 0;
  for (const e of events) {
    if (e.type === "message") out.push({ who: "you", text: e.text, id: `turn-m${e.seq}` });
    else if (e.type === "llm_call" && !e.orphan && e.purpose === "turn" && e.text) {
      out.push({ who: "agent", text: e.text, id: `turn-s${e.step}` });
    } else if (e.type === "transition" && e.event !== "follow_up" && MARKS[e.event]) {
      out.push({ who: "mark", kind: e.event, text: MARKS[e.event](e.detail || {}), id: `turn-x${++marks}` });
    }
  }
  return out;
}

export function drawChat(el, v, events, env) {
  const list = h("ol", { class: "chat", id: "chat" },
    turns(v.goal, events).map((t) => t.who === "mark"
      ? h("li", { class: `mark ${t.kind}`, id: t.id, "data-mark": t.kind }, t.text)
      : h("li", { class: `bubble ${t.who}`, id: t.id },
        h("span", { class: "who" }, t.who === "you" ? "you" : "agent"), h("p", {}, t.text))));
  const parts = [h("h2", { id: "chat-h" }, "Conversation"), list];
  if (v.status === "idle") parts.push(h("p", { class: "activity", id: "chat-idle" }, "Interrupted: say what the agent should do next."));
  if (v.live_text) parts.push(h("p", { class: "bubble agent live", id: "chat-live" }, v.live_text));
  if (!v.parent_id && !CLOSED_TO_MESSAGES.has(v.status) && v.status !== "cost_exceeded") {
    const box = h("textarea", { id: "message-text", rows: 2, maxlength: 32000, "aria-label": "Message to the agent" });
    const send = h("button", { type: "button", class: "primary", id: "send-message" }, TERMINAL.has(v.status) ? "Send follow-up" : "Send");
    send.addEventListener("click", () => env.act(send, (out) => out.reopened
      ? `Follow-up sent (message ${out.seq}): the agent answers it next.`
      : `Message ${out.seq} sent: the agent reads it at its next turn.`, async () => {
      const text = box.value;
      const out = await post(`${env.path}/messages`, { text });
      box.value = "";
      return out;
    }));
    const row = h("div", { class: "row" }, box, send);
    if (INTERRUPTIBLE.has(v.status)) {
      const stop = h("button", { type: "button", class: "danger", id: "interrupt" }, "Interrupt");
      stop.addEventListener("click", () => env.act(stop, () => "Interrupt recorded: the agent stops at its earliest safe point.",
        () => post(`${env.path}/interrupt`)));
      row.append(stop);
    }
    parts.push(row);
  }
  replace(el, parts);
}
