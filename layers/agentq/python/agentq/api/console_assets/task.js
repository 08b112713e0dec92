// One task: status, goal, budget gauge, actions the state allows, step timeline, per-step chart,
// trace tree, sub-agents, its files (files.js) and result. It follows the task's event stream (each committed event
// redraws what changed; the live text of a model call shows as it streams) and polls when there
// is no stream, or once the stream has ended. Sections are redrawn only when what they show changed.

import { all, follow, get, post } from "./api.js";
import { budgetGauge, moneyGauge, stepChart } from "./charts.js";
import { MARKS, drawChat } from "./chat.js";
import { filesCard } from "./files.js";
import { policyTags } from "./policies.js";
import {
  TERMINAL, badge, errorPage, fmtInt, fmtSeconds, fmtTime, fmtUsd, h, json, replace, shortId, taskLink,
} from "./dom.js";

const POLL_MS = 1500;
const MAX_CHILDREN = 50;

export async function taskPage(ctx, taskId) {
  const path = `tasks/${encodeURIComponent(taskId)}`;
  let view;
  try {
    view = await get(path);
  } catch (err) {
    errorPage(ctx, h("span", {}, "Task ", h("span", { class: "mono" }, taskId)), err, { href: "#/tasks", text: "Back to the task list" });
    return;
  }

  const el = {
    head: h("section", { class: "head" }),
    gauge: h("section", { class: "card gauge-card", "aria-labelledby": "budget-h" }),
    facts: h("section", { class: "card facts" }),
    actions: h("section", { class: "card actions", "aria-labelledby": "actions-h" }),
    notice: h("p", { class: "notice", role: "status", hidden: true }),
    live: h("pre", { class: "live-text", id: "live-text", "aria-live": "polite", hidden: true }),
    result: h("section", { class: "card", "aria-labelledby": "result-h" }),
    chat: h("section", { class: "card", "aria-labelledby": "chat-h" }),
    children: h("section", { class: "card", "aria-labelledby": "children-h" }),
    timeline: h("section", { class: "card", "aria-labelledby": "timeline-h" }),
    chart: h("section", { class: "card", "aria-labelledby": "chart-h" }),
    trace: h("section", { class: "card", "aria-labelledby": "trace-h" }),
    files: filesCard(path),
  };
  replace(ctx.main,
    el.head,
    compareForm(ctx, taskId),
    el.live,
    el.notice,
    h("div", { class: "grid" }, el.gauge, el.facts, el.actions),
    el.result, el.chat, el.children, el.files.el, el.timeline, el.chart, el.trace);

  const open = new Set(); // trace nodes a person expanded, kept open across redraws (see drawTrace)
  const dependencies = new Map(); // each dependency's status as last read (see dependency)
  let shown = { view: "", actions: "", trace: "", children: "" };

  async function refresh(first) {
    if (!first) view = await get(path);
    const viewSig = JSON.stringify(view);
    if (viewSig === shown.view) return;
    shown.view = viewSig;
    drawHead(el.head, view);
    drawGauge(el.gauge, view);
    drawFacts(el.facts, view, dependencies);
    drawResult(el.result, view);
    const actionSig = JSON.stringify([view.status, view.step, view.fork_at_step, view.depth, view.pending_tool_use_id, view.pending_approval, view.pending_calls, view.model]);
    if (actionSig !== shown.actions) {
      shown.actions = actionSig;
      drawActions(el.actions, view, { ctx, path, notice: el.notice, refresh: () => refresh(false) });
    }
    const traceSig = JSON.stringify([view.status, view.step, view.updated_at, view.latency.resumes, view.live_text]);
    if (traceSig !== shown.trace) {
      const events = await all(`${path}/trace`, "events");
      shown.trace = traceSig;
      drawChat(el.chat, view, events, { path, act: actor({ ctx, notice: el.notice, refresh: () => refresh(false) }) });
      drawTimeline(el.timeline, events);
      const calls = events.filter((e) => e.type === "llm_call");
      replace(el.chart, h("h2", { id: "chart-h" }, "Tokens and latency per step"),
        calls.length ? stepChart(calls) : h("p", { class: "muted" }, "No LLM call yet."),
        h("p", { class: "legend small" }, h("span", { class: "key bar-in" }), " input ", h("span", { class: "key bar-out" }), " output ",
          h("span", { class: "key bar-ms" }), " latency ", h("span", { class: "key retried" }), " retried"));
      drawTrace(el.trace, events, open);
    }
    await el.files.draw(view);
    const childSig = JSON.stringify(view.children);
    if (childSig !== shown.children) {
      shown.children = childSig;
      await drawChildren(el.children, view);
    }
  }

  await refresh(true);
  // Live: each committed event redraws (a burst of them once); uncommitted text shows as it comes.
  let queued = false;
  const redraw = () => {
    if (queued) return;
    queued = true;
    window.setTimeout(() => {
      queued = false;
      refresh(false).catch(ctx.showError);
    }, 100);
  };
  const stream = { streaming: false };
  window.agentqStream = stream; // what the page is doing, for the browser tests
  const onEvent = (event) => {
    if (event.committed) {
      stream.events = (stream.events || 0) + 1;
      el.live.hidden = true;
      el.live.textContent = "";
      redraw();
    } else if (event.type === "agent.message_delta") {
      stream.deltas = (stream.deltas || 0) + 1;
      el.live.textContent = event.data.reset ? event.data.text : el.live.textContent + event.data.text;
      el.live.hidden = false;
    }
  };
  if (!TERMINAL.has(view.status)) {
    try {
      const how = await follow(`${path}/events`, onEvent, ctx.abort.signal, stream);
      stream.ended = how;
      if (how === "stopped") return;
    } catch (err) {
      stream.fallback = err.message; // no stream here: poll
    }
  }
  return ctx.every(POLL_MS, () => refresh(false));
}

function drawHead(el, v) {
  replace(el,
    h("p", { class: "crumbs" }, h("a", { href: "#/tasks" }, "Tasks"),
      v.parent_id ? [" / parent ", taskLink(v.parent_id)] : null,
      v.root_id !== v.task_id && v.root_id !== v.parent_id ? [" / root ", taskLink(v.root_id)] : null),
    h("h1", {}, "Task ", h("span", { class: "mono", id: "task-id" }, v.task_id), " ", badge(v.status)),
    v.activity ? h("p", { class: "activity" }, v.activity) : null,
    v.retry ? h("p", { class: "activity", id: "retry" }, `next try at ${fmtTime(v.retry.next_attempt_at)}`,
      v.retry.error.status_code ? ` · last error HTTP ${v.retry.error.status_code}` : "") : null,
    h("p", { class: "goal-full" }, v.goal),
    v.error ? h("div", { class: "error-box" }, h("strong", {}, v.error.code || "error"), ": ", v.error.message || JSON.stringify(v.error)) : null,
    v.forked_from ? h("p", { class: "muted" }, "Forked from ", taskLink(v.forked_from.task_id), ` at step ${v.forked_from.step} · `,
      h("a", { href: `#/compare/${encodeURIComponent(v.forked_from.task_id)}/${encodeURIComponent(v.task_id)}`, id: "compare-original" },
        "compare with the original")) : null);
}

// "Compare with…": this task beside another of the tenant's (compare.js); drawn once, so what is
// typed survives the page's redraws.
function compareForm(ctx, taskId) {
  const other = h("input", { id: "compare-with", class: "mono", placeholder: "another task id", maxlength: 128, required: true });
  const form = h("form", { id: "compare-form", class: "row" },
    h("label", { for: "compare-with" }, "Compare with…"), other, h("button", { type: "submit" }, "Compare"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = other.value.trim();
    if (id) ctx.go(`#/compare/${encodeURIComponent(taskId)}/${encodeURIComponent(id)}`);
  });
  return form;
}

function drawGauge(el, v) {
  const money = v.budget && v.budget.money;
  replace(el,
    h("h2", { id: "budget-h" }, v.depth ? "Budget (this sub-agent's share)" : "Budget (the whole tree)"),
    h("div", { class: "gauges" },
      h("figure", {}, budgetGauge(v.budget, v.tokens), h("figcaption", { class: "small muted" }, "tokens")),
      money ? h("figure", {}, moneyGauge(money), h("figcaption", { class: "small muted" }, `dollars (max_cost_usd ${fmtUsd(money.cap_usd)})`)) : null),
    h("p", { class: "small" }, `${fmtInt(v.tokens.input)} in · ${fmtInt(v.tokens.output)} out · cost ${fmtUsd(v.cost_usd)}`,
      v.budget ? ` · tree ${fmtUsd(v.budget.cost_usd)}` : "",
      money && Number(money.reserved_usd) ? ` · ${fmtUsd(money.reserved_usd)} held for calls in flight` : ""),
    v.budget && v.budget.unknown ? h("p", { class: "small", id: "unknown-usage" },
      `${fmtInt(v.budget.known)} tokens known · ${fmtInt(v.budget.unknown)} unknown`,
      money ? ` (${fmtUsd(money.known_usd)} known · ${fmtUsd(money.unknown_usd)} unknown)` : "",
      h("span", { class: "muted" }, ": calls whose outcome no worker learned, counted at their holds")) : null);
}

function drawFacts(el, v, known) {
  const row = (k, val) => [h("dt", {}, k), h("dd", {}, val)];
  replace(el, h("h2", {}, "Run"), h("dl", {},
    v.agent ? row("agent", (v.overridden || []).length ? `${v.agent}, but for ${v.overridden.join(", ")}: replaced by a fork`
      : v.agent) : null,
    row("model", `${v.provider} · ${v.model}`),
    row("priority", v.priority),
    row("steps", `${v.step} committed · ${v.llm_steps} of ${v.max_steps} LLM turns`),
    v.grade ? row("grade", gradeFacts(v.grade)) : null,
    row("pickup", fmtSeconds(v.latency.pickup_seconds)),
    row("resumes", String(v.latency.resumes)),
    // The API's view reads no clock (so an unchanged task polls as 304): a running task's run
    // time is counted here, from started_at, as of this drawing.
    row("run time", v.latency.run_seconds !== null ? fmtSeconds(v.latency.run_seconds)
      : v.started_at ? `${fmtSeconds(Date.now() / 1000 - v.started_at)} so far` : "-"),
    row("created", fmtTime(v.created_at)),
    v.finished_at ? row("finished", fmtTime(v.finished_at)) : null,
    v.depends_on.length ? row("runs after", h("ul", { class: "deps", id: "depends-on" }, v.depends_on.map((id) => dependency(id, known)))) : null,
    Object.keys(v.metadata).length ? row("metadata", Object.entries(v.metadata).map(([k, val]) => h("span", { class: "kv" }, `${k}=${val}`))) : null));
}

// The latest grade of the answer against the task's outcome, and what grading cost (counted in the task's
// tokens and cost too, shown apart here).
function gradeFacts(g) {
  const verdict = g.error ? `grader failed: ${g.error.code}` : g.passed ? "passed" : "below the bar";
  const score = g.score === null ? "–" : g.score.toFixed(2);
  const spent = g.tokens_in + g.tokens_out ? ` · grading ${fmtInt(g.tokens_in + g.tokens_out)} tokens · ${fmtUsd(g.cost_usd)}` : "";
  return h("span", { id: "grade", "data-passed": String(g.passed) },
    h("span", { class: `tag ${g.passed ? "" : "err"}` }, verdict), ` score ${score} · bar ${g.bar.toFixed(2)} · attempt ${g.attempt} of ${g.max_attempts}${spent}`,
    g.feedback ? h("div", { class: "small muted" }, `feedback: ${clip(g.feedback, 300)}`) : null);
}

// A dependency's link, and its status once fetched: a blocked task waits on the ones not yet succeeded.
// Each status is kept for the page's life (`known`: id -> what was read) and read again on a redraw
// of the facts (each committed event) only until it has ended: read anew every time, three finished
// dependencies cost 60 GETs a minute. A redraw during a read reads once more after it, so the
// status drawn last is never older than that redraw.
function dependency(id, known) {
  let dep = known.get(id);
  if (!dep) {
    dep = { id, status: null, error: null, reading: false, again: false, span: null };
    known.set(id, dep);
  }
  dep.span = h("span", { class: "dep-status" }); // the one drawn last is the one a read fills in
  drawDependency(dep);
  readDependency(dep);
  return h("li", { "data-dependency": id }, taskLink(id, shortId(id)), dep.span);
}

function readDependency(dep) {
  if (TERMINAL.has(dep.status)) return;
  if (dep.reading) {
    dep.again = true;
    return;
  }
  dep.reading = true;
  dep.again = false;
  get(`tasks/${encodeURIComponent(dep.id)}`)
    .then((d) => { dep.status = d.status; dep.error = null; }, (err) => { dep.error = err.message; })
    .finally(() => {
      dep.reading = false;
      drawDependency(dep);
      if (dep.again) readDependency(dep);
    });
}

function drawDependency(dep) {
  if (dep.status) replace(dep.span, " ", badge(dep.status));
  else if (dep.error) replace(dep.span, ` (${dep.error})`);
}

function drawResult(el, v) {
  if (v.result === null || v.result === undefined) {
    replace(el, h("h2", { id: "result-h" }, "Result"), h("p", { class: "muted" }, TERMINAL.has(v.status) ? "No result." : "Not finished yet."));
    return;
  }
  let body;
  try {
    const parsed = JSON.parse(v.result);
    body = parsed !== null && typeof parsed === "object" ? json(parsed) : null;
  } catch {
    body = null;
  }
  const heading = v.status === "succeeded" ? "Result" : v.status === "failed_outcome" ? "Answer (below its outcome's bar)" : "Partial result";
  replace(el, h("h2", { id: "result-h" }, heading),
    body || h("pre", { class: "text" }, v.result));
}

// A button's action: disabled while it runs, its outcome in the notice (or the API's error), then a redraw.
function actor(env) {
  return async (button, what, call) => {
    button.disabled = true;
    env.notice.hidden = true;
    try {
      const out = await call();
      env.ctx.showError(null);
      env.notice.textContent = what(out);
      env.notice.hidden = false;
      await env.refresh();
    } catch (err) {
      env.ctx.showError(err);
    } finally {
      button.disabled = false;
    }
  };
}

function drawActions(el, v, env) {
  const parts = [h("h2", { id: "actions-h" }, "Actions")];
  const act = actor(env);
  // The decision names the held call this box shows (pending_tool_use_id): if it was decided meanwhile
  // (another reviewer, a double click) and the task holds another, the API refuses (409 naming
  // tool_use_id) rather than decide a call nobody here was shown. The listed call it names is the one
  // marked held: its name is agentq-<step>-<id> when the model gave it an id an earlier call had.
  const held = v.pending_tool_use_id;
  if (v.status === "paused" && held) {
    const note = h("textarea", { id: "decision-note", rows: 2, maxlength: 4000 });
    const approve = h("button", { type: "button", class: "primary", id: "approve" }, "Approve");
    const reject = h("button", { type: "button", class: "danger", id: "reject" }, "Reject");
    const decide = (verb) => post(`${env.path}/${verb}`, { note: note.value, tool_use_id: held });
    approve.addEventListener("click", () => act(approve, () => "Approved: the task is queued to resume.", () => decide("approve")));
    reject.addEventListener("click", () => act(reject, () => "Rejected: the task is queued to resume with the rejection.", () => decide("reject")));
    parts.push(h("div", { class: "approval" },
      h("h3", {}, "Waiting for approval"),
      h("p", {}, v.pending_approval || ""),
      v.pending_approver === "tenant" && v.user
        ? h("p", { class: "small", id: "approver" }, `Only the tenant decides this one (an API key: this console, the CLI); ${v.user}'s token may not.`)
        : null,
      v.pending_calls.length ? [
        h("p", { class: "small muted" }, "The turn's tool calls, exactly as the model asked; none runs before the decision:"),
        v.pending_calls.map((c) => h("div", { class: "call", "data-tool-use-id": c.tool_use_id },
          h("code", {}, c.name), c.held ? h("span", { class: "tag warn" }, "this decision") : null, json(c.input))),
      ] : null,
      h("label", { for: "decision-note" }, "Note for the agent"), note,
      h("div", { class: "row" }, approve, reject)));
  }
  if (!TERMINAL.has(v.status)) {
    const cancel = h("button", { type: "button", class: "danger", id: "cancel" }, v.children.total ? "Cancel task and sub-agents" : "Cancel task");
    cancel.addEventListener("click", () => act(cancel, (out) => `Cancelled ${out.cancelled.length} task(s).`, () => post(`${env.path}/cancel`)));
    parts.push(h("div", { class: "row" }, cancel));
  }
  if (!v.parent_id && (!TERMINAL.has(v.status) || v.status === "cost_exceeded")) {
    const money = v.budget && v.budget.money;
    const tokens = h("input", { id: "add-tokens", type: "number", min: 0, step: 1000, value: 10000 });
    const steps = h("input", { id: "add-steps", type: "number", min: 0, step: 1, value: 0 });
    const usd = money ? h("input", { id: "add-usd", type: "number", min: 0, step: 0.5, value: 0 }) : null;
    const raise = h("button", { type: "button", id: "raise-budget" }, "Raise budget");
    const raised = (out) => {
      const m = out.budget && out.budget.money;
      return `Budget raised: cap ${fmtInt(out.budget ? out.budget.cap : out.tokens.budget)} tokens${m ? `, ${fmtUsd(m.cap_usd)}` : ""}, ${out.max_steps} turns.`;
    };
    raise.addEventListener("click", () => act(raise, raised, () => post(`${env.path}/budget`, {
      add_tokens: Number(tokens.value || 0),
      add_steps: Number(steps.value || 0),
      ...(usd && Number(usd.value || 0) ? { add_usd: usd.value } : {}),
    })));
    parts.push(h("fieldset", {}, h("legend", {}, "Raise the budget"),
      h("label", { for: "add-tokens" }, "add tokens"), tokens,
      h("label", { for: "add-steps" }, "add turns"), steps,
      usd ? [h("label", { for: "add-usd" }, "add $"), usd] : null, raise));
  }
  if (!v.parent_id) {
    // The last step the API forks at (fork_at_step): a paused task's last step is the turn asking
    // for the held calls, which a fork refuses.
    const at = h("input", { id: "fork-step", type: "number", min: 0, max: v.fork_at_step, value: v.fork_at_step });
    const model = h("input", { id: "fork-model", type: "text", value: v.model, maxlength: 200 });
    const fork = h("button", { type: "button", id: "fork" }, "Fork");
    fork.addEventListener("click", () => act(fork, (out) => `Forked as ${out.task_id}.`, async () => {
      const out = await post(`${env.path}/fork`, { at_step: Number(at.value || 0), model: model.value.trim() || undefined });
      window.setTimeout(() => env.ctx.go(`#/tasks/${out.task_id}`), 600);
      return out;
    }));
    parts.push(h("fieldset", {}, h("legend", {}, "Fork at a step"),
      h("label", { for: "fork-step" }, "at step"), at,
      h("label", { for: "fork-model" }, "model"), model, fork));
  }
  if (parts.length === 1) parts.push(h("p", { class: "muted" }, `Nothing to do: the task is ${v.status}.`));
  replace(el, parts);
}

// One row per committed step: which worker, under which lease epoch. A claim that took over a run in
// progress (its worker died or stalled, or handed it on) is marked as a resume where its epoch
// starts; another new epoch is a new run of a task queued again (a follow-up, an approval, ...), no
// resume. The conversation's follow-ups, interrupts and stops stand after the step they came after.
function drawTimeline(el, events) {
  const workers = new Map();
  const takeovers = new Set();
  const marks = [];
  for (const e of events) {
    if (e.type !== "transition") continue;
    if (e.event === "claimed") {
      workers.set(e.epoch, e.worker);
      if (e.detail && e.detail.takeover) takeovers.add(e.epoch);
    } else if (MARKS[e.event]) marks.push(e);
  }
  const steps = new Map();
  for (const e of events) {
    if (e.type === "transition" || e.orphan) continue;
    const s = steps.get(e.step) || { step: e.step, epoch: e.epoch, at: e.at, llm: null, tools: [], messages: [], grade: null };
    if (e.type === "llm_call") s.llm = e;
    else if (e.type === "message") s.messages.push(e);
    else if (e.type === "grade") s.grade = e;
    else s.tools.push(e);
    steps.set(e.step, s);
  }
  const rows = [];
  let next = 0; // the next mark to show: marks come in commit order
  const marksBefore = (step) => {
    for (; next < marks.length && marks[next].detail.after_step < step; next++) rows.push(markRow(marks[next]));
  };
  let epoch = 0;
  // The takeovers of the epochs claimed since the last step shown (one may have committed nothing).
  const resumesUpTo = (upto) => {
    for (let e = epoch + 1; e <= upto; e++) {
      if (takeovers.has(e)) rows.push(h("tr", { class: "resume" }, h("td", { colspan: 6 }, `↻ resumed: epoch ${e} on ${workers.get(e) || "another worker"} took over the run of epoch ${e - 1}`)));
    }
    epoch = Math.max(epoch, upto);
  };
  for (const s of [...steps.values()].sort((a, b) => a.step - b.step)) {
    marksBefore(s.step);
    resumesUpTo(s.epoch);
    const compaction = s.llm && s.llm.purpose === "compaction";
    const kind = compaction ? "compact" : s.llm ? "llm" : s.messages.length ? "message" : s.grade ? "grade" : "tools";
    const what = s.grade
      ? gradeLine(s.grade)
      : compaction
      ? `compaction ${s.llm.model} · ${fmtInt(s.llm.tokens.total)} tokens: the conversation goes on from its summary`
      : s.llm
      ? `LLM ${s.llm.model} · ${fmtInt(s.llm.tokens.total)} tokens · ${fmtInt(s.llm.duration_ms)} ms${s.llm.tool_calls.length ? ` → ${s.llm.tool_calls.join(", ")}` : ""}`
      : s.messages.length
      ? s.messages.map((m) => `you (message ${m.seq}): ${clip(m.text, 160)}`).join(" · ")
      : `tools ${s.tools.map((t) => `${t.name} (${t.status})`).join(", ")}`;
    rows.push(h("tr", { "data-step": s.step, "data-kind": kind },
      h("td", { class: "num" }, s.step), h("td", {}, kind), h("td", {}, what),
      h("td", { class: "mono small" }, workers.get(s.epoch) || "–"), h("td", { class: "num" }, s.epoch), h("td", {}, fmtTime(s.at))));
  }
  marksBefore(Infinity);
  resumesUpTo(Math.max(0, ...workers.keys()));
  replace(el, h("h2", { id: "timeline-h" }, "Steps"),
    rows.length
      ? h("table", { class: "timeline" },
        h("thead", {}, h("tr", {}, ["Step", "Kind", "What", "Worker", "Epoch", "Committed"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, rows))
      : h("p", { class: "muted" }, "No step committed yet."));
}

function gradeLine(g) {
  const verdict = g.error ? `grader failed (${g.error.code})` : g.passed ? "passed" : "below the bar";
  const score = g.score === null ? "–" : g.score.toFixed(2);
  return `grade ${score} (bar ${g.bar.toFixed(2)}) · attempt ${g.attempt} of ${g.max_attempts} · ${verdict}${g.replayed ? " · recorded before a takeover" : ""}${g.feedback ? `: ${clip(g.feedback, 160)}` : ""}`;
}

function markRow(e) {
  return h("tr", { class: `mark ${e.event}`, "data-mark": e.event },
    h("td", { colspan: 5 }, MARKS[e.event](e.detail)), h("td", {}, fmtTime(e.at)));
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

function drawTrace(el, events, open) {
  const byStep = new Map();
  for (const e of events) if (e.type === "tool_call") byStep.set(e.step, [...(byStep.get(e.step) || []), e]);
  // What a person opened or closed is read from the trace being replaced, not learnt from toggle
  // events: the browser dispatches a toggle a task after the click, so a redraw landing between
  // the two would draw the step closed again.
  for (const d of el.querySelectorAll("details[data-key]")) {
    if (d.open) open.add(d.dataset.key);
    else open.delete(d.dataset.key);
  }
  const keep = (key, details) => {
    details.dataset.key = key;
    if (open.has(key)) details.open = true;
    return details;
  };
  const toolNode = (t) => keep(`tool:${t.tool_use_id}`, h("details", { class: `tool ${t.is_error ? "err" : ""}` },
    h("summary", {}, h("code", {}, t.name), ` · ${t.status}${t.side_effects ? " · side effect" : ""} · ${fmtInt(t.duration_ms)} ms`,
      policyTags(t.policy)),
    h("p", { class: "small muted" }, "input"), json(t.input),
    h("p", { class: "small muted" }, `output${t.truncated ? " (truncated)" : ""}`), h("pre", { class: "text" }, t.output)));
  const items = [];
  for (const e of events) {
    if (e.type === "transition") {
      const detail = Object.keys(e.detail || {}).length ? ` ${JSON.stringify(e.detail)}` : "";
      items.push(h("li", { class: "transition" }, h("span", { class: "when" }, fmtTime(e.at)), ` ${e.event}`,
        e.status ? [" → ", badge(e.status)] : null, e.worker ? ` on ${e.worker} (epoch ${e.epoch})` : "", h("span", { class: "small muted" }, detail)));
    } else if (e.type === "grade") {
      items.push(h("li", { class: "grade", "data-grade-step": e.step }, h("span", { class: "when" }, fmtTime(e.at)), ` ${gradeLine(e)}`,
        e.tokens.total ? h("span", { class: "small muted" }, ` · grading model ${fmtInt(e.tokens.total)} tokens · ${fmtUsd(e.cost_usd)}`) : null));
    } else if (e.type === "llm_call") {
      const tools = e.orphan ? [] : byStep.get(e.step + 1) || [];
      items.push(h("li", {}, keep(`llm:${e.step}:${e.epoch}:${e.orphan}`, h("details", { class: `llm${e.orphan ? " orphan" : ""}` },
        h("summary", {}, h("span", { class: "when" }, fmtTime(e.at)), ` LLM call · step ${e.step} · ${e.model} · ${fmtInt(e.tokens.input)} in / ${fmtInt(e.tokens.output)} out · ${fmtInt(e.duration_ms)} ms`,
          e.attempts > 1 ? h("span", { class: "tag warn" }, `${e.attempts} attempts`) : null,
          e.batched ? h("span", { class: "tag" }, "batch · half price") : null,
          e.purpose === "compaction" ? h("span", { class: "tag" }, "compaction") : null,
          e.orphan ? h("span", { class: "tag err" }, "orphan: paid for, never committed") : null,
          e.stop_reason ? h("span", { class: "tag" }, e.stop_reason) : null),
        h("p", { class: "small muted" }, `input: ${fmtInt(e.tokens.input)} tokens (${fmtInt(e.tokens.cache_read)} read from the prompt cache, ${fmtInt(e.tokens.cache_creation)} written to it) · ${e.reserved_tokens ? `${fmtInt(e.reserved_tokens)} reserved beforehand · ` : ""}${fmtUsd(e.cost_usd)}`),
        e.text ? [h("p", { class: "small muted" }, e.purpose === "compaction" ? "summary" : "output"), h("pre", { class: "text" }, e.text)] : null,
        tools.length ? h("ul", { class: "tree" }, tools.map((t) => h("li", {}, toolNode(t)))) : null))));
    }
  }
  replace(el, h("h2", { id: "trace-h" }, "Trace"), items.length ? h("ul", { class: "tree trace" }, items) : h("p", { class: "muted" }, "Nothing yet."));
}

async function drawChildren(el, v) {
  if (!v.children.total) {
    replace(el, h("h2", { id: "children-h" }, "Sub-agents"), h("p", { class: "muted" }, "None."));
    return;
  }
  const level = async (ids, depth) => {
    const views = await Promise.all(ids.slice(0, MAX_CHILDREN).map((id) => get(`tasks/${encodeURIComponent(id)}`)));
    return h("ul", { class: "tree" }, await Promise.all(views.map(async (c) => h("li", { "data-child": c.task_id },
      taskLink(c.task_id, shortId(c.task_id)), " ", badge(c.status), " ", h("span", { class: "goal" }, c.goal),
      h("span", { class: "small muted" }, ` · ${fmtInt(c.tokens.total)} tokens`),
      c.children.total && depth < 3 ? await level(c.children.task_ids, depth + 1) : null))));
  };
  const counts = Object.entries(v.children.by_status).map(([s, n]) => `${n} ${s}`).join(", ");
  replace(el, h("h2", { id: "children-h" }, `Sub-agents (${v.children.total}: ${counts})`), await level(v.children.task_ids, 1));
}
