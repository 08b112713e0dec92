// A request body edited as JSON: the new task and new agent-version forms. The API's validation
// is the only one (a refusal shows its code, field and message, and nothing was written); a
// body that is not JSON is caught here before anything is sent.

import { h } from "./dom.js";

export function jsonForm({ id, title, help, value, label, send }) {
  const body = h("textarea", { id: `${id}-json`, rows: 12, spellcheck: "false", class: "mono" }, JSON.stringify(value, null, 2));
  const problem = h("p", { class: "error-box", role: "alert", hidden: true });
  const submit = h("button", { type: "button", class: "primary", id: `${id}-submit` }, label);
  submit.addEventListener("click", async () => {
    problem.hidden = true;
    let parsed;
    try {
      parsed = JSON.parse(body.value);
    } catch (err) {
      problem.textContent = `Not JSON: ${err.message}`;
      problem.hidden = false;
      return;
    }
    submit.disabled = true;
    try {
      await send(parsed);
    } catch (err) {
      problem.textContent = `${err.status || ""} ${err.code}${err.field ? ` (${err.field})` : ""}: ${err.message}`.trim();
      problem.hidden = false;
    } finally {
      submit.disabled = false;
    }
  });
  return h("details", { class: "card json-form" },
    h("summary", { id }, title),
    h("p", { class: "small muted" }, help),
    h("label", { for: `${id}-json` }, "body"),
    body,
    problem,
    h("div", { class: "row" }, submit));
}
