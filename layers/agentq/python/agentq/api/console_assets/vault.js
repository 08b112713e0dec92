// The vault: a user's (or the tenant's own) credentials by name, kind, hosts and date. The API
// never answers with a value, so there is none to show; writing one is the CLI's or the API's
// (agentq vault put), so a value is never typed into a page.

import { get } from "./api.js";
import { fmtAgo, h, replace } from "./dom.js";

export function vaultPage(ctx, user) {
  const body = h("tbody");
  const input = h("input", { id: "vault-user", class: "mono", placeholder: "an end user (empty: the tenant's own)",
    maxlength: 128, value: user || "" });
  const form = h("form", { id: "vault-form", class: "row" },
    h("label", { for: "vault-user" }, "User"), input,
    h("button", { type: "submit", class: "primary" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = input.value ? `#/vault/${encodeURIComponent(input.value)}` : "#/vault";
  });
  replace(ctx.main,
    h("h1", {}, "Vault"),
    h("p", { class: "muted" }, "Credentials tasks use for their end user, by reference only: names, hosts and dates; ",
      "a value is never shown. Add one with ", h("code", {}, "agentq vault put NAME --user U --host H"), "."),
    form,
    h("table", { class: "vault" },
      h("thead", {}, h("tr", {}, ["Credential", "Kind", "Sent only to", "Updated"].map((c) => h("th", { scope: "col" }, c)))),
      body));
  const query = user ? `?user=${encodeURIComponent(user)}` : "";
  let shown = "";
  return ctx.every(5000, async () => {
    const page = await get(`vault/credentials${query}`);
    const sig = JSON.stringify(page);
    if (sig === shown) return;
    shown = sig;
    replace(body, page.credentials.length
      ? page.credentials.map((c) => h("tr", { "data-credential": c.name },
        h("td", { class: "mono" }, c.name),
        h("td", {}, c.kind),
        h("td", { class: "mono" }, c.hosts.join(", ")),
        h("td", {}, fmtAgo(c.updated_at))))
      : h("tr", {}, h("td", { colspan: 4, class: "muted" }, `No credentials for ${user ? `user ${user}` : "the tenant"}.`)));
  });
}
