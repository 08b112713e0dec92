// A task's files (its workspace, docs/SANDBOX.md) as a committed step left them, one file's text,
// and what a step changed: GET /tasks/{id}/files?step=N, /files/{path}?step=N, /diff?steps=A..B.
// The step shown follows the task's last step until a person picks another one.

import { ApiError, get, getText } from "./api.js";
import { fmtInt, h, replace } from "./dom.js";

const PAGE = 500; // entries listed; the rest are counted, not shown
const KIND = { file: "", dir: "/", link: " →" };

export function filesCard(path) {
  const el = h("section", { class: "card files", id: "files", "aria-labelledby": "files-h" });
  let picked = null; // the step a person chose; null: the last one
  let shownStep = null;

  async function show(step, last) {
    const stepInput = h("input", { id: "files-step", type: "number", min: 0, max: last, value: step, "aria-label": "step" });
    const body = h("div", { id: "files-body" });
    const pick = (event) => {
      event.preventDefault();
      const n = Number(stepInput.value);
      picked = n === last ? null : n;
      show(n, last).catch((err) => replace(el, failed(err)));
    };
    const diffButton = h("button", { id: "files-diff", type: "button", disabled: step === 0 }, `What step ${step} changed`);
    diffButton.addEventListener("click", () => drawDiff(body, step).catch((err) => replace(body, failed(err))));
    replace(el, h("h2", { id: "files-h" }, "Files"),
      h("form", { class: "inline", novalidate: true, onsubmit: pick }, h("label", { for: "files-step" }, "At step "), stepInput,
        h("button", { id: "files-show", type: "submit" }, "Show"), " ", diffButton),
      body);
    shownStep = step;
    let page;
    try {
      page = await get(`${path}/files?step=${step}&limit=${PAGE}`);
    } catch (err) {
      if (err instanceof ApiError && err.code === "workspace_not_found") {
        replace(el, h("h2", { id: "files-h" }, "Files"), h("p", { class: "muted" }, "This task has no workspace."));
        return;
      }
      if (err instanceof ApiError && err.status >= 400 && err.status < 500) {
        replace(body, failed(err)); // a step out of range: the API's message, naming the field
        return;
      }
      throw err;
    }
    const rows = page.files.map((f) => h("tr", { "data-path": f.path },
      h("td", { class: "mono" }, f.kind === "file"
        ? h("a", { href: "#", "data-file": f.path, onclick: (e) => { e.preventDefault(); drawFile(body, f.path, step).catch((err) => replace(body, failed(err))); } }, f.path)
        : `${f.path}${KIND[f.kind]}${f.target ? ` ${f.target}` : ""}`),
      h("td", { class: "mono" }, f.mode.toString(8).padStart(4, "0")),
      h("td", { class: "num" }, f.kind === "file" ? fmtInt(f.size) : "")));
    replace(body,
      h("p", { class: "small muted", id: "files-summary" },
        `Step ${page.step}: ${fmtInt(page.total_files)} files, ${fmtInt(page.total_bytes)} bytes`,
        page.next_after ? ` (the first ${PAGE} entries shown)` : ""),
      rows.length
        ? h("table", { class: "files-table" }, h("thead", {}, h("tr", {}, h("th", {}, "Path"), h("th", {}, "Mode"), h("th", {}, "Bytes"))), h("tbody", {}, rows))
        : h("p", { class: "muted" }, "Empty."),
      h("div", { id: "files-view" }));
  }

  async function drawFile(body, filePath, step) {
    const view = body.querySelector("#files-view");
    const got = await getText(`${path}/files/${filePath.split("/").map(encodeURIComponent).join("/")}?step=${step}`);
    replace(view, h("h3", {}, filePath), got.binary
      ? h("p", { class: "muted" }, "A binary file (download it with agentq download).")
      : h("pre", { class: "file-text", id: "file-text" }, got.text));
  }

  async function drawDiff(body, step) {
    const d = await get(`${path}/diff?steps=${step - 1}..${step}`);
    const list = (label, paths) => paths.map((p) => h("li", { "data-change": label }, `${label} `, h("span", { class: "mono" }, p)));
    replace(body,
      h("h3", {}, `What step ${step} changed`),
      d.added.length + d.removed.length + d.changed.length
        ? h("ul", { id: "diff-paths" }, list("added", d.added), list("removed", d.removed), list("changed", d.changed))
        : h("p", { class: "muted" }, "No file changed in this step."),
      d.patch ? h("pre", { class: "diff", id: "diff-patch" }, d.patch) : null,
      d.truncated ? h("p", { class: "small muted" }, "The diff was cut at its size limit.") : null);
  }

  return {
    el,
    // Redrawn when the last step moves, unless a person is looking at another step.
    async draw(view) {
      if (!view.has_workspace) {
        if (shownStep !== -1) replace(el, h("h2", { id: "files-h" }, "Files"), h("p", { class: "muted" }, "This task has no workspace."));
        shownStep = -1;
        return;
      }
      const step = picked === null ? view.step : picked;
      if (step === shownStep && picked !== null) return;
      if (picked === null && shownStep === view.step) return;
      await show(step, view.step);
    },
  };
}

function failed(err) {
  return h("p", { class: "error", role: "alert", id: "files-error" }, err.field ? `${err.message} (${err.field})` : err.message);
}
