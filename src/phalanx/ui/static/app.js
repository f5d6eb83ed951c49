// The viewer's pages, drawn from the JSON API: the path names the page (see _app.py).

import { api, clear, every, fmtBytes, fmtDuration, fmtShare, fmtTime, fmtValue, h, liveDuration, mark, row, runLink, section, statusBadge, table } from "./dom.js";
import { MetricChart, OverlayChart, onResize } from "./charts.js";

const app = document.getElementById("app");
const POINTS = 1000;
let charts = [];
onResize(() => charts);

// The best checkpoint and its score ("-" for none; the latest, unscored, where the run has no score).
function bestText(best) {
  if (!best) return "-";
  return best.metric ? `${best.checkpoint} (${best.metric} ${fmtValue(best.value)})` : best.checkpoint;
}

function failed(error) {
  clear(app, h("p", { class: "error", role: "alert", text: error.message }));
}

// -- the runs list ------------------------------------------------------------------------------

async function runsPage() {
  document.title = "phalanx runs";
  const state = { filter: new URLSearchParams(location.search).get("q") || "", sort: "started", desc: true };
  let data = await api("runs");
  document.getElementById("storage").textContent = data.storage;
  const filter = h("input", { type: "search", placeholder: "filter: name, status, trainer", value: state.filter, "aria-label": "filter runs" });
  const body = h("div");
  const note = h("p", { class: "muted" });
  clear(app, h("div", { class: "toolbar" }, filter, note), body);
  const columns = [
    ["name", "Name", (r) => r.id],
    ["status", "Status", (r) => r.status],
    ["attempts", "Attempts", (r) => r.attempts],
    ["started", "Started", (r) => r.started ?? 0],
    ["duration", "Duration", (r) => liveDuration(r, Date.now() / 1000) ?? -1],
    ["iteration", "Iteration", (r) => r.iteration ?? -1],
    ["best", "Best checkpoint", (r) => (r.best && typeof r.best.value === "number" ? r.best.value : -Infinity)],
    ["goodput", "Goodput", (r) => (r.goodput ? r.goodput.goodput : -1)],
  ];
  function draw() {
    const q = state.filter.toLowerCase();
    const shown = data.runs.filter((r) => !q || `${r.id} ${r.status} ${r.trainer || ""}`.toLowerCase().includes(q));
    const key = columns.find((c) => c[0] === state.sort)[2];
    shown.sort((a, b) => {
      const x = key(a), y = key(b);
      const order = x < y ? -1 : x > y ? 1 : 0;
      return state.desc ? -order : order;
    });
    note.textContent = `${shown.length} of ${data.runs.length} runs in ${data.storage}${data.exists ? "" : " (does not exist yet)"}`;
    const header = columns.map(([id, title]) => h("th", {
      class: "sortable", dataset: { sort: id }, "aria-sort": state.sort === id ? (state.desc ? "descending" : "ascending") : "none",
      onclick: () => { state.desc = state.sort === id ? !state.desc : id !== "name"; state.sort = id; draw(); },
    }, title, state.sort === id ? (state.desc ? " ▾" : " ▴") : ""));
    const rows = shown.map((r) => row([
      runLink(r.id),
      statusBadge(r.status, r.verified),
      r.attempts,
      fmtTime(r.started),
      fmtDuration(liveDuration(r, Date.now() / 1000)),
      fmtValue(r.iteration),
      bestText(r.best),
      r.goodput ? fmtShare(r.goodput.goodput) : "-",
    ], { dataset: { run: r.id } }));
    const parts = [table(header, rows, { class: "runs", id: "runs" })];
    if (!data.runs.length) parts.push(h("p", { class: "muted", text: "No runs here yet: a trainer's fit() writes one." }));
    if (data.sweeps.length) {
      parts.push(section("sweeps", "Sweeps", table(["Sweep", "Trials", "Metric"],
        data.sweeps.map((s) => row([h("a", { href: `/sweep/${encodeURIComponent(s.name)}`, text: s.name }), s.trials, s.state.metric ? `${s.state.metric} (${s.state.mode || ""})` : "-"])))));
    }
    parts.push(h("p", {}, h("a", { href: "/compare", text: "Compare runs…" })));
    clear(body, parts);
  }
  filter.addEventListener("input", () => { state.filter = filter.value; draw(); });
  draw();
  mark("painted");
  const status = h("p", { class: "muted" });
  app.append(status);
  every(Math.max(data.poll_s, 2), async () => { data = await api("runs"); draw(); }, () => true, status);
}

// -- a run --------------------------------------------------------------------------------------

function kv(entries) {
  return table(["Key", "Value"], entries.map(([k, v]) => row([k, fmtValue(v)])), { class: "kv" });
}

async function runPage(id) {
  document.title = `${id} · phalanx`;
  const [run, series] = await Promise.all([api("run", { run: id }), api("series", { run: id, points: POINTS })]);
  document.getElementById("storage").textContent = run.path;
  const head = h("div", { class: "run-head" });
  const latest = section("latest", "Latest metrics");
  const chartsBox = h("div", { class: "charts", id: "charts" });
  const chartsCard = section("metrics", "Metrics", chartsBox);
  const rest = h("div");
  const status = h("p", { class: "muted", id: "live" });
  clear(app, head, status, latest, chartsCard, rest);

  let current = series;
  const byName = new Map();
  function drawCharts(data) {
    if (!data.names.length) {
      clear(chartsBox, h("p", { class: "muted", text: "No metrics reported yet." }));
      return;
    }
    if (!byName.size) chartsBox.replaceChildren();
    for (const name of data.names) {
      const points = data.metrics[name];
      if (!points) continue;
      const chart = byName.get(name);
      if (chart) chart.update(points);
      else byName.set(name, new MetricChart(chartsBox, name, points, () => current.attempts));
    }
    charts = [...byName.values()];
  }
  function drawLatest(data) {
    const entries = Object.entries(data.last);
    clear(latest, h("h2", { text: "Latest metrics" }),
      h("p", { class: "muted", text: `iteration ${fmtValue(data.iteration)} · ${data.rows} rows${data.updated ? ` · reported ${fmtTime(data.updated)}` : ""}` }),
      entries.length ? h("dl", { class: "metrics" }, entries.map(([k, v]) => [h("dt", { text: k }), h("dd", { dataset: { metric: k }, text: fmtValue(v) })])) : h("p", { class: "muted", text: "none yet" }));
  }
  function drawHead(r) {
    clear(head, h("h1", {}, r.name, " ", statusBadge(r.status, r.verified)),
      h("p", { class: "muted" }, `${r.trainer || "trainer"} · started ${fmtTime(r.started)} · ${fmtDuration(liveDuration(r, Date.now() / 1000))} · ${r.attempts} attempt${r.attempts === 1 ? "" : "s"} · ${r.uri}`),
      r.problems.length ? h("ul", { class: "warning" }, r.problems.map((p) => h("li", { text: p }))) : null);
  }
  function drawRest(r) {
    const parts = [];
    parts.push(section("attempts", "Attempts", r.attempt_list.length ? r.attempt_list.map((a) => h("div", { class: "attempt" },
      h("p", {}, h("strong", { text: `Attempt ${a.attempt}` }), ` · ${a.outcome || "running"} · ${fmtTime(a.started)} · ${fmtDuration(a.duration)}`),
      a.failure ? h("div", { class: "failure" },
        h("p", { text: a.failure.root_rank !== null ? `Root cause: rank ${a.failure.root_rank}` : "Failure" }),
        a.failure.groups.map((g) => h("p", { class: "muted", text: `rank ${g.ranks.join(", ")}: ${g.summary}` })),
        h("pre", { class: "traceback", text: a.failure.traceback })) : null)) : h("p", { class: "muted", text: "No attempt recorded yet." })));
    const logBox = h("div", { class: "log" });
    parts.push(section("ranks", "Ranks", table(["Rank", "State", "Reports", "Iteration", "Last metrics", "Straggler", "Log"],
      r.ranks.map((k) => row([
        k.root_cause ? `${k.rank} (root cause)` : k.rank,
        h("span", { class: `badge status-${k.state}`, text: k.state }),
        k.reports, fmtValue(k.iteration),
        Object.entries(k.metrics || {}).map(([n, v]) => `${n}=${fmtValue(v)}`).join(" "),
        k.straggler.length ? k.straggler.map((s) => `×${fmtValue(s)}`).join(", ") : "-",
        k.log ? h("button", { type: "button", onclick: () => followLog(id, k.rank, logBox) }, `show (${fmtBytes(k.log.size)})`) : "-",
      ], { dataset: { rank: k.rank } }))), logBox));
    parts.push(section("checkpoints", "Checkpoints", r.checkpoint_list.length ? table(["Checkpoint", "Metrics", "Size", ""],
      r.checkpoint_list.map((c) => row([c.name, Object.entries(c.metrics).map(([n, v]) => `${n}=${fmtValue(v)}`).join(" "), fmtBytes(c.size),
        [c.rank === 1 ? "best" : "", c.latest ? "latest" : "", c.validation || ""].filter(Boolean).join(", ")]))) : h("p", { class: "muted", text: "No checkpoint yet." })));
    if (r.stragglers.length) {
      parts.push(section("stragglers", "Stragglers", table(["Attempt", "Rank", "Host", "Slowdown", "Cause", "Excess", "Rounds"],
        r.stragglers.map((s) => row([fmtValue(s.attempt), fmtValue(s.rank), fmtValue(s.host), `×${fmtValue(s.slowdown)}`, fmtValue(s.cause),
          typeof s.excess_s === "number" ? `${fmtValue(s.excess_s * 1000)} ms per ${s.per || "step"}` : "-",
          `${fmtValue(s.first_round)}–${fmtValue(s.last_round)}`])))));
    }
    if (r.goodput) {
      parts.push(section("goodput", "Goodput", h("p", { text: r.goodput.summary }),
        table(["Phase", "Seconds", "Share"], Object.entries(r.goodput.seconds).map(([k, v]) => row([k, fmtValue(v), fmtShare(r.goodput.fractions[k])])))));
    }
    if (r.data_position) {
      parts.push(section("data", "Data position", h("p", { class: "muted", text: `at ${r.data_position.checkpoint}` }),
        table(["Dataset", "Position"], Object.entries(r.data_position.datasets).map(([n, p]) => row([n, p.text])))));
    }
    const config = Object.entries(r.config);
    parts.push(section("config", "Configuration", config.length ? config.map(([k, flat]) => [h("h3", { text: k }), kv(Object.entries(flat))]) : h("p", { class: "muted", text: "No run.json configuration." })));
    clear(rest, parts);
  }
  drawHead(run);
  drawLatest(series);
  drawCharts(series);
  drawRest(run);
  mark("painted");
  let version = series.version;
  let last = run;
  let detailAt = Date.now();
  every(run.poll_s, async () => {
    const next = await api("series", { run: id, points: POINTS, version });
    if (!next.unchanged) {
      current = next;
      version = next.version;
      drawLatest(next);
      drawCharts(next);
    }
    if (!next.unchanged || Date.now() - detailAt > 5000) {
      detailAt = Date.now();
      last = await api("run", { run: id });
      drawHead(last);
      drawRest(last);
    }
  }, () => last.status === "running" || !settled(last), status);
}

// A finished run is still asked now and then (its run.json is rewritten at the end of fit()).
function settled(run) {
  return run.status !== "running" && typeof run.ended === "number" && Date.now() / 1000 - run.ended > 60;
}

let logTimer = null;
function followLog(id, rank, box) {
  if (logTimer) logTimer();
  const pre = h("pre", { class: "logtext", dataset: { rank } });
  const follow = h("input", { type: "checkbox", checked: true });
  const status = h("span", { class: "muted" });
  clear(box, h("p", {}, h("strong", { text: `rank ${rank}` }), " ", h("label", {}, follow, " follow"), " ", status), pre);
  let offset = null;
  async function more() {
    const part = await api("logs", { run: id, rank, offset });
    if (part.restarted || offset === null) pre.textContent = "";
    pre.textContent += part.text;
    offset = part.offset;
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }
  more().catch((e) => { status.textContent = e.message; });
  logTimer = every(1, more, () => follow.checked, status);
}

// -- compare ------------------------------------------------------------------------------------

async function comparePage() {
  document.title = "compare · phalanx";
  const params = new URLSearchParams(location.search);
  const chosen = (params.get("runs") || "").split(",").filter(Boolean);
  const listing = await api("runs");
  document.getElementById("storage").textContent = listing.storage;
  const all = [...listing.runs];
  const picker = h("form", { class: "picker", onsubmit: (e) => {
    e.preventDefault();
    const ids = [...picker.querySelectorAll("input:checked")].map((i) => i.value);
    location.search = `?runs=${ids.map(encodeURIComponent).join(",")}`;
  } }, all.map((r) => h("label", {}, h("input", { type: "checkbox", value: r.id, checked: chosen.includes(r.id) }), ` ${r.id} `)),
  h("button", { type: "submit", text: "Compare" }));
  if (chosen.length < 2) {
    clear(app, h("h1", { text: "Compare runs" }), h("p", { class: "muted", text: "Choose two runs or more." }), picker);
    mark("painted");
    return;
  }
  const data = await api("compare", { runs: chosen.join(","), points: POINTS });
  const box = h("div", { class: "charts", id: "charts" });
  clear(app, h("h1", { text: `Compare ${chosen.length} runs` }), picker,
    section("summary", "Runs", table(["Run", "Status", "Iteration", "Best", "Goodput"], data.runs.map((r) => row([runLink(r.id), statusBadge(r.status, r.verified), fmtValue(r.iteration), bestText(r.best), r.goodput ? fmtShare(r.goodput.goodput) : "-"])))),
    section("metrics", "Metrics", box),
    section("config", "Configuration differences", data.config.length ? table(["Key", ...data.runs.map((r) => r.id)], data.config.map((c) => row([c.key, ...c.values.map(fmtValue)], { class: c.differs ? "differs" : "" }))) : h("p", { class: "muted", text: "The configurations are the same." })));
  charts = Object.entries(data.metrics).map(([name, byRun]) => new OverlayChart(box, name, Object.entries(byRun)));
  mark("painted");
}

// -- a sweep ------------------------------------------------------------------------------------

async function sweepPage(name) {
  document.title = `${name} · phalanx`;
  const data = await api("sweep", { sweep: name });
  const keys = data.config_keys;
  const stateText = Object.entries(data.state).map(([k, v]) => `${k}: ${fmtValue(v)}`).join(" · ");
  clear(app, h("h1", { text: `Sweep ${name}` }), stateText ? h("p", { class: "muted", text: stateText }) : null,
    section("trials", "Trials", table(["Trial", "Status", ...keys, "Iteration", "Best", "Metrics"], data.trials.map((t) => row([
      runLink(t.id, t.name), statusBadge(t.status, t.verified), ...keys.map((k) => fmtValue(t.config[k])), fmtValue(t.iteration),
      bestText(t.best),
      Object.entries(t.metrics).slice(0, 4).map(([n, v]) => `${n}=${fmtValue(v)}`).join(" "),
    ])))),
    h("p", {}, h("a", { href: `/compare?runs=${data.trials.map((t) => encodeURIComponent(t.id)).join(",")}`, text: "Compare these trials" })));
  mark("painted");
}

// -- routing ------------------------------------------------------------------------------------

function route() {
  const path = location.pathname;
  if (path.startsWith("/run/")) return runPage(path.slice(5).split("/").map(decodeURIComponent).join("/"));
  if (path.startsWith("/sweep/")) return sweepPage(decodeURIComponent(path.slice(7)));
  if (path === "/compare") return comparePage();
  return runsPage();
}

function start() {
  if (!window.uPlot) {
    addEventListener("load", start, { once: true });
    return;
  }
  route().catch(failed);
}
start();
