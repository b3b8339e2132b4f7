// weir Web UI: renders the REST API (the same JSON `curl` shows) into pages chosen by the
// URL fragment: #/overview, #/jobs, #/job/<id>/<tab>, #/taskmanagers, #/taskmanager/<id>,
// and on the deployment controller (`weir operator`) #/deployments, #/deployment/<name>.
// No framework and no build step: this file is compiled into the weir binary.
"use strict";

const TERMINAL = ["FINISHED", "CANCELED", "FAILED"];
const TASK_STATES = ["created", "scheduled", "deploying", "initializing", "running", "finished", "canceling", "canceled", "failed"];

let refreshMs = 3000;
let paused = false;
let operatorMode = false; // served by `weir operator`: the Deployments pages
let rendering = false;
let timer = null;

// ---------------------------------------------------------------- formatting

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function fmtCount(n) {
  return Number(n ?? 0).toLocaleString("en-US");
}

function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${h}h ${m}m`;
  if (h) return `${h}h ${m}m ${s}s`;
  if (m) return `${m}m ${s}s`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let v = Number(n), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i === 0 || v >= 100 ? 0 : 1)} ${units[i]}`;
}

function fmtTime(epochMs) {
  if (!epochMs || epochMs < 0) return "–";
  const d = new Date(epochMs);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

function badge(state) {
  return `<span class="state st-${esc(state)}">${esc(state)}</span>`;
}

// Job overviews count subtasks under lower-case state names, vertices under upper-case
// ones (both as Flink).
function chips(tasks) {
  if (!tasks) return "";
  const count = (s) => tasks[s] ?? tasks[s.toUpperCase()] ?? 0;
  return `<span class="chips">${TASK_STATES.filter((s) => count(s) > 0)
    .map((s) => `<span class="chip st-${s.toUpperCase()}" title="${fmtCount(count(s))} ${s}">${fmtCount(count(s))}</span>`)
    .join("")}</span>`;
}

function bpLabel(level, ratio) {
  if (!level) return `<span class="muted">–</span>`;
  const pct = ratio === undefined ? "" : ` ${Math.round(ratio * 100)}%`;
  return `<span class="bp bp-${esc(level)}">${esc(level.toUpperCase())}${pct}</span>`;
}

// ---------------------------------------------------------------- REST

async function api(path, options) {
  const response = await fetch(path, options);
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!response.ok) {
    const message = body && body.errors ? body.errors.join("; ") : `${response.status} ${response.statusText}`;
    throw new Error(`${options && options.method ? options.method : "GET"} /${path}: ${message}`);
  }
  return body;
}

// ---------------------------------------------------------------- routing

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [pathPart, query] = hash.split("?");
  const parts = pathPart.split("/").filter(Boolean);
  const params = new URLSearchParams(query || "");
  return { parts: parts.length ? parts : ["overview"], params };
}

function setCrumbs(items) {
  document.getElementById("crumbs").innerHTML = items
    .map(([label, href]) => (href ? `<a href="${href}">${esc(label)}</a>` : `<b>${esc(label)}</b>`))
    .join(`<span class="sep">/</span>`);
}

function setActiveNav(section) {
  for (const a of document.querySelectorAll(".nav-item[data-section]")) {
    a.classList.toggle("active", a.dataset.section === section);
  }
}

async function render() {
  if (rendering) return;
  rendering = true;
  const { parts, params } = route();
  const errorBox = document.getElementById("error");
  try {
    let html;
    switch (parts[0]) {
      case "jobs": html = await pageJobs(); break;
      case "job": html = await pageJob(parts[1], parts[2] || "overview", params); break;
      case "taskmanagers": html = await pageTaskManagers(); break;
      case "taskmanager": html = await pageTaskManager(parts[1]); break;
      case "jobmanager": html = await pageJobManager(); break;
      case "deployments": html = await pageDeployments(); break;
      case "deployment": html = await pageDeployment(decodeURIComponent(parts[1] || "")); break;
      default: html = operatorMode ? await pageDeployments() : await pageOverview();
    }
    document.getElementById("view").innerHTML = html;
    document.body.dataset.page = parts[0];
    errorBox.hidden = true;
  } catch (e) {
    errorBox.textContent = `Could not load this page: ${e.message}. The JobManager may be down or restarting; the page retries every ${refreshMs / 1000} s.`;
    errorBox.hidden = false;
  } finally {
    rendering = false;
  }
}

function schedule() {
  clearInterval(timer);
  timer = setInterval(() => { if (!paused && document.getElementById("modal").hidden) render(); }, refreshMs);
  document.getElementById("refresh-text").textContent = paused ? "auto-refresh paused" : `auto-refresh every ${refreshMs / 1000} s`;
  document.getElementById("refresh-dot").classList.toggle("paused", paused);
  document.getElementById("refresh-toggle").textContent = paused ? "Resume" : "Pause";
}

// ---------------------------------------------------------------- overview and job lists

function jobsTable(jobs, emptyText) {
  if (!jobs.length) return `<div class="empty">${esc(emptyText)}</div>`;
  const rows = jobs.map((j) => `
    <tr class="link" onclick="location.hash='#/job/${esc(j.jid)}'">
      <td><a href="#/job/${esc(j.jid)}">${esc(j.name)}</a><div class="muted mono">${esc(j.jid)}</div></td>
      <td>${fmtTime(j["start-time"])}</td>
      <td class="num">${fmtDuration(j.duration)}</td>
      <td>${j["end-time"] > 0 ? fmtTime(j["end-time"]) : "–"}</td>
      <td>${chips(j.tasks)}</td>
      <td>${badge(j.state)}</td>
    </tr>`).join("");
  return `<table><thead><tr><th>Job Name</th><th>Start Time</th><th class="num">Duration</th><th>End Time</th><th>Tasks</th><th>Status</th></tr></thead><tbody>${rows}</tbody></table>`;
}

async function pageOverview() {
  setCrumbs([["Overview"]]);
  setActiveNav("overview");
  const [overview, jobs] = await Promise.all([api("overview"), api("jobs/overview")]);
  const running = jobs.jobs.filter((j) => !TERMINAL.includes(j.state));
  const completed = jobs.jobs.filter((j) => TERMINAL.includes(j.state));
  return `
    <div class="cards">
      <div class="card"><div class="label">Task Managers</div><div class="value"><a href="#/taskmanagers">${overview.taskmanagers}</a></div></div>
      <div class="card"><div class="label">Task Slots</div><div class="value">${overview["slots-available"]} <small>free of ${overview["slots-total"]}</small></div></div>
      <div class="card"><div class="label">Running Jobs</div><div class="value" style="color:var(--running)">${overview["jobs-running"]}</div></div>
      <div class="card"><div class="label">Finished</div><div class="value" style="color:var(--finished)">${overview["jobs-finished"]}</div></div>
      <div class="card"><div class="label">Canceled</div><div class="value" style="color:var(--canceled)">${overview["jobs-cancelled"]}</div></div>
      <div class="card"><div class="label">Failed</div><div class="value" style="color:var(--failed)">${overview["jobs-failed"]}</div></div>
    </div>
    ${haPanel(overview["high-availability"])}
    <div class="panel"><h2>Running Jobs</h2>${jobsTable(running, "No job is running.")}</div>
    <div class="panel"><h2>Completed Jobs</h2>${jobsTable(completed, "No job has ended yet.")}</div>`;
}

// High availability: which JobManager leads, since when, and its epoch (it grows with
// every change of leader).
function haPanel(ha) {
  if (!ha) return "";
  return `<div class="panel"><h2>High Availability (${esc(ha.type)})</h2>
    <table><tr><th>Leader JobManager</th><td><code>${esc(ha["leader-id"])}</code></td></tr>
    <tr><th>Epoch</th><td>${esc(String(ha.epoch))}</td></tr>
    <tr><th>Leader since</th><td>${new Date(ha["leader-since"]).toLocaleString()}</td></tr></table></div>`;
}

async function pageJobs() {
  setCrumbs([["Jobs"]]);
  setActiveNav("jobs");
  const jobs = await api("jobs/overview");
  return `<div class="panel"><h2>All Jobs</h2>${jobsTable(jobs.jobs, "No job has been submitted.")}</div>`;
}

// ---------------------------------------------------------------- job page

async function pageJob(jid, tab, params) {
  setActiveNav("jobs");
  const [job, exceptions, checkpoints] = await Promise.all([
    api(`jobs/${jid}`),
    api(`jobs/${jid}/exceptions`),
    api(`jobs/${jid}/checkpoints`),
  ]);
  setCrumbs([["Jobs", "#/jobs"], [job.name]]);
  const running = !TERMINAL.includes(job.state);
  const actions = running ? `
    <div class="actions">
      <button type="button" onclick="actionSavepoint('${esc(jid)}')">Trigger Savepoint</button>
      <button type="button" onclick="actionStop('${esc(jid)}')">Stop with Savepoint</button>
      <button type="button" class="danger" onclick="actionCancel('${esc(jid)}')">Cancel Job</button>
    </div>` : "";
  const tabs = [
    ["overview", "Overview", null],
    ["exceptions", "Exceptions", exceptions.exceptionHistory.entries.length],
    ["checkpoints", "Checkpoints", checkpoints.counts.completed],
    ["configuration", "Configuration", null],
  ].map(([id, label, count]) => `<a class="tab${tab === id ? " active" : ""}" href="#/job/${esc(jid)}/${id}">${label}${count !== null ? `<span class="count">${count}</span>` : ""}</a>`).join("");
  let body;
  if (tab === "exceptions") body = tabExceptions(job, exceptions);
  else if (tab === "checkpoints") body = await tabCheckpoints(jid, checkpoints, job, params.get("checkpoint"));
  else if (tab === "configuration") body = await tabConfiguration(jid);
  else body = await tabOverview(job, params.get("vertex"));
  return `
    <div class="job-head">
      <div>
        <h1>${esc(job.name)} ${badge(job.state)}</h1>
        <div class="facts">
          <span>Job ID <b class="mono">${esc(job.jid)}</b></span>
          <span>Start <b>${fmtTime(job["start-time"])}</b></span>
          <span>Duration <b>${fmtDuration(job.duration)}</b></span>
          ${job["end-time"] > 0 ? `<span>End <b>${fmtTime(job["end-time"])}</b></span>` : ""}
          <span>Restarts <b>${job.numRestarts}</b></span>
          <span>Max parallelism <b>${job.maxParallelism}</b></span>
        </div>
        ${job["failure-cause"] ? `<pre class="trace">${esc(job["failure-cause"])}</pre>` : ""}
      </div>
      ${actions}
    </div>
    <div class="tabs">${tabs}</div>
    ${body}`;
}

async function tabOverview(job, selected) {
  const live = !TERMINAL.includes(job.state);
  // Backpressure is measured over a window, so ask only while the job runs.
  const pressure = {};
  // Busy (max) and Backpressured (max) per vertex, as Flink's graph shows them.
  const time = {};
  if (live) {
    const results = await Promise.all(job.vertices.map((v) => api(`jobs/${job.jid}/vertices/${v.id}/backpressure`).catch(() => null)));
    job.vertices.forEach((v, i) => { pressure[v.id] = results[i]; });
    const split = await Promise.all(job.vertices.map((v) =>
      api(`jobs/${job.jid}/vertices/${v.id}/subtasks/metrics?get=busyTimeMsPerSecond,backPressuredTimeMsPerSecond&agg=max`).catch(() => [])));
    job.vertices.forEach((v, i) => {
      const max = (id) => { const m = split[i].find((x) => x.id === id); return m ? m.max : undefined; };
      const busy = max("busyTimeMsPerSecond"), backpressured = max("backPressuredTimeMsPerSecond");
      if (busy !== undefined && backpressured !== undefined) time[v.id] = { busy, backpressured };
    });
  }
  const vertex = job.vertices.find((v) => v.id === selected);
  const rows = job.vertices.map((v) => {
    const bp = pressure[v.id];
    const ratio = bp ? Math.max(0, ...bp.subtasks.map((s) => s.ratio)) : undefined;
    return `
    <tr class="link${v.id === selected ? " selected" : ""}" onclick="location.hash='#/job/${esc(job.jid)}/overview?vertex=${esc(v.id)}'">
      <td>${esc(v.name)}</td>
      <td class="num">${v.parallelism}</td>
      <td class="num">${fmtCount(v.metrics["read-records"])}</td>
      <td class="num">${fmtCount(v.metrics["write-records"])}</td>
      <td>${bp ? bpLabel(bp["backpressure-level"], ratio) : `<span class="muted">–</span>`}</td>
      <td>${chips(v.tasks)}</td>
      <td>${badge(v.status)}</td>
    </tr>`;
  }).join("");
  return `
    <div class="panel"><h2>Operator graph <span class="muted" style="font-weight:400">(click an operator for its subtasks)</span></h2>
      <div class="graph">${graphSvg(job, pressure, selected, time)}</div></div>
    <div class="panel"><h2>Operators</h2>
      <table><thead><tr><th>Name</th><th class="num">Parallelism</th><th class="num">Records Received</th><th class="num">Records Sent</th><th>Backpressure</th><th>Tasks</th><th>Status</th></tr></thead>
      <tbody>${rows || `<tr><td colspan="7" class="empty">The job graph is not built yet.</td></tr>`}</tbody></table></div>
    ${vertex ? subtasksPanel(job, vertex, pressure[vertex.id]) : ""}`;
}

// An input watermark: none yet, the end of input, or its time (UTC, with milliseconds).
function fmtWatermark(watermark) {
  if (watermark === undefined || watermark === null) return `<span class="muted">No Watermark</span>`;
  if (watermark >= 9223372036854775000) return "end of input";
  return esc(new Date(watermark).toISOString().replace("T", " ").replace("Z", ""));
}

function subtasksPanel(job, vertex, bp) {
  const rows = vertex.subtasks.map((s) => {
    const sub = bp ? bp.subtasks.find((x) => x.subtask === s.subtask) : null;
    const host = s.host === "localhost" ? "localhost" : `<a href="#/taskmanager/${encodeURIComponent(s.host)}">${esc(s.host)}</a>`;
    return `<tr>
      <td class="num">${s.subtask}</td>
      <td>${badge(s.status)}</td>
      <td class="mono">${host}</td>
      <td class="num">${fmtCount(s.metrics["read-records"])}</td>
      <td class="num">${fmtCount(s.metrics["write-records"])}</td>
      <td>${sub ? bpLabel(sub["backpressure-level"], sub.ratio) : `<span class="muted">–</span>`}</td>
      <td class="mono">${fmtWatermark(s["input-watermark"])}</td>
      <td class="num">${fmtCount(s["late-records"] || 0)}</td>
      <td>${fmtTime(s["start-time"])}</td>
      <td class="num">${fmtDuration(s.duration)}</td>
    </tr>`;
  }).join("");
  // The chained operators of the task, summed over its subtasks.
  const chain = [];
  for (const s of vertex.subtasks) {
    (s.operators || []).forEach((o, i) => {
      chain[i] ||= { uid: o.uid, in: 0, out: 0 };
      chain[i].in += o["read-records"];
      chain[i].out += o["write-records"];
    });
  }
  const chainPanel = chain.length > 1 ? `<div class="panel"><h2>Chained operators of ${esc(vertex.name)}</h2>
    <table><thead><tr><th>Operator uid</th><th class="num">Records Received</th><th class="num">Records Sent</th></tr></thead>
    <tbody>${chain.map((o) => `<tr><td class="mono">${esc(o.uid)}</td><td class="num">${fmtCount(o.in)}</td><td class="num">${fmtCount(o.out)}</td></tr>`).join("")}</tbody></table></div>` : "";
  // A source's splits (Kafka partitions): where each subtask reads, and how far behind.
  const splits = vertex.subtasks.flatMap((s) => (s.splits || []).map((p) => ({ subtask: s.subtask, ...p })));
  const splitPanel = splits.length ? `<div class="panel"><h2>Source splits of ${esc(vertex.name)}</h2>
    <table><thead><tr><th>Split</th><th class="num">Subtask</th><th class="num">Current Offset</th><th class="num">Lag</th></tr></thead>
    <tbody>${splits.map((p) => `<tr><td class="mono">${esc(p.split)}</td><td class="num">${p.subtask}</td><td class="num">${fmtCount(p["current-offset"])}</td><td class="num">${p.lag === undefined ? `<span class="muted">–</span>` : fmtCount(p.lag)}</td></tr>`).join("")}</tbody></table></div>` : "";
  return `${chainPanel}${splitPanel}<div class="panel"><h2>Subtasks of ${esc(vertex.name)}</h2>
    <table><thead><tr><th class="num">#</th><th>Status</th><th>Host</th><th class="num">Records Received</th><th class="num">Records Sent</th><th>Backpressure</th><th>Watermark</th><th class="num">Late Records</th><th>Start Time</th><th class="num">Duration</th></tr></thead>
    <tbody>${rows}</tbody></table></div>`;
}

// Lays vertices out in columns by their distance from a source, then draws boxes and the
// exchanges between them, labelled with their ship strategy as Flink's plan view does.
// A node's fill by its time split, as Flink's graph: redder the busier, greyer the more
// backpressured.
function timeFill(t) {
  if (!t) return "";
  if (t.backpressured > t.busy) return `fill:hsl(220,12%,${Math.round(100 - t.backpressured / 25)}%)`;
  return `fill:hsl(0,85%,${Math.round(100 - t.busy / 22)}%)`;
}

function graphSvg(job, pressure, selected, time = {}) {
  const nodes = job.plan && job.plan.nodes ? job.plan.nodes : [];
  if (!nodes.length) return `<div class="empty">The job graph is not built yet.</div>`;
  const byId = Object.fromEntries(job.vertices.map((v) => [v.id, v]));
  const depth = {};
  for (const n of nodes) {
    depth[n.id] = n.inputs.length ? Math.max(...n.inputs.map((i) => (depth[i.id] ?? 0) + 1)) : 0;
  }
  const columns = [];
  for (const n of nodes) (columns[depth[n.id]] ||= []).push(n);
  const W = 250, H = 104, GX = 90, GY = 26;
  const pos = {};
  const tallest = Math.max(...columns.map((c) => c.length));
  columns.forEach((column, x) => column.forEach((n, y) => {
    const offset = ((tallest - column.length) * (H + GY)) / 2;
    pos[n.id] = { x: 10 + x * (W + GX), y: 10 + offset + y * (H + GY) };
  }));
  const width = 20 + columns.length * W + (columns.length - 1) * GX;
  const height = 20 + tallest * H + (tallest - 1) * GY;
  let svg = `<svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" xmlns="http://www.w3.org/2000/svg">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#94a3b8"/></marker></defs>`;
  for (const n of nodes) {
    for (const input of n.inputs) {
      const a = pos[input.id], b = pos[n.id];
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x - 2, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      svg += `<path class="edge" d="M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}" marker-end="url(#arrow)"/>`;
      svg += `<text class="edge-label" x="${mx}" y="${(y1 + y2) / 2 - 6}" text-anchor="middle">${esc(input.ship_strategy)}</text>`;
    }
  }
  for (const n of nodes) {
    const v = byId[n.id];
    const p = pos[n.id];
    const status = v ? v.status : "CREATED";
    const name = n.description.length > 34 ? `${n.description.slice(0, 33)}…` : n.description;
    const bp = pressure[n.id];
    const bpText = bp ? `backpressure ${bp["backpressure-level"].toUpperCase()}` : "";
    const colour = { ok: "#16a34a", low: "#d97706", high: "#dc2626" }[bp ? bp["backpressure-level"] : ""] || "#6b7280";
    svg += `<g class="vnode${n.id === selected ? " selected" : ""}" onclick="location.hash='#/job/${esc(job.jid)}/overview?vertex=${esc(n.id)}'">
      <title>${esc(n.description)}</title>
      <rect class="box" x="${p.x}" y="${p.y}" width="${W}" height="${H}" rx="7" style="${timeFill(time[n.id])}"/>
      <rect x="${p.x}" y="${p.y}" width="6" height="${H}" rx="3" class="st-${esc(status)}" style="fill:var(--${statusColour(status)})"/>
      <text class="title" x="${p.x + 16}" y="${p.y + 21}">${esc(name)}</text>
      <text x="${p.x + 16}" y="${p.y + 41}">Parallelism ${n.parallelism} · ${esc(status)}</text>
      <text x="${p.x + 16}" y="${p.y + 60}">In ${fmtCount(v ? v.metrics["read-records"] : 0)} · Out ${fmtCount(v ? v.metrics["write-records"] : 0)}</text>
      <text x="${p.x + 16}" y="${p.y + 80}" style="fill:${colour};font-weight:600">${esc(bpText)}</text>
      ${time[n.id] ? `<text class="time-split" x="${p.x + 16}" y="${p.y + 97}">Busy (max): ${Math.round(time[n.id].busy / 10)}% · Backpressured (max): ${Math.round(time[n.id].backpressured / 10)}%</text>` : ""}
    </g>`;
  }
  return `${svg}</svg>`;
}

function statusColour(state) {
  if (state === "RUNNING") return "running";
  if (state === "FAILED") return "failed";
  if (state === "FINISHED") return "finished";
  if (state === "CANCELED") return "canceled";
  if (["CANCELING", "RECONCILING"].includes(state)) return "warning";
  return "created";
}

function tabExceptions(job, exceptions) {
  const entries = exceptions.exceptionHistory.entries;
  const list = entries.map((e) => `
    <tr><td style="white-space:nowrap">${fmtTime(e.timestamp)}</td>
      <td><b>${esc(e.exceptionName)}</b> in <span class="mono">${esc(e.taskName)}</span> on <span class="mono">${esc(e.location)}</span>
      <pre class="trace">${esc(e.stacktrace)}</pre></td></tr>`).join("");
  return `
    <div class="cards">
      <div class="card"><div class="label">Restarts</div><div class="value">${job.numRestarts}</div></div>
      <div class="card"><div class="label">Failures recorded</div><div class="value">${entries.length}${exceptions.exceptionHistory.truncated ? "+" : ""}</div></div>
    </div>
    <div class="panel"><h2>Exception History (newest first)</h2>
      ${entries.length ? `<table><thead><tr><th>Time</th><th>Exception</th></tr></thead><tbody>${list}</tbody></table>` : `<div class="empty">No failures: the job has not restarted.</div>`}
    </div>`;
}

// ---------------------------------------------------------------- checkpoints

function checkpointSummary(title, c, extra) {
  if (!c) return `<div class="panel"><h2>${title}</h2><div class="empty">None yet.</div></div>`;
  return `<div class="panel"><h2>${title}</h2><div class="body"><dl class="kv">
    <dt>ID</dt><dd>${c.id}</dd>
    ${extra || ""}
    ${c.trigger_timestamp ? `<dt>Triggered</dt><dd>${fmtTime(c.trigger_timestamp)}</dd>` : ""}
    ${c.end_to_end_duration !== undefined ? `<dt>End to end duration</dt><dd>${fmtDuration(c.end_to_end_duration)}</dd>` : ""}
    ${c.state_size !== undefined ? `<dt>Checkpointed data size</dt><dd>${fmtBytes(c.state_size)}</dd>` : ""}
    ${c.external_path ? `<dt>Path</dt><dd class="mono">${esc(c.external_path)}</dd>` : ""}
    ${c.failure_message ? `<dt>Failure</dt><dd>${esc(c.failure_message)}</dd>` : ""}
  </dl></div></div>`;
}

function checkpointChart(history) {
  const points = history.filter((c) => c.status !== "IN_PROGRESS").slice(0, 40).reverse();
  if (points.length < 1) return `<div class="empty">The chart appears after the first checkpoint.</div>`;
  const W = 900, H = 180, L = 60, R = 60, T = 10, B = 28;
  const maxDur = Math.max(1, ...points.map((c) => c.end_to_end_duration || 0));
  const maxSize = Math.max(1, ...points.map((c) => c.state_size || 0));
  const step = (W - L - R) / points.length;
  const bars = points.map((c, i) => {
    const h = ((c.end_to_end_duration || 0) / maxDur) * (H - T - B);
    return `<rect class="bar${c.status === "FAILED" ? " failed" : ""}" x="${L + i * step + step * 0.15}" y="${H - B - h}" width="${Math.max(1, step * 0.7)}" height="${h}"><title>#${c.id}: ${fmtDuration(c.end_to_end_duration)}, ${fmtBytes(c.state_size)}</title></rect>`;
  }).join("");
  const line = points.map((c, i) => `${L + i * step + step / 2},${H - B - ((c.state_size || 0) / maxSize) * (H - T - B)}`).join(" ");
  const dots = points.map((c, i) => `<circle class="pt" r="2.5" cx="${L + i * step + step / 2}" cy="${H - B - ((c.state_size || 0) / maxSize) * (H - T - B)}"/>`).join("");
  const first = points[0].id, last = points[points.length - 1].id;
  return `<div class="legend"><span><i style="background:#93c5fd"></i>end-to-end duration (left axis)</span><span><i style="background:#ea580c"></i>checkpointed size (right axis)</span><span><i style="background:#fca5a5"></i>failed</span></div>
    <svg class="chart" width="100%" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" style="max-height:220px">
      <line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/>
      <line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>
      <line class="axis" x1="${W - R}" y1="${T}" x2="${W - R}" y2="${H - B}"/>
      <text x="${L - 6}" y="${T + 10}" text-anchor="end">${fmtDuration(maxDur)}</text>
      <text x="${L - 6}" y="${H - B}" text-anchor="end">0</text>
      <text x="${W - R + 6}" y="${T + 10}">${fmtBytes(maxSize)}</text>
      <text x="${W - R + 6}" y="${H - B}">0</text>
      <text x="${L}" y="${H - 8}">#${first}</text>
      <text x="${W - R}" y="${H - 8}" text-anchor="end">#${last}</text>
      ${bars}<polyline class="line" points="${line}"/>${dots}
    </svg>`;
}

// One checkpoint's part per operator, and per subtask of each, as Flink's dashboard shows
// when a checkpoint of the history is opened.
async function checkpointBreakdown(jid, job, id) {
  const details = await api(`jobs/${jid}/checkpoints/details/${id}`).catch(() => null);
  if (!details) return `<div class="panel"><h2>Checkpoint ${esc(id)}</h2><div class="empty">It is no longer in the history.</div></div>`;
  const names = Object.fromEntries(job.vertices.map((v) => [v.id, v.name]));
  const vertices = job.vertices.map((v) => v.id).filter((vid) => details.tasks[vid]);
  const parts = await Promise.all(vertices.map((vid) => api(`jobs/${jid}/checkpoints/details/${id}/subtasks/${vid}`).catch(() => null)));
  const rows = vertices.map((vid, i) => {
    const t = details.tasks[vid];
    const subtasks = parts[i] ? parts[i].subtasks.map((s) => `<tr class="sub"><td class="num">${s.index}</td><td>${esc(s.status)}</td>
      <td class="num">${s.ack_timestamp ? fmtTime(s.ack_timestamp) : "–"}</td><td class="num">${s.end_to_end_duration !== null && s.end_to_end_duration !== undefined ? fmtDuration(s.end_to_end_duration) : "–"}</td>
      <td class="num">${s.checkpointed_size !== null && s.checkpointed_size !== undefined ? fmtBytes(s.checkpointed_size) : "–"}</td><td class="num">${s.state_size !== null && s.state_size !== undefined ? fmtBytes(s.state_size) : "–"}</td></tr>`).join("") : "";
    return `<tr><td><b>${esc(names[vid] || vid)}</b></td><td class="num">${t.num_acknowledged_subtasks}/${t.num_subtasks}</td>
      <td class="num">${t.latest_ack_timestamp ? fmtTime(t.latest_ack_timestamp) : "–"}</td><td class="num">${fmtDuration(t.end_to_end_duration)}</td>
      <td class="num">${fmtBytes(t.checkpointed_size)}</td><td class="num">${fmtBytes(t.state_size)}</td></tr>
      ${subtasks ? `<tr><td colspan="6"><table class="nested"><thead><tr><th class="num">Subtask</th><th>Status</th><th class="num">Acknowledged</th><th class="num">End to End</th><th class="num">Checkpointed</th><th class="num">State Size</th></tr></thead><tbody>${subtasks}</tbody></table></td></tr>` : ""}`;
  }).join("");
  const operators = Object.entries(details.operator_sizes || {}).map(([uid, size]) => `<tr><td class="mono">${esc(uid)}</td><td class="num">${fmtBytes(size)}</td></tr>`).join("");
  return `<div class="panel" id="checkpoint-breakdown"><h2>Checkpoint ${esc(String(details.id))} ${badge(details.status)} <span class="muted" style="font-weight:400">per operator and subtask</span></h2>
    <table><thead><tr><th>Task</th><th class="num">Acknowledged</th><th class="num">Latest Acknowledgement</th><th class="num">End to End</th><th class="num">Checkpointed Data Size</th><th class="num">Full State Size</th></tr></thead>
    <tbody>${rows || `<tr><td colspan="6" class="empty">No task acknowledged it.</td></tr>`}</tbody></table>
    ${operators ? `<h3>State by operator uid</h3><table><thead><tr><th>Operator uid</th><th class="num">Size</th></tr></thead><tbody>${operators}</tbody></table>` : ""}</div>`;
}

async function tabCheckpoints(jid, stats, job, selected) {
  const config = await api(`jobs/${jid}/checkpoints/config`);
  const counts = stats.counts;
  const latest = stats.latest;
  const breakdown = selected ? await checkpointBreakdown(jid, job, selected) : "";
  const history = stats.history.map((c) => `
    <tr class="link${String(c.id) === selected ? " selected" : ""}" onclick="location.hash='#/job/${esc(jid)}/checkpoints?checkpoint=${c.id}'"><td class="num">${c.id}${c.is_savepoint ? ` <span class="muted">savepoint</span>` : ""}</td>
      <td>${badge(c.status)}</td>
      <td class="num">${c.num_acknowledged_subtasks}/${c.num_subtasks}</td>
      <td class="nowrap">${fmtTime(c.trigger_timestamp)}</td>
      <td class="nowrap">${c.latest_ack_timestamp ? fmtTime(c.latest_ack_timestamp) : "–"}</td>
      <td class="num">${c.status === "IN_PROGRESS" ? "–" : fmtDuration(c.end_to_end_duration)}</td>
      <td class="num">${fmtBytes(c.state_size)}</td>
      <td class="mono path">${esc(c.external_path || c.failure_message || "")}</td></tr>`).join("");
  const enabled = config.checkpointing_enabled;
  return `
    <div class="cards">
      <div class="card"><div class="label">Interval</div><div class="value">${enabled ? fmtDuration(config.interval) : "off"}</div></div>
      <div class="card"><div class="label">Triggered</div><div class="value">${counts.total}</div></div>
      <div class="card"><div class="label">In Progress</div><div class="value">${counts.in_progress}</div></div>
      <div class="card"><div class="label">Completed</div><div class="value" style="color:var(--running)">${counts.completed}</div></div>
      <div class="card"><div class="label">Failed</div><div class="value" style="color:var(--failed)">${counts.failed}</div></div>
      <div class="card"><div class="label">Restored</div><div class="value">${counts.restored}</div></div>
    </div>
    <div class="panel"><h2>Duration and size over time</h2><div class="body">${checkpointChart(stats.history)}</div></div>
    <div class="grid2">
      ${checkpointSummary("Latest Completed Checkpoint", latest.completed)}
      ${checkpointSummary("Latest Savepoint", latest.savepoint)}
      ${checkpointSummary("Latest Failed Checkpoint", latest.failed)}
      ${checkpointSummary("Latest Restore", latest.restored, latest.restored ? `<dt>Restored at</dt><dd>${fmtTime(latest.restored.restore_timestamp)}</dd>` : "")}
    </div>
    ${breakdown}
    <div class="panel"><h2>History (newest first) <span class="muted" style="font-weight:400">(click one for its part per operator and subtask)</span></h2>
      ${history ? `<table><thead><tr><th class="num">ID</th><th>Status</th><th class="num">Acknowledged</th><th>Trigger Time</th><th>Latest Acknowledgement</th><th class="num">End to End Duration</th><th class="num">Checkpointed Data Size</th><th>Path / Failure</th></tr></thead><tbody>${history}</tbody></table>`
        : `<div class="empty">${enabled ? "No checkpoint yet." : "Checkpointing is off: set execution.checkpointing.interval to enable it."}</div>`}
    </div>
    <div class="panel"><h2>Checkpointing Configuration</h2><div class="body"><dl class="kv">
      <dt>Checkpointing Mode</dt><dd>${esc(String(config.mode).replace("_", " ").toUpperCase())}</dd>
      <dt>Interval</dt><dd>${enabled ? fmtDuration(config.interval) : "off (execution.checkpointing.interval is not set)"}</dd>
      <dt>Timeout</dt><dd>${fmtDuration(config.timeout)}</dd>
      <dt>Minimum Pause Between Checkpoints</dt><dd>${fmtDuration(config.min_pause)}</dd>
      <dt>Maximum Concurrent Checkpoints</dt><dd>${config.max_concurrent}</dd>
      <dt>Tolerable Failed Checkpoints</dt><dd>${config.tolerable_failed_checkpoints}</dd>
      <dt>Retained Checkpoints</dt><dd>${config.num_retained}</dd>
      <dt>Checkpoint Storage</dt><dd class="mono">${esc(config.checkpoint_storage || "–")}</dd>
      <dt>Savepoint Storage</dt><dd class="mono">${esc(config.savepoint_storage || "–")}</dd>
      <dt>State Backend</dt><dd>${esc(config.state_backend)}</dd>
    </dl></div></div>`;
}

// ---------------------------------------------------------------- configuration

async function tabConfiguration(jid) {
  const { "execution-config": c, "weir-execution-config": w } = await api(`jobs/${jid}/config`);
  return `<div class="panel"><h2>Execution Configuration</h2><div class="body"><dl class="kv">
    <dt>Execution Mode</dt><dd>${esc(w["execution-mode"])}</dd>
    <dt>Job Parallelism</dt><dd>${c["job-parallelism"]}</dd>
    <dt>Max Parallelism</dt><dd>${w["max-parallelism"]}</dd>
    <dt>Restart Strategy</dt><dd>${esc(c["restart-strategy"])}</dd>
    <dt>Failover Strategy</dt><dd>${esc(w["failover-strategy"])}</dd>
    <dt>Object Reuse Mode</dt><dd>${c["object-reuse-mode"]}</dd>
  </dl></div></div>
  <p class="muted">The checkpointing configuration is on the Checkpoints tab; the cluster's options on the <a href="#/jobmanager">Job Manager</a> page.</p>`;
}

async function pageJobManager() {
  setCrumbs([["Job Manager"]]);
  setActiveNav("jobmanager");
  // Every option with its value here: those set first, then the defaults.
  const entries = await api("jobmanager/config/effective");
  const ordered = entries.filter((e) => e.set).concat(entries.filter((e) => !e.set));
  const rows = ordered.map((e) => `<tr${e.set ? "" : ` class="muted"`}><td class="mono">${esc(e.key)}</td><td class="mono path">${esc(e.value)}</td>
    <td>${e.set ? "set" : "default"}</td><td>${esc(e.description)}</td></tr>`).join("");
  const log = await fetch("jobmanager/log").then((r) => (r.ok ? r.text() : "")).catch(() => "");
  const tail = log.split("\n").slice(-300).join("\n");
  return `<div class="panel"><h2>Configuration <span class="muted" style="font-weight:400">(${entries.filter((e) => e.set).length} set, the rest default)</span></h2>
    <table><thead><tr><th>Key</th><th>Value</th><th>Source</th><th>Description</th></tr></thead><tbody>${rows}</tbody></table></div>
    <div class="panel" id="jobmanager-log"><h2>Log <span class="muted" style="font-weight:400">(the newest lines; all of it at <a href="jobmanager/log">/jobmanager/log</a>)</span></h2>
    ${tail.trim() ? `<pre class="trace">${esc(tail)}</pre>` : `<div class="empty">Nothing logged yet.</div>`}</div>`;
}

// ---------------------------------------------------------------- task managers

async function pageTaskManagers() {
  setCrumbs([["Task Managers"]]);
  setActiveNav("taskmanagers");
  const { taskmanagers } = await api("taskmanagers");
  const rows = taskmanagers.map((tm) => `
    <tr class="link" onclick="location.hash='#/taskmanager/${encodeURIComponent(tm.id)}'">
      <td><a href="#/taskmanager/${encodeURIComponent(tm.id)}" class="mono">${esc(tm.id)}</a></td>
      <td class="mono">${esc(tm.path)}</td>
      <td class="num">${tm.slotsNumber}</td>
      <td class="num">${tm.freeSlots}</td>
      <td class="num">${fmtDuration(Math.max(0, Date.now() - tm.timeSinceLastHeartbeat))} ago</td>
    </tr>`).join("");
  return `<div class="panel"><h2>Task Managers</h2>
    ${taskmanagers.length ? `<table><thead><tr><th>ID</th><th>Data Address</th><th class="num">Slots</th><th class="num">Free Slots</th><th class="num">Last Heartbeat</th></tr></thead><tbody>${rows}</tbody></table>`
      : `<div class="empty">No TaskManager is registered. Start one with <code>weir taskmanager</code>.</div>`}</div>`;
}

async function pageTaskManager(id) {
  setActiveNav("taskmanagers");
  const tm = await api(`taskmanagers/${encodeURIComponent(decodeURIComponent(id))}`);
  setCrumbs([["Task Managers", "#/taskmanagers"], [tm.id]]);
  const rows = tm.tasks.map((t) => `
    <tr class="link" onclick="location.hash='#/job/${esc(t.jid)}/overview?vertex=${esc(t.vertexId)}'">
      <td><a href="#/job/${esc(t.jid)}">${esc(t.jobName)}</a></td>
      <td>${esc(t.vertexName)}</td>
      <td class="num">${t.subtask}</td>
      <td class="num">${fmtCount(t.metrics["read-records"])}</td>
      <td class="num">${fmtCount(t.metrics["write-records"])}</td>
      <td>${badge(t.status)}</td>
    </tr>`).join("");
  return `
    <div class="cards">
      <div class="card"><div class="label">Slots</div><div class="value">${tm.slotsNumber}</div></div>
      <div class="card"><div class="label">Free Slots</div><div class="value">${tm.freeSlots}</div></div>
      <div class="card"><div class="label">Last Heartbeat</div><div class="value">${fmtDuration(Math.max(0, Date.now() - tm.timeSinceLastHeartbeat))} <small>ago</small></div></div>
      <div class="card"><div class="label">Subtasks</div><div class="value">${tm.tasks.length}</div></div>
    </div>
    <div class="panel"><h2>TaskManager ${esc(tm.id)}</h2><div class="body"><dl class="kv">
      <dt>ID</dt><dd class="mono">${esc(tm.id)}</dd><dt>Data address</dt><dd class="mono">${esc(tm.path)}</dd>
      <dt>CPU cores</dt><dd>${tm.hardware && tm.hardware.cpuCores ? tm.hardware.cpuCores : "–"}</dd>
      <dt>Physical memory</dt><dd>${tm.hardware && tm.hardware.physicalMemory ? fmtBytes(tm.hardware.physicalMemory) : "–"}</dd>
    </dl></div></div>
    <div class="panel"><h2>Subtasks on this TaskManager</h2>
      ${rows ? `<table><thead><tr><th>Job</th><th>Operator</th><th class="num">Subtask</th><th class="num">Records Received</th><th class="num">Records Sent</th><th>Status</th></tr></thead><tbody>${rows}</tbody></table>`
        : `<div class="empty">No subtask runs here.</div>`}</div>`;
}

// ---------------------------------------------------------------- actions

function openModal(title, bodyHtml, confirmLabel, onConfirm) {
  const modal = document.getElementById("modal");
  document.getElementById("modal-title").textContent = title;
  document.getElementById("modal-body").innerHTML = bodyHtml;
  const confirm = document.getElementById("modal-confirm");
  confirm.textContent = confirmLabel;
  confirm.hidden = false;
  confirm.disabled = false;
  confirm.onclick = async () => {
    confirm.disabled = true;
    try { await onConfirm(); } catch (e) { showResult(false, e.message); }
  };
  document.getElementById("modal-cancel").textContent = "Cancel";
  modal.hidden = false;
}

function closeModal() {
  document.getElementById("modal").hidden = true;
  render();
}

function showResult(ok, message) {
  document.getElementById("modal-body").insertAdjacentHTML("beforeend", `<p class="${ok ? "result-ok" : "result-bad"}">${esc(message)}</p>`);
  document.getElementById("modal-confirm").hidden = true;
  document.getElementById("modal-cancel").textContent = "Close";
}

const TARGET_INPUT = `<label>Target directory <span class="muted">(empty: the configured state.savepoints.dir)</span>
  <input id="target-dir" placeholder="file:///path/to/savepoints"></label>`;

async function pollSavepoint(jid, requestId) {
  for (;;) {
    const status = await api(`jobs/${jid}/savepoints/${requestId}`);
    if (status.status.id === "COMPLETED") {
      const op = status.operation || {};
      if (op.location) return showResult(true, `Savepoint written to ${op.location}`);
      const cause = op["failure-cause"] ? op["failure-cause"]["stack-trace"] : "unknown failure";
      return showResult(false, `Savepoint failed: ${cause}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
}

function targetBody(field) {
  const value = document.getElementById("target-dir").value.trim();
  return JSON.stringify(value ? { [field]: value } : {});
}

function actionSavepoint(jid) {
  openModal("Trigger a savepoint", `<p>Writes a savepoint of the running job; the job keeps running.</p>${TARGET_INPUT}`, "Trigger Savepoint", async () => {
    const body = targetBody("target-directory");
    const { "request-id": requestId } = await api(`jobs/${jid}/savepoints`, { method: "POST", headers: { "Content-Type": "application/json" }, body });
    document.getElementById("modal-body").insertAdjacentHTML("beforeend", `<p class="muted">Savepoint in progress (request ${esc(requestId)})…</p>`);
    await pollSavepoint(jid, requestId);
  });
}

function actionStop(jid) {
  openModal("Stop the job with a savepoint", `<p>Takes a savepoint, commits the sinks, and stops the job (state FINISHED). Restart it later with <code>weir run -s &lt;savepoint&gt;</code>.</p>${TARGET_INPUT}`, "Stop with Savepoint", async () => {
    const body = targetBody("targetDirectory");
    const { "request-id": requestId } = await api(`jobs/${jid}/stop`, { method: "POST", headers: { "Content-Type": "application/json" }, body });
    document.getElementById("modal-body").insertAdjacentHTML("beforeend", `<p class="muted">Stopping (request ${esc(requestId)})…</p>`);
    await pollSavepoint(jid, requestId);
  });
}

function actionCancel(jid) {
  openModal("Cancel the job", `<p>Cancels the job at once, without a savepoint. Its state survives only in retained checkpoints.</p>`, "Cancel Job", async () => {
    await api(`jobs/${jid}?mode=cancel`, { method: "PATCH" });
    showResult(true, "Cancel requested; the job goes CANCELLING, then CANCELED.");
  });
}

// ---------------------------------------------------------------- deployments (weir operator)

function lifecycleBadge(state) {
  const colour = { STABLE: "RUNNING", DEPLOYED: "CREATED", CREATED: "CREATED", UPGRADING: "RESTARTING",
    ROLLING_BACK: "RESTARTING", SUSPENDED: "SUSPENDED", ROLLED_BACK: "CANCELED", FAILED: "FAILED", DELETING: "CANCELLING" }[state] || "CREATED";
  return `<span class="state st-${esc(colour)}">${esc(state)}</span>`;
}

async function pageDeployments() {
  setCrumbs([["Deployments"]]);
  setActiveNav("deployments");
  const { deployments } = await api("deployments");
  if (!deployments.length) {
    return `<div class="panel"><h2>Deployments</h2><p class="muted">No deployment is declared. <code>weir deployment apply -f FILE</code> declares one.</p></div>`;
  }
  const rows = deployments.map((d) => {
    const st = d.status || {};
    const job = st.jobStatus || {};
    const op = st.operation;
    return `<tr class="link" onclick="location.hash='#/deployment/${encodeURIComponent(d.metadata.name)}'">
      <td><a href="#/deployment/${encodeURIComponent(d.metadata.name)}">${esc(d.metadata.name)}</a></td>
      <td>${lifecycleBadge(st.lifecycleState || "CREATED")}${op ? `<div class="muted">${esc(op.kind)}: ${esc(op.step.name)}</div>` : ""}</td>
      <td>${job.state ? badge(job.state) : "-"}</td>
      <td>${esc(d.spec.job.name)} <span class="muted">p=${esc(String(d.spec.job.parallelism || "default"))}</span></td>
      <td>${esc(d.spec.job.upgradeMode)}</td>
      <td>${esc(String(st.observedGeneration || 0))} / ${esc(String(d.metadata.generation))}</td>
      <td>${st.error ? `<span class="error-text">${esc(st.error)}</span>` : ""}</td></tr>`;
  }).join("");
  return `<div class="panel"><h2>Deployments</h2><table>
    <tr><th>Name</th><th>Lifecycle</th><th>Job</th><th>Catalog job</th><th>Upgrade mode</th><th>Generation (observed / applied)</th><th>Error</th></tr>${rows}</table></div>`;
}

async function pageDeployment(name) {
  setCrumbs([["Deployments", "#/deployments"], [name]]);
  setActiveNav("deployments");
  const d = await api(`deployments/${encodeURIComponent(name)}`);
  const st = d.status || {};
  const job = st.jobStatus || {};
  const rec = st.reconciliationStatus || {};
  const cluster = st.clusterInfo;
  const op = st.operation;
  const history = (st.savepointHistory || []).slice().reverse().map((h) => `<tr>
    <td>${fmtTime(h.timeStamp)}</td><td>${badge(h.triggerType)}</td><td>${esc(h.formatType)}</td><td class="mono">${esc(h.location)}</td></tr>`).join("");
  // Newest first, as kubectl describe's Events read best on a page.
  const events = (d.events || []).slice().reverse().map((e) => `<tr>
    <td>${fmtTime(e.timeMs)}</td><td>${e.type === "Warning" ? `<span class="error-text">Warning</span>` : "Normal"}</td><td>${esc(e.reason)}</td><td>${esc(e.message)}</td></tr>`).join("");
  const refused = st.refusedGeneration != null && st.refusedGeneration === d.metadata.generation;
  const specRow = (label, spec) => spec ? `<tr><th>${label}</th><td>${esc(spec.binary)} · ${esc(spec.job.name)} ${esc((spec.job.args || []).join(" "))} · p=${esc(String(spec.job.parallelism || "default"))} · ${esc(spec.job.upgradeMode)} · ${esc(spec.job.state)}</td></tr>` : "";
  return `
    <div class="cards">
      <div class="card"><div class="label">Lifecycle</div><div class="value">${lifecycleBadge(st.lifecycleState || "CREATED")}</div></div>
      <div class="card"><div class="label">Job</div><div class="value">${job.state ? badge(job.state) : "-"}</div></div>
      <div class="card"><div class="label">Generation</div><div class="value">${esc(String(st.observedGeneration || 0))} <small>of ${esc(String(d.metadata.generation))}${refused ? ` · <span class="error-text">${esc(String(st.refusedGeneration))} refused</span>` : ""}</small></div></div>
      <div class="card"><div class="label">Savepoints</div><div class="value">${(st.savepointHistory || []).length}</div></div>
    </div>
    ${st.error ? `<div class="panel"><h2>Error</h2><p class="error-text">${esc(st.error)}</p></div>` : ""}
    ${op ? `<div class="panel"><h2>In progress</h2><p>${esc(op.kind)} to generation ${esc(String(op.generation))} (${esc(op.mode)} mode): <b>${esc(op.step.name)}</b>${op.restoreFrom ? ` · from <span class="mono">${esc(op.restoreFrom)}</span>` : ""}</p></div>` : ""}
    <div class="panel"><h2>Job status</h2><table>
      <tr><th>Job</th><td>${job.jobId ? (cluster ? `<a href="${esc(cluster.restAddress)}/#/job/${esc(job.jobId)}" target="_blank" class="mono">${esc(job.jobId)}</a>` : `<span class="mono">${esc(job.jobId)}</span>`) : "-"}</td></tr>
      <tr><th>Cluster</th><td>${cluster ? `<a href="${esc(cluster.restAddress)}/" target="_blank">${esc(cluster.restAddress)}</a> <span class="muted">(${esc(cluster.binary)})</span>` : "none running"}</td></tr>
      <tr><th>Started</th><td>${job.startTime ? fmtTime(job.startTime) : "-"}</td></tr>
      <tr><th>Restored from</th><td class="mono">${esc(job.restoredFrom || "-")}</td></tr>
      <tr><th>Upgrade savepoint</th><td class="mono">${esc(job.upgradeSavepointPath || "-")}</td></tr>
      <tr><th>Last checkpoint</th><td class="mono">${esc(job.lastCheckpointPath || "-")}</td></tr></table></div>
    <div class="panel"><h2>Reconciliation</h2><table>
      <tr><th>State</th><td>${esc(rec.state || "-")}</td></tr>
      <tr><th>Since</th><td>${rec.reconciliationTimestamp ? fmtTime(rec.reconciliationTimestamp) : "-"}</td></tr>
      ${specRow("Last reconciled spec", rec.lastReconciledSpec)}
      ${specRow("Last stable spec", rec.lastStableSpec)}</table></div>
    <div class="panel"><h2>Savepoint history</h2>${history ? `<table><tr><th>Time</th><th>Trigger</th><th>Format</th><th>Location</th></tr>${history}</table>` : `<p class="muted">No savepoint yet.</p>`}</div>
    <div class="panel" id="deployment-events"><h2>Events</h2>${events ? `<table><tr><th>Time</th><th>Type</th><th>Reason</th><th>Message</th></tr>${events}</table>` : `<p class="muted">No events recorded.</p>`}</div>`;
}

// ---------------------------------------------------------------- start

async function start() {
  document.getElementById("modal-cancel").onclick = closeModal;
  document.getElementById("refresh-toggle").onclick = () => { paused = !paused; schedule(); if (!paused) render(); };
  try {
    const config = await api("config");
    refreshMs = Math.max(500, config["refresh-interval"] || refreshMs);
    operatorMode = !!(config.features && config.features.deployments);
    document.body.classList.toggle("operator", operatorMode);
    document.getElementById("version").textContent = config["flink-version"];
  } catch (_) { /* keep the defaults; render() reports the error */ }
  window.addEventListener("hashchange", render);
  schedule();
  render();
}

start();
