// Every call the console makes goes through the public HTTP API with the person's key, so the
// page sees what that key's tenant may see and nothing else. GETs are conditional: the ETag of
// the last answer goes back as If-None-Match and a 304 reuses the body we already have.

const KEY = "agentq.apiKey";
// The console is served at <api>/console/ (behind API Gateway: <api>/<stage>/console/).
export const apiBase = new URL("../", window.location.href);

export const stats = { requests: 0, notModified: 0, last: null };

export function getKey() {
  return window.sessionStorage.getItem(KEY) || "";
}

export function setKey(value) {
  if (value) window.sessionStorage.setItem(KEY, value);
  else window.sessionStorage.removeItem(KEY);
  etags.clear();
}

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field || null;
  }
}

const etags = new Map(); // url -> {etag, data}

export function url(path) {
  return new URL(path.replace(/^\//, ""), apiBase);
}

export async function request(method, path, body) {
  const target = url(path);
  const headers = { Accept: "application/json" };
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const cached = method === "GET" ? etags.get(target.href) : undefined;
  if (cached) headers["If-None-Match"] = cached.etag;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(target, init);
  } catch (err) {
    throw new ApiError(0, "unreachable", `the API did not answer (${err.message})`);
  }
  stats.requests += 1;
  stats.last = new Date();
  if (resp.status === 304 && cached) {
    stats.notModified += 1;
    return cached.data;
  }
  const text = await resp.text();
  let data = null;
  let parsed = true;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    parsed = false;
  }
  if (!resp.ok) {
    const err = (data && data.error) || {};
    throw new ApiError(resp.status, err.code || `http_${resp.status}`, err.message || `HTTP ${resp.status}`, err.field);
  }
  // A 2xx whose body is not JSON (a proxy's or a sign-in portal's web page): named as such. Taken
  // for null, it reached a page as "Cannot read properties of null (reading 'agents')".
  if (!parsed) {
    const type = (resp.headers.get("Content-Type") || "no content type").split(";")[0].trim();
    const said = type.includes("json") ? `${type} that does not parse` : type;
    throw new ApiError(resp.status, "not_json", `the API answered with ${said}, not JSON`);
  }
  const etag = resp.headers.get("ETag");
  if (method === "GET" && etag) etags.set(target.href, { etag, data });
  return data;
}

export const get = (path) => request("GET", path);

// A body that is not JSON (a workspace file's bytes, as text): the API's error still named.
export async function getText(path) {
  const headers = { Accept: "text/plain, application/octet-stream" };
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  let resp;
  try {
    resp = await fetch(url(path), { headers, cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, "unreachable", `the API did not answer (${err.message})`);
  }
  stats.requests += 1;
  const text = await resp.text();
  if (!resp.ok) {
    let err = {};
    try {
      err = JSON.parse(text).error || {};
    } catch {
      err = {};
    }
    throw new ApiError(resp.status, err.code || `http_${resp.status}`, err.message || `HTTP ${resp.status}`, err.field);
  }
  return { text, binary: (resp.headers.get("Content-Type") || "").startsWith("application/octet-stream") };
}
export const post = (path, body) => request("POST", path, body === undefined ? {} : body);
export const put = (path, body) => request("PUT", path, body);
export const del = (path) => request("DELETE", path);

// Every page of a paginated listing (trace, memory stores and documents, versions, schedules, a
// policy history), following next_cursor. `limit` within the listing's own bound (versions: 100).
export async function all(path, field, limit = 200) {
  const out = [];
  let cursor = null;
  for (let page = 0; page < 100; page += 1) {
    const sep = path.includes("?") ? "&" : "?";
    const data = await get(`${path}${sep}limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    out.push(...data[field]);
    cursor = data.next_cursor;
    if (!cursor) break;
  }
  return out;
}

// The events hub, when the deployment runs one (GET /health names it under `live`): asked once.
let hubAnswer = null;
export function eventsHub() {
  if (!hubAnswer) {
    hubAnswer = fetch(url("health"), { cache: "no-store" })
      .then((r) => (r.ok ? r.json() : {}))
      .then((h) => (h.live && h.live.url ? h.live.url.replace(/\/?$/, "/") : null))
      .catch(() => null);
  }
  return hubAnswer;
}
const HUB_RETRY_MS = 30000; // after the hub failed, the API's own route serves the stream this long

// Follow a server-sent event stream (GET .../events) with the key: EventSource cannot send an
// Authorization header, so this is its protocol over fetch: each event to onEvent, a reconnect
// with Last-Event-ID when the connection drops, done at `event: end` or a 204. Read from the
// events hub when the deployment offers one, from the API's route when the hub fails or is full (resuming
// at the last id: an event already handed on is never handed on again). Rejects when the API
// does not stream (or keeps failing), so the caller can poll instead.
export async function follow(path, onEvent, signal, state = {}) {
  let lastId = null;
  let failures = 0;
  const hub = await eventsHub();
  let hubFailedAt = null;
  const seen = new Set();
  while (!signal.aborted) {
    const headers = { Accept: "text/event-stream" };
    const key = getKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    if (lastId) headers["Last-Event-ID"] = lastId;
    const onHub = Boolean(hub) && (hubFailedAt === null || Date.now() - hubFailedAt > HUB_RETRY_MS);
    state.via = onHub ? "hub" : "api";
    let resp;
    try {
      resp = await fetch(onHub ? new URL(path.replace(/^\//, ""), hub) : url(path), { headers, cache: "no-store", signal });
      // A 5xx, or a 429 (the hub's cap of open streams): the API's route, and the hub again later.
      // Taken for "not streaming", a 429 left the page polling every 1.5 s for the rest of its life.
      if (onHub && (resp.status >= 500 || resp.status === 429)) throw new Error(`the events hub answered ${resp.status}`);
    } catch (err) {
      if (signal.aborted) return "stopped";
      if (onHub) {
        hubFailedAt = Date.now(); // the API's route at once, from the last id
        continue;
      }
      failures += 1;
      if (failures > 5) throw new ApiError(0, "unreachable", `the event stream did not answer (${err.message})`);
      await new Promise((r) => window.setTimeout(r, 250 * 2 ** failures));
      continue;
    }
    stats.requests += 1;
    stats.last = new Date();
    if (resp.status === 204) return "ended";
    const type = resp.headers.get("Content-Type") || "";
    if (!resp.ok || !type.includes("text/event-stream") || !resp.body) {
      throw new ApiError(resp.status, "not_streaming", "the API did not answer with an event stream");
    }
    state.streaming = true;
    failures = 0;
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const fields = { data: [] };
          for (const line of block.split("\n")) {
            const at = line.indexOf(":");
            if (at <= 0) continue; // a comment (keep-alive) or nothing
            const name = line.slice(0, at);
            const value = line.slice(at + 1).replace(/^ /, "");
            if (name === "data") fields.data.push(value);
            else fields[name] = value;
          }
          if (fields.event === "end") return "ended";
          if (fields.id) {
            if (seen.has(fields.id)) continue;
            seen.add(fields.id);
            lastId = fields.id;
          }
          if (fields.data.length) onEvent(JSON.parse(fields.data.join("\n")));
        }
      }
    } catch (err) {
      if (signal.aborted) return "stopped";
    } finally {
      state.streaming = false;
    }
    await new Promise((r) => window.setTimeout(r, 500)); // dropped: resume after the last event
  }
  return "stopped";
}
