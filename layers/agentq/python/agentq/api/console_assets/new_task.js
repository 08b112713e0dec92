// A new task from the browser: the body POST /tasks takes, from a template.

import { post } from "./api.js";
import { jsonForm } from "./json_form.js";

const TEMPLATE = {
  goal: "",
  provider: "anthropic",
  model: "claude-sonnet-4-6",
  constraints: { tools: [], max_tokens: 100000 },
  metadata: {},
};

export function newTaskForm(ctx) {
  return jsonForm({
    id: "new-task",
    title: "New task",
    help: "The body of POST /tasks (the API explorer has every field): goal, provider and model or an agent, constraints, metadata, depends_on, notify.",
    value: TEMPLATE,
    label: "Submit",
    send: async (submission) => {
      const out = await post("tasks", submission);
      ctx.go(`#/tasks/${encodeURIComponent(out.task_id)}`);
    },
  });
}
