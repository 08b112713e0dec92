// A new task from the browser: the submission as JSON, the same body POST /tasks takes (so
// every field the API has is here, and the API's validation is the only one). Starts from a
// template; a 4xx shows the API's message and field, and nothing is submitted.

import { post } from "./api.js";
import { h } from "./dom.js";

const TEMPLATE = {
  goal: "",
  provider: "anthropic",
  model: "claude-sonnet-4-6",
  constraints: { tools: [], max_tokens: 100000 },
  metadata: {},
};

export function newTaskForm(ctx) {
  const body = h("textarea", { id: "new-task-json", rows: 10, spellcheck: "false", class: "mono" }, JSON.stringify(TEMPLATE, null, 2));
  const problem = h("p", { class: "error-box", role: "alert", hidden: true });
  const submit = h("button", { type: "button", class: "primary", id: "submit-task" }, "Submit");
  submit.addEventListener("click", async () => {
    problem.hidden = true;
    let submission;
    try {
      submission = JSON.parse(body.value);
    } catch (err) {
      problem.textContent = `Not JSON: ${err.message}`;
      problem.hidden = false;
      return;
    }
    submit.disabled = true;
    try {
      const out = await post("tasks", submission);
      ctx.go(`#/tasks/${encodeURIComponent(out.task_id)}`);
    } catch (err) {
      problem.textContent = `${err.status || ""} ${err.code}${err.field ? ` (${err.field})` : ""}: ${err.message}`.trim();
      problem.hidden = false;
    } finally {
      submit.disabled = false;
    }
  });
  return h("details", { class: "card new-task" },
    h("summary", { id: "new-task" }, "New task"),
    h("p", { class: "small muted" }, "The body of POST /tasks (see the API explorer for every field): goal, provider and model or an agent, constraints, metadata, depends_on, notify."),
    h("label", { for: "new-task-json" }, "submission"),
    body,
    problem,
    h("div", { class: "row" }, submit));
}
