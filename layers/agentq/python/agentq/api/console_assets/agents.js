// Agents: the tenant's agent definitions, each version's exact definition, its aliases, and a form
// that runs one (POST /tasks with `agent`, a version or an alias, so the version is pinned and
// validated as any submission is).

import { all, get, post } from "./api.js";
import { errorPage, fmtAgo, fmtTime, h, json, replace } from "./dom.js";
import { jsonForm } from "./json_form.js";
import { qualityCard } from "./quality.js";

// What POST /agents takes of a version (the rest is the store's: version, ref, created_at, pins).
const SPEC_FIELDS = ["name", "description", "provider", "model", "system", "script", "tools", "tool_policies",
  "constraints", "mcp_servers", "output_schema", "notify"];

const TEMPLATE = {
  name: "",
  description: "",
  provider: "anthropic",
  model: "claude-sonnet-4-6",
  system: "",
  tools: [],
  constraints: { max_tokens: 100000 },
};

function specOf(version) {
  return Object.fromEntries(SPEC_FIELDS.filter((f) => version[f] !== null && version[f] !== undefined).map((f) => [f, version[f]]));
}

export function agentListPage(ctx) {
  const body = h("tbody");
  replace(ctx.main,
    h("h1", {}, "Agents"),
    jsonForm({
      id: "new-agent",
      title: "New agent",
      help: "The body of POST /agents: a name, the model, its system prompt, tools and their policies, default constraints. The same name again makes a new version.",
      value: TEMPLATE,
      label: "Create",
      send: async (spec) => {
        const out = await post("agents", spec);
        ctx.go(`#/agents/${encodeURIComponent(out.agent.name)}`);
      },
    }),
    h("p", { class: "muted" }, "Your agent definitions. Each change is a new, immutable version; a task pins the version it ran. Create one with ",
      h("code", {}, "agentq agents create"), " or POST /agents."),
    h("table", { class: "agents" },
      h("thead", {}, h("tr", {}, ["Agent", "Latest version", "Description", "Updated"].map((c) => h("th", { scope: "col" }, c)))),
      body));
  let shown = "";
  return ctx.every(5000, async () => {
    const page = await get("agents");
    const sig = JSON.stringify(page);
    if (sig === shown) return;
    shown = sig;
    replace(body, page.agents.length
      ? page.agents.map((a) => h("tr", { "data-agent": a.name },
        h("td", {}, h("a", { href: `#/agents/${encodeURIComponent(a.name)}`, class: "mono" }, a.name)),
        h("td", { class: "num" }, a.latest_version),
        h("td", {}, a.description || ""),
        h("td", { title: new Date(a.updated_at * 1000).toISOString() }, fmtAgo(a.updated_at))))
      : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No agents yet.")));
  });
}

export async function agentPage(ctx, name) {
  const path = `agents/${encodeURIComponent(name)}`;
  let history;
  try {
    history = { versions: await all(`${path}/versions`, "versions", 100) };  // every page
  } catch (err) {
    errorPage(ctx, h("span", {}, "Agent ", h("span", { class: "mono" }, name)), err, { href: "#/agents", text: "Back to the agents" });
    return;
  }
  // Its aliases (PUT /agents/{name}/aliases/{alias}): run through one, and see where each points.
  let aliases = [];
  try {
    aliases = (await get(`${path}/aliases`)).aliases;
  } catch (err) {
    ctx.showError(err);
  }
  const split = (a) => a.versions.map((t) => `v${t.version} ${t.weight}%`).join(" · ");
  const picker = h("select", { id: "agent-version" });
  const fillPicker = (selected) => {
    replace(picker,
      aliases.map((a) => h("option", { value: a.alias }, `alias ${a.alias} (${split(a)})`)),
      history.versions.map((v) => h("option", { value: String(v.version) }, `version ${v.version}${v === history.versions[0] ? " (latest)" : ""}`)));
    picker.value = String(selected);
  };
  const aliasCard = h("section", { class: "card", id: "aliases", "aria-labelledby": "aliases-h" },
    h("h2", { id: "aliases-h" }, "Aliases"),
    aliases.length
      ? h("table", { class: "aliases" },
        h("thead", {}, h("tr", {}, ["Alias", "Versions", "Online grading", "Revision", "Moved"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, aliases.map((a) => h("tr", { "data-alias": a.alias },
          h("td", { class: "mono" }, `${name}@${a.alias}`),
          h("td", {}, split(a)),
          h("td", { class: "online" }, a.online ? `${Math.round(1000 * a.online.rate) / 10}% of tasks · ${a.online.grade.grader ? `grader ${a.online.grade.grader}` : "rubric"} · bar ${a.online.grade.bar}` : "–"),
          h("td", { class: "num" }, a.revision),
          h("td", { title: new Date(a.updated_at * 1000).toISOString() }, fmtAgo(a.updated_at))))))
      : h("p", { class: "muted" }, "No aliases. Point one at a version with ", h("code", {}, `agentq agents alias set ${name} prod N`),
        "; a task submitted as name@alias pins the version it gets."));
  fillPicker(history.versions[0].version);
  const quality = await qualityCard(ctx, name);
  const notice = h("p", { class: "notice", role: "status", hidden: true });
  const definition = h("section", { class: "card", "aria-labelledby": "definition-h" });
  const goal = h("textarea", { id: "run-goal", rows: 3, maxlength: 20000, required: true, placeholder: "What should the agent do?" });
  const run = h("button", { type: "button", class: "primary", id: "run-agent" }, "Run");
  run.addEventListener("click", async () => {
    run.disabled = true;
    try {
      const out = await post("tasks", { agent: `${name}@${picker.value}`, goal: goal.value });
      ctx.go(`#/tasks/${encodeURIComponent(out.task_id)}`);
    } catch (err) {
      ctx.showError(err);
    } finally {
      run.disabled = false;
    }
  });
  const draw = () => {
    const alias = aliases.find((a) => a.alias === picker.value);
    const wanted = alias ? String(alias.versions[0].version) : picker.value;
    const v = history.versions.find((x) => String(x.version) === wanted) || history.versions[0];
    const row = (k, val) => [h("dt", {}, k), h("dd", {}, val)];
    const policies = Object.entries(v.tool_policies || {});
    replace(definition, h("h2", { id: "definition-h" }, `${v.ref}`),
      h("dl", {},
        v.description ? row("description", v.description) : null,
        row("model", `${v.provider} · ${v.model}`),
        row("tools", v.tools.length ? v.tools.map((t) => h("code", { class: "kv" }, t)) : "none"),
        policies.length ? row("tool policies", policies.map(([t, p]) => h("span", { class: "kv" }, `${t}: ${p}`))) : null,
        v.mcp_servers.length ? row("MCP servers", v.mcp_servers.map((s) => h("span", { class: "kv" }, s.tools ? `${s.name} (${s.tools.join(", ")})` : s.name))) : null,
        v.mcp_tools.length ? row("MCP tools pinned", v.mcp_tools.map((t) => h("code", { class: "kv" }, `${t.server}.${t.name}`))) : null,
        row("created", fmtTime(v.created_at))),
      v.system ? [h("h3", {}, "System prompt"), h("pre", { class: "text" }, v.system)] : null,
      h("h3", {}, "Constraints (defaults a submission may lower)"),
      Object.values(v.constraints).some((x) => x !== null)
        ? json(Object.fromEntries(Object.entries(v.constraints).filter(([, x]) => x !== null)))
        : h("p", { class: "muted" }, "None set: the deployment's defaults apply."),
      v.output_schema ? [h("h3", {}, "Output schema"), json(v.output_schema)] : null);
  };
  picker.addEventListener("change", draw);
  const edit = jsonForm({
    id: "new-version",
    title: "New version",
    help: "This agent's latest definition, as POST /agents takes it: change it and create the next version (an unchanged definition creates none).",
    value: specOf(history.versions[0]),
    label: "Create version",
    send: async (spec) => {
      const out = await post("agents", { ...spec, name });
      history = { versions: await all(`${path}/versions`, "versions", 100) };  // every page
      fillPicker(out.agent.version);
      draw();
      notice.textContent = out.created ? `Created ${out.agent.ref}.` : `Unchanged: ${out.agent.ref} is already this definition.`;
      notice.hidden = false;
    },
  });
  replace(ctx.main,
    h("p", { class: "crumbs" }, h("a", { href: "#/agents" }, "Agents")),
    h("h1", {}, "Agent ", h("span", { class: "mono", id: "agent-name" }, name)),
    notice,
    h("section", { class: "card", "aria-labelledby": "run-h" },
      h("h2", { id: "run-h" }, "Run it"),
      h("div", { class: "row" }, h("label", { for: "agent-version" }, "version"), picker),
      h("label", { for: "run-goal" }, "goal"),
      h("div", { class: "row" }, goal, run)),
    aliasCard,
    quality,
    definition,
    edit);
  draw();
}
