// Small helpers every page shares: building elements (text is always set as text, never as
// HTML: run names, metrics and logs are the user's data), asking the API, formatting values.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export class ApiError extends Error {}

export async function api(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null) query.set(key, value);
  }
  const url = `/api/${path}${query.size ? "?" + query : ""}`;
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json().catch(() => ({ error: `${response.status} from ${url}` }));
  if (!response.ok) throw new ApiError(body.error || `${response.status} from ${url}`);
  return body;
}

// Calls `tick` every `seconds` while `active()` says so, skipping while the tab is hidden;
// a tick that fails is shown in `status` and retried at the next one.
export function every(seconds, tick, active, status) {
  let busy = false;
  const timer = setInterval(async () => {
    if (busy || document.hidden || !active()) return;
    busy = true;
    try {
      await tick();
      if (status) status.textContent = "";
    } catch (error) {
      if (status) status.textContent = `Not updated: ${error.message}`;
    } finally {
      busy = false;
    }
  }, seconds * 1000);
  return () => clearInterval(timer);
}

export function runLink(id, text) {
  return h("a", { href: `/run/${id.split("/").map(encodeURIComponent).join("/")}` }, text ?? id);
}

export function statusBadge(status, verified = true) {
  return h("span", { class: `badge status-${status}`, title: verified ? "" : "cannot be checked from here" },
    verified ? status : `${status}?`);
}

export function section(id, title, ...children) {
  return h("section", { id, class: "card" }, h("h2", { text: title }), ...children);
}

export function table(header, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, header.map((cell) => (cell instanceof Node ? cell : h("th", { text: cell }))))),
    h("tbody", {}, rows));
}

export function row(cells, attrs) {
  return h("tr", attrs || {}, cells.map((cell) => (cell instanceof Node && cell.tagName === "TD" ? cell : h("td", {}, cell))));
}

// -- formatting -------------------------------------------------------------------------------

export function fmtValue(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return String(value);
    const abs = Math.abs(value);
    return abs !== 0 && (abs < 1e-3 || abs >= 1e6) ? value.toExponential(3) : String(Number(value.toPrecision(4)));
  }
  if (typeof value === "object") {
    if (value.__repr__ !== undefined) return String(value.__repr__);
    return JSON.stringify(value);
  }
  return String(value);
}

export function fmtTime(seconds) {
  if (typeof seconds !== "number") return "-";
  const d = new Date(seconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fmtDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "-";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function fmtBytes(bytes) {
  if (typeof bytes !== "number") return "-";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
}

export function fmtShare(fraction) {
  return typeof fraction === "number" ? `${(fraction * 100).toFixed(1)} %` : "-";
}

// The duration of a run now: a running run's grows with the clock.
export function liveDuration(run, now) {
  if (typeof run.started !== "number") return null;
  return (typeof run.ended === "number" ? run.ended : now) - run.started;
}

export function mark(name) {
  // Where the benchmark and the tests read when a page was drawn (after the next frame).
  requestAnimationFrame(() => {
    performance.mark(`phalanx:${name}`);
    document.body.dataset[name] = "1";
  });
}
