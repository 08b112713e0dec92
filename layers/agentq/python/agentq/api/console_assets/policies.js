// Policy rules: the tenant's current rules per scope (the tenant's, each agent's), each rule's
// effect and mode, a scope's versions with their text, and a sample call tested against the
// stored rules: what they decide, and beside it what each log_only rule would have decided.
// Read-only: rules are written with `agentq policy put` (PUT /policies/{scope}, checked in full).
// A tool call's decision in a task's trace is drawn by policyTags (task.js).

import { all, get, post } from "./api.js";
import { fmtAgo, fmtTime, h, replace } from "./dom.js";

const POLL_MS = 5000;

export function policiesPage(ctx) {
  const scopes = h("div", { id: "policy-scopes" });
  const history = h("section", { class: "card", id: "policy-history", hidden: true, "aria-live": "polite" });
  const tester = testForm(ctx);
  replace(ctx.main,
    h("h1", {}, "Policies"),
    h("p", { class: "muted" }, "Rules checked before every tool call, MCP call, spawn and model call of the tenant's ",
      "tasks (", h("code", {}, "tenant"), ") or of one agent's (", h("code", {}, "agent:NAME"), "). A ",
      h("code", {}, "log_only"), " rule decides nothing: what it would have decided is shown beside what happened ",
      "(below for a sample call, and on each tool call of a task's trace). Rules are written with ",
      h("code", {}, "agentq policy put SCOPE rules.cedar"), "."),
    scopes, history, tester);

  let shown = "";
  async function refresh() {
    const page = await get("policies");
    const sig = JSON.stringify(page);
    if (sig === shown) return;
    shown = sig;
    replace(scopes, page.policies.length
      ? page.policies.map((doc) => scopeCard(doc, () => showHistory(doc.scope)))
      : h("p", { class: "card muted", id: "no-policies" }, "No rules: every call is allowed (write some with ",
        h("code", {}, "agentq policy put tenant rules.cedar"), ")."));
  }

  async function showHistory(scope) {
    const versions = await all(`policies/${encodeURIComponent(scope)}/history`, "policies", 100);  // every page
    const text = h("pre", { class: "cedar", id: "policy-version-text" }, versions.length ? versions[0].policies : "");
    const pick = (doc) => {
      text.textContent = doc.policies || "(no rules: this version removed them)";
      for (const tr of history.querySelectorAll("tr[data-version]")) {
        tr.classList.toggle("picked", Number(tr.dataset.version) === doc.version);
      }
    };
    replace(history,
      h("h2", { id: "policy-history-h" }, "Versions of ", h("code", {}, scope)),
      h("table", { class: "policy-versions" },
        h("thead", {}, h("tr", {}, ["Version", "Written", "By", "Rules", ""].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, versions.map((doc) => {
          const open = h("button", { type: "button", id: `policy-v${doc.version}` }, "Show");
          open.addEventListener("click", () => pick(doc));
          return h("tr", { "data-version": doc.version },
            h("td", { class: "num" }, `v${doc.version}`),
            h("td", {}, `${fmtTime(doc.created_at)} (${fmtAgo(doc.created_at)})`),
            h("td", { class: "mono" }, doc.created_by || "–"),
            h("td", {}, ruleSummary(doc.rules)),
            h("td", { class: "actions" }, open));
        }))),
      text);
    history.hidden = false;
    if (versions.length) pick(versions[0]);
  }

  return ctx.every(POLL_MS, refresh);
}

function ruleSummary(rules) {
  if (!rules.length) return "none";
  const shadow = rules.filter((r) => r.mode === "log_only").length;
  return `${rules.length} rule${rules.length === 1 ? "" : "s"}${shadow ? ` (${shadow} log_only)` : ""}`;
}

function scopeCard(doc, onHistory) {
  const more = h("button", { type: "button", id: `history-${doc.scope}` }, "Versions");
  more.addEventListener("click", onHistory);
  return h("section", { class: "card", "data-scope": doc.scope },
    h("div", { class: "row spread" },
      h("h2", {}, h("code", {}, doc.scope), ` · version ${doc.version}`),
      h("span", { class: "small muted" }, `written ${fmtAgo(doc.created_at)}${doc.created_by ? ` by ${doc.created_by}` : ""}`),
      more),
    doc.rules.length
      ? h("table", { class: "rules" },
        h("thead", {}, h("tr", {}, ["Rule", "Effect", "Mode", "Message"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, doc.rules.map((r) => h("tr", { "data-rule": `${doc.scope}/${r.id}`, "data-mode": r.mode },
          h("td", { class: "mono" }, r.id, r.description ? h("div", { class: "small muted" }, r.description) : null),
          h("td", {}, h("span", { class: `tag ${r.effect === "deny" ? "err" : "warn"}` }, r.effect)),
          h("td", {}, h("span", { class: `tag mode-${r.mode}` }, r.mode === "log_only" ? "log_only (shadow)" : "enforce")),
          h("td", {}, r.message)))))
      : h("p", { class: "muted" }, "No rules in this version."),
    h("details", {}, h("summary", {}, "Cedar text"), h("pre", { class: "cedar" }, doc.policies)));
}

// A sample call against the stored rules (POST /policies/test): nothing runs.
function testForm(ctx) {
  const kind = h("select", { id: "test-kind" }, ["tool", "mcp", "spawn", "model"].map((k) => h("option", { value: k }, k)));
  const tool = h("input", { id: "test-tool", class: "mono", placeholder: "charge_card", maxlength: 200 });
  const args = h("input", { id: "test-args", class: "mono", placeholder: '{"amount": 250}', maxlength: 4000 });
  const agent = h("input", { id: "test-agent", class: "mono", placeholder: "agent name (optional)", maxlength: 64 });
  const out = h("div", { id: "test-result", "aria-live": "polite" });
  const form = h("form", { id: "policy-test", class: "row" },
    h("label", { for: "test-kind" }, "call"), kind,
    h("label", { for: "test-tool" }, "tool"), tool,
    h("label", { for: "test-args" }, "arguments"), args,
    h("label", { for: "test-agent" }, "agent"), agent,
    h("button", { type: "submit", class: "primary" }, "Test"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let parsed = {};
    try {
      parsed = args.value.trim() ? JSON.parse(args.value) : {};
    } catch {
      ctx.showError(new Error("arguments: not JSON (a JSON object, e.g. {\"amount\": 250})"));
      return;
    }
    try {
      const decided = await post("policies/test", {
        call: { kind: kind.value, tool: tool.value.trim(), args: parsed },
        principal: { agent: agent.value.trim() },
      });
      ctx.showError(null);
      replace(out, decision(decided));
    } catch (err) {
      ctx.showError(err);
    }
  });
  return h("section", { class: "card", "aria-labelledby": "policy-test-h" },
    h("h2", { id: "policy-test-h" }, "Test a call"),
    h("p", { class: "small muted" }, "What the stored rules decide for a sample call; nothing runs (",
      h("code", {}, "agentq policy test"), ")."),
    form, out);
}

function decision(d) {
  return h("div", { class: "decision" },
    h("p", { id: "test-decision", "data-decision": d.decision },
      h("strong", {}, "Decided: "), h("span", { class: `tag ${d.decision === "allow" ? "" : d.decision === "ask" ? "warn" : "err"}` }, d.decision),
      d.rule ? [" by ", h("code", {}, d.rule), ` v${d.version}`] : null,
      d.message ? `: ${d.message}` : "", d.error ? h("span", { class: "small muted" }, ` (${d.error})`) : null),
    d.log_only.length
      ? h("ul", { class: "shadow", id: "test-log-only" }, d.log_only.map((s) => h("li", { "data-rule": s.rule },
        h("span", { class: "tag mode-log_only" }, "log_only"), " ", h("code", {}, s.rule), ` v${s.version} would `,
        h("strong", {}, s.effect), `: ${s.message}`)))
      : h("p", { class: "small muted" }, "No log_only rule would have decided otherwise."));
}

// A tool call's policy decision in a task's trace: what happened, and what log_only rules would have done.
export function policyTags(policy) {
  if (!policy) return null;
  const tone = { allow: "", ask: "warn", deny: "err" }[policy.decision] || "err";
  const decided = h("span", { class: `tag ${tone}`, "data-policy": policy.decision },
    `policy: ${policy.decision}${policy.rule ? ` by ${policy.rule}` : ""}`);
  const shadow = (policy.log_only || []).map((s) => h("span", { class: "tag mode-log_only", "data-would": s.effect, "data-rule": s.rule },
    `log_only ${s.rule} would ${s.effect}`));
  return [decided, shadow];
}
