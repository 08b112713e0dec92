// Memory stores: the documents agents remember across tasks. A store's documents, one document
// with every version (who wrote it: a task's step, or an API key), an editor that writes with the
// hash it read (a change made since is the API's 409, shown, and nothing is overwritten), and
// redaction of a past version.

import { all, get, post, put } from "./api.js";
import { errorPage, fmtAgo, fmtInt, fmtTime, h, replace, taskLink, shortId } from "./dom.js";

const store = (name) => `memory-stores/${encodeURIComponent(name)}`;
const q = (path) => `path=${encodeURIComponent(path)}`;

export function memoryListPage(ctx) {
  const body = h("tbody");
  replace(ctx.main,
    h("h1", {}, "Memory"),
    h("p", { class: "muted" }, "Stores of documents your agents remember across tasks (attach one to an agent or a task with ",
      h("code", {}, "memory"), "). Create one with ", h("code", {}, "agentq memory create"), " or POST /memory-stores."),
    h("table", { class: "memory-stores" },
      h("thead", {}, h("tr", {}, ["Store", "Documents", "Limit", "Retention", "Description"].map((c) => h("th", { scope: "col" }, c)))),
      body));
  let shown = "";
  return ctx.every(5000, async () => {
    const stores = await all("memory-stores", "stores", 100); // every page (a listing is a page at a time)
    const sig = JSON.stringify(stores);
    if (sig === shown) return;
    shown = sig;
    replace(body, stores.length
      ? stores.map((s) => h("tr", { "data-store": s.name },
        h("td", {}, h("a", { href: `#/memory/${encodeURIComponent(s.name)}`, class: "mono" }, s.name)),
        h("td", { class: "num" }, fmtInt(s.documents)),
        h("td", { class: "num" }, `${fmtInt(s.max_documents)} × ${fmtInt(s.max_document_bytes)} B`),
        h("td", { class: "num" }, `${s.version_retention_days} d`),
        h("td", {}, s.description || "")))
      : h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No memory stores yet.")));
  });
}

export async function memoryStorePage(ctx, name) {
  let info;
  try {
    info = await get(store(name));
  } catch (err) {
    errorPage(ctx, h("span", {}, "Memory store ", h("span", { class: "mono" }, name)), err, { href: "#/memory", text: "Back to the stores" });
    return;
  }
  const notice = h("p", { class: "notice", role: "status", hidden: true });
  const docs = h("tbody");
  const viewer = h("section", { class: "card", id: "memory-document", "aria-labelledby": "document-h", hidden: true });
  const newPath = h("input", { id: "memory-new-path", class: "mono", placeholder: "/customers/ann.md", maxlength: 1024 });
  const newDoc = h("button", { type: "button", id: "memory-new", class: "primary" }, "New document");
  newDoc.addEventListener("click", () => open(newPath.value, null));

  const say = (text) => {
    notice.textContent = text;
    notice.hidden = false;
  };

  async function refresh() {
    const documents = await all(`${store(name)}/documents`, "documents", 1000);
    replace(docs, documents.length
      ? documents.map((d) => h("tr", { "data-path": d.path },
        h("td", {}, h("a", { href: "#", class: "mono", onclick: (e) => { e.preventDefault(); open(d.path, d); } }, d.path)),
        h("td", { class: "num" }, `v${d.version}`),
        h("td", { class: "num" }, fmtInt(d.content_size_bytes)),
        h("td", { title: new Date(d.updated_at * 1000).toISOString() }, fmtAgo(d.updated_at))))
      : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No documents.")));
  }

  // One document: its content in an editor, saved with the hash it was read at; its versions.
  async function open(path, listed) {
    ctx.showError(null);
    let doc = null;
    let history = [];
    try {
      if (listed) {
        doc = await get(`${store(name)}/document?${q(path)}`);
        history = await all(`${store(name)}/versions?${q(path)}`, "versions", 100);  // every page
      }
    } catch (err) {
      ctx.showError(err);
      return;
    }
    const editor = h("textarea", { id: "memory-content", rows: 10, class: "mono", spellcheck: "false" }, doc ? doc.content : "");
    const save = h("button", { type: "button", class: "primary", id: "memory-save" }, doc ? "Save as a new version" : "Create");
    save.addEventListener("click", async () => {
      save.disabled = true;
      try {
        const body = { content: editor.value, expected_content_sha256: doc ? doc.content_sha256 : null };
        const out = await put(`${store(name)}/document?${q(path)}`, body);
        say(out.written ? `Saved ${path} as version ${out.document.version}.` : `${path} unchanged: it already had this content.`);
        await refresh();
        await open(path, out.document);
      } catch (err) {
        ctx.showError(err); // a 409: changed since it was read; nothing was written
        save.disabled = false;
      }
    });
    const rows = history.map((v) => {
      const by = v.created_by || {};
      const who = by.type === "task" ? h("span", {}, "task ", taskLink(by.task_id, shortId(by.task_id)), ` step ${by.step}`) : `API ${by.key_id || "key"}`;
      const current = doc && v.version === doc.version;
      const redact = v.redacted_at || current || v.operation === "deleted" ? null : h("button", { type: "button", class: "danger", id: `redact-${v.version}` }, "Redact");
      if (redact) {
        redact.addEventListener("click", async () => {
          try {
            await post(`${store(name)}/versions/${v.version}/redact?${q(path)}`);
            say(`Redacted version ${v.version} of ${path}: its content is gone for good.`);
            await open(path, doc);
          } catch (err) {
            ctx.showError(err);
          }
        });
      }
      return h("tr", { "data-version": String(v.version) },
        h("td", { class: "num" }, `v${v.version}`),
        h("td", {}, v.operation),
        h("td", {}, fmtTime(v.created_at)),
        h("td", {}, who),
        h("td", { class: "mono" }, v.redacted_at ? "redacted" : (v.content_sha256 || "").slice(0, 12)),
        h("td", { class: "actions" }, redact));
    });
    replace(viewer,
      h("h2", { id: "document-h" }, h("span", { class: "mono" }, path)),
      doc ? h("p", { class: "muted" }, `version ${doc.version}, ${fmtInt(doc.content_size_bytes)} bytes, content_sha256 ${doc.content_sha256}`) : h("p", { class: "muted" }, "A new document."),
      editor,
      h("div", { class: "row" }, save),
      history.length ? [h("h3", {}, "Versions"),
        h("table", { class: "memory-versions" },
          h("thead", {}, h("tr", {}, ["Version", "Change", "When", "By", "Hash", ""].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, rows))] : null);
    viewer.hidden = false;
  }

  replace(ctx.main,
    h("p", { class: "crumbs" }, h("a", { href: "#/memory" }, "Memory")),
    h("h1", {}, "Memory store ", h("span", { class: "mono", id: "store-name" }, name)),
    info.description ? h("p", {}, info.description) : null,
    notice,
    h("table", { class: "memory-documents" },
      h("thead", {}, h("tr", {}, ["Document", "Version", "Bytes", "Updated"].map((c) => h("th", { scope: "col" }, c)))),
      docs),
    h("div", { class: "row" }, h("label", { for: "memory-new-path" }, "path"), newPath, newDoc),
    viewer);
  await refresh();
}
