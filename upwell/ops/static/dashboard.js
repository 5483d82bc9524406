// upwell dashboard: polls the JSON API and redraws. No framework, no CDN: this file ships in the package.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const code = params.get("code"); // the function key on Azure, carried to every call and link
  const withKey = (url) => (code ? url + (url.includes("?") ? "&" : "?") + "code=" + encodeURIComponent(code) : url);
  const base = location.pathname.replace(/\/+$/, ""); // .../api/dashboard
  const api = (path) => withKey(base + "/" + path);
  const root = base.replace(/\/dashboard$/, ""); // .../api: the HTTP API, whose routes the buttons call
  const apiRoot = (path) => withKey(root + "/" + path);
  const POLL_MS = 1500;
  const ENDED = ["succeeded", "partially_failed", "failed", "rejected", "cancelled"];
  const filters = {owner: params.get("owner") || "", project: params.get("project") || "", state: params.get("state") || ""};
  let openJob = null;
  let lastJobs = [];

  const $ = (sel) => document.querySelector(sel);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const usd = (v) => (v == null ? "—" : v === 0 ? "$0.00" : Math.abs(v) < 0.0001 ? "<$0.0001" : "$" + (Math.abs(v) < 1 ? v.toPrecision(3) : v.toFixed(2)));
  const dur = (s) => (s == null ? "—" : s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h");
  const time = (iso) => (iso ? String(iso).slice(11, 19) : "");
  const num = (v, digits) => (v == null ? "—" : Number(v).toFixed(digits));
  const pill = (state) => `<span class="pill st-${esc(state)}" data-state="${esc(state)}">${esc(state.replace("_", " "))}</span>`;

  // Redraw only what changed: a link under the pointer is not replaced while someone clicks it.
  function setHTML(el, html) {
    if (el._upwell !== html) { el.innerHTML = html; el._upwell = html; }
  }

  function rows(tbody, items, render) {
    setHTML(tbody, items.length ? items.map(render).join("") : `<tr><td colspan="10" class="muted">none</td></tr>`);
  }

  // Filters: owner, project and state, offered from the jobs the caller can see; kept in the URL's query.
  function drawFilters(jobs) {
    for (const key of ["owner", "project", "state"]) {
      const values = [...new Set(jobs.map((j) => j[key]).filter(Boolean))].sort();
      if (filters[key] && !values.includes(filters[key])) values.unshift(filters[key]);
      setHTML($("#f-" + key), `<option value="">all</option>` + values.map((v) => `<option value="${esc(v)}"${v === filters[key] ? " selected" : ""}>${esc(v)}</option>`).join(""));
    }
  }

  const shown = (j) => (!filters.owner || j.owner === filters.owner) && (!filters.project || j.project === filters.project) &&
    (!filters.state || j.state === filters.state);

  function actions(j) {
    const ended = ENDED.includes(j.status);
    return `<button type="button" data-action="cancel" data-job="${esc(j.job_id)}"${ended ? " disabled" : ""}>cancel</button>
      <button type="button" data-action="rerun" data-job="${esc(j.job_id)}"${ended && j.status !== "rejected" ? "" : " disabled"}>rerun</button>`;
  }

  function drawJobs(jobs) {
    lastJobs = jobs;
    drawFilters(jobs);
    const visible = jobs.filter(shown);
    $("#jobs-count").textContent = visible.length === jobs.length ? `${jobs.length}` : `${visible.length} of ${jobs.length}`;
    rows($("#jobs tbody"), visible, (j) => `<tr data-job="${esc(j.job_id)}" data-project="${esc(j.project)}" data-owner="${esc(j.owner)}">
      <td><a class="job" data-open="${esc(j.job_id)}">${esc(j.name || j.job_id)}</a><div class="muted mono">${esc(j.job_id)}</div></td>
      <td class="state">${pill(j.state)}${j.message ? `<div class="muted">${esc(j.message)}</div>` : ""}${j.notify_failed ? `<div class="st-failed">${esc(j.notify_failed)}</div>` : ""}</td>
      <td><span class="bar"><span style="width:${Math.round(100 * j.progress)}%"></span></span>
        ${j.shards_finished}/${j.shards_total}${j.shards_failed ? ` <span class="st-failed pill">${j.shards_failed} failed</span>` : ""}${j.points ? `<div class="muted">${j.points.done}/${j.points.total} points</div>` : ""}</td>
      <td class="n">${usd(j.spent_usd)}</td><td class="n">${usd(j.estimate_usd)}</td><td class="n">${dur(j.eta_s)}</td>
      <td class="n">${j.recoveries == null ? `<span title="not read for this job: only open jobs and the newest ended ones are">—</span>` : j.recoveries}</td><td>${esc(j.pool)}</td>
      <td>${esc(j.owner)}<div class="muted">${esc(j.project)}</div></td>
      <td>${j.report ? `<a class="report" href="${esc(withKey(base + "/" + j.report))}">report</a>` : ""}</td>
      <td class="actions">${actions(j)}</td></tr>`);
  }

  // An SVG chart with both axes labelled and their units: ticks at 0, half and the top of the y range,
  // and at the first, middle and last x value. lines: [{key, color}]; x(p) and the labels come from opts.
  function axes(w, h, m, ymax, yUnit, xTicks, xUnit) {
    const y = (v) => h - m.b - (v * (h - m.t - m.b)) / ymax;
    const yt = [...new Set([0, ymax / 2, ymax])];
    const label = (v) => String(Number.isInteger(v) ? v : Number(v.toPrecision(2)));
    // The first and last x labels are anchored inside the plot, so that none is cut at the edge.
    const anchor = (i, n) => (n > 1 && i === 0 ? "start" : n > 1 && i === n - 1 ? "end" : "middle");
    return `<g class="axis y">${yt.map((v) => `<line x1="${m.l - 3}" x2="${w - m.r}" y1="${y(v)}" y2="${y(v)}" stroke="#e5e7eb"/>
        <text x="${m.l - 5}" y="${y(v) + 3}" text-anchor="end">${label(v)}</text>`).join("")}
        <text class="unit" transform="translate(10 ${(h - m.b + m.t) / 2}) rotate(-90)" text-anchor="middle">${esc(yUnit)}</text></g>
      <g class="axis x"><line x1="${m.l}" x2="${w - m.r}" y1="${h - m.b}" y2="${h - m.b}" stroke="#6b7280"/>
        ${xTicks.map(([x, text], i) => `<text x="${x}" y="${h - m.b + 12}" text-anchor="${anchor(i, xTicks.length)}">${esc(text)}</text>`).join("")}
        <text class="unit" x="${(w + m.l - m.r) / 2}" y="${h - 2}" text-anchor="middle">${esc(xUnit)}</text></g>`;
  }

  const M = {l: 38, r: 8, t: 8, b: 30};
  // The smallest 1, 2 or 5 × 10^k at or above v: a y range whose half and whole are round numbers.
  const nice = (v) => {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    return [1, 2, 5, 10].map((k) => k * p).find((c) => c >= v * (1 - 1e-9));
  };

  function chart(series, max) {
    const w = 360, h = 150, n = series.length;
    if (!n) return `<svg width="${w}" height="${h}"><text x="8" y="48" fill="#6b7280">no decisions yet</text></svg>`;
    const top = Math.max(1, max, ...series.map((p) => Math.max(p.nodes, p.backlog)));
    const x = (i) => (n === 1 ? (w + M.l - M.r) / 2 : M.l + (i * (w - M.l - M.r)) / (n - 1));
    const y = (v) => h - M.b - (v * (h - M.t - M.b)) / top;
    const line = (key, color) => `<polyline fill="none" stroke="${color}" stroke-width="2" points="${series.map((p, i) => `${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ")}"/>`;
    // Minutes when the series spans more than a few; seconds otherwise, so the labels differ.
    const span = (Date.parse(series[n - 1].ts) - Date.parse(series[0].ts)) / 1000;
    const fine = !(span > 300);
    const ticks = [...new Set([0, Math.floor((n - 1) / 2), n - 1])].map((i) => [x(i), time(series[i].ts).slice(0, fine ? 8 : 5)]);
    return `<svg class="chart" width="${w}" height="${h}" role="img" aria-label="nodes and backlog (shards) over time (UTC)">
      ${axes(w, h, M, top, "nodes · shards", ticks, fine ? "time (UTC, hh:mm:ss)" : "time (UTC, hh:mm)")}${line("backlog", "#a16207")}${line("nodes", "#1d4ed8")}${line("spot", "#15803d")}</svg>`;
  }

  // CPU seconds per shard of the open job, one bar each (x: the shards, in order).
  function shardChart(shards) {
    const w = 480, h = 150, n = shards.length;
    const measured = shards.filter((s) => s.cpu_s != null && s.cpu_s > 0);
    if (!measured.length) return `<svg class="chart" width="${w}" height="40"><text x="8" y="24" fill="#6b7280">no CPU measured yet</text></svg>`;
    const top = nice(Math.max(...measured.map((s) => s.cpu_s)));
    const bw = (w - M.l - M.r) / n;
    const y = (v) => h - M.b - (v * (h - M.t - M.b)) / top;
    const bars = shards.map((s, i) => `<rect x="${(M.l + i * bw + 1).toFixed(1)}" y="${y(s.cpu_s || 0).toFixed(1)}" width="${Math.max(1, bw - 2).toFixed(1)}"
      height="${(h - M.b - y(s.cpu_s || 0)).toFixed(1)}" fill="#1d4ed8"><title>${esc(s.shard_id)}: ${s.cpu_s == null ? "—" : s.cpu_s.toFixed(2)} CPU s</title></rect>`).join("");
    const ticks = [...new Set([0, n - 1])].map((i) => [M.l + (i + 0.5) * bw, shards[i].shard_id.slice(-8)]);
    return `<svg class="chart" id="cpu-chart" width="${w}" height="${h}" role="img" aria-label="CPU seconds per shard">
      ${axes(w, h, M, top, "CPU seconds", ticks, "shard")}${bars}</svg>`;
  }

  function drawPools(pools) {
    setHTML($("#pools"), pools.map((p) => `<div class="pool" data-pool="${esc(p.pool)}">
      <b>${esc(p.pool)}</b> <span class="muted">${esc(p.backend)} · ${esc(p.price_key)}</span>
      <div>nodes <b class="nodes">${p.nodes}</b> (target ${p.target}, ${p.min_nodes}–${p.max_nodes}) · spot share ${Math.round(100 * p.spot_share)}%
      ${p.capped_by ? ` · capped by <b>${esc(p.capped_by)}</b>` : ""}</div>
      ${chart(p.series, p.max_nodes)}
      <div class="legend"><span style="color:#1d4ed8">■ nodes</span><span style="color:#a16207">■ backlog</span><span style="color:#15803d">■ spot</span></div>
      ${p.message ? `<div class="st-failed">${esc(p.message)}</div>` : ""}</div>`).join(""));
  }

  function drawDetail(d) {
    $("#job-detail").hidden = false;
    $("#detail-id").textContent = d.job_id;
    setHTML($("#detail-summary"), `${pill(d.state)} ${esc(d.name)} · ${d.shards_finished}/${d.shards_total} shards${d.points ? ` (${d.points.done}/${d.points.total} points, ${d.points.per_item} a shard)` : ""} ·
      cost so far ${usd(d.spent_usd)} of estimate ${usd(d.estimate_usd)} ${d.estimate_basis ? `<span class="muted">(${esc(d.estimate_basis)})</span>` : ""}
      · recoveries ${d.recoveries ?? "—"} · ETA ${dur(d.eta_s)}
      ${d.report ? ` · <a id="detail-report" href="${esc(withKey(base + "/" + d.report))}">open the report</a>` : ""}`);
    setHTML($("#detail-actions"), actions(d));
    setHTML($("#detail-chart"), shardChart(d.shards));
    rows($("#shards tbody"), d.shards, (s) => `<tr data-shard="${esc(s.shard_id)}"><td class="mono">${esc(s.shard_id)}</td><td>${pill(s.status)}</td>
      <td class="mono">${esc(s.node)}</td><td class="n">${s.attempts}</td><td class="n">${s.preemptions}</td>
      <td class="n">${s.node_seconds.toFixed(1)}</td><td class="n cpu">${num(s.cpu_s, 2)}</td><td class="n rss">${num(s.max_rss_mb, 1)}</td>
      <td class="n">${usd(s.cost_usd)}</td>
      <td>${s.silent ? `<span class="silent" title="the payload printed nothing">no output</span>`
        : s.log ? `<a class="log" href="${esc(apiRoot(s.log))}" target="_blank" rel="noopener">log</a>` : ""}</td><td>${esc(s.error)}</td></tr>`);
  }

  function drawCaller(c) {
    $("#caller").textContent = !c ? "" : c.projects == null ? (c.kind === "user" ? `${c.name} · every project` : "function key: automation view")
      : `${c.name || "signed in"} · project${c.projects.length === 1 ? "" : "s"}: ${c.projects.join(", ") || "none"}`;
  }

  // The buttons call the API's own routes with the page's key: the same rule holds for both.
  async function act(action, jobId) {
    if (action === "cancel" && !window.confirm(`Cancel job ${jobId}? Running shards checkpoint and stop.`)) return;
    const out = $("#action-result");
    try {
      const r = await fetch(apiRoot("jobs/" + encodeURIComponent(jobId) + "/" + action), {method: "POST", cache: "no-store"});
      const body = await r.json().catch(() => ({}));
      out.dataset.status = String(r.status);
      out.textContent = !r.ok ? `${action} ${jobId}: HTTP ${r.status}: ${body.error || ""}`
        : action === "cancel" ? `cancelled ${jobId}: ${body.queued} queued shard(s) cancelled, ${body.running} running told to stop`
        : body.shards.length ? `re-running ${body.shards.length} shard(s) of ${jobId}` : `nothing to re-run in ${jobId}: every shard succeeded`;
    } catch (e) {
      out.dataset.status = "error";
      out.textContent = `${action} ${jobId}: ${e.message}`;
    }
    tick();
  }

  async function get(path) {
    const r = await fetch(api(path), {cache: "no-store"});
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  async function openDetail() {
    const r = await fetch(api("api/jobs/" + encodeURIComponent(openJob)), {cache: "no-store"});
    if (r.ok) return drawDetail(await r.json());
    const body = await r.json().catch(() => ({}));
    $("#job-detail").hidden = false;
    $("#detail-id").textContent = openJob;
    setHTML($("#detail-summary"), `<span class="st-failed pill" data-http="${r.status}">HTTP ${r.status}</span> ${esc(body.error || "")}`);
    setHTML($("#detail-actions"), "");
    setHTML($("#detail-chart"), "");
    rows($("#shards tbody"), [], () => "");
  }

  async function tick() {
    try {
      const s = await get("api/state");
      drawCaller(s.caller);
      drawJobs(s.jobs);
      drawPools(s.pools);
      rows($("#decisions tbody"), s.decisions, (d) => `<tr><td>${time(d.ts)}</td><td>${esc(d.pool)}</td><td class="n">${d.target}</td>
        <td>${esc(d.capped_by)}</td><td class="muted">${esc(d.reason)}</td></tr>`);
      rows($("#quarantine tbody"), s.quarantine, (q) => `<tr><td class="mono">${esc(q.blob)}</td><td>${esc(q.field)}</td><td>${esc(q.error)}</td></tr>`);
      rows($("#nodes tbody"), s.nodes || [], (n) => `<tr class="${n.dead ? "dead" : ""}"><td>${esc(n.pool)}</td><td class="mono">${esc(n.node)}</td>
        <td>${pill(n.dead ? "dead" : n.state)}${n.event ? ` <span class="muted">${esc(n.event)}</span>` : ""}</td><td class="n">${dur(n.age_s)}</td><td class="mono">${esc(n.shards.join(" "))}</td>
        <td>${n.draining ? "yes" : ""}</td></tr>`);
      rows($("#janitor tbody"), s.janitor, (f) => `<tr><td>${time(f.RowKey)}</td><td>${esc(f.kind)}</td><td class="mono">${esc(f.name)}</td>
        <td>${esc(f.reason)}</td><td>${esc(f.action)}</td><td>${esc(f.result || (f.applied ? "" : "dry run"))}</td></tr>`);
      if (openJob) await openDetail();
      $("#updated").textContent = "updated " + time(s.generated_at) + " UTC";
      $("#conn").classList.remove("offline");
      $("#conn").textContent = "live";
    } catch (e) {
      $("#conn").classList.add("offline");
      $("#conn").textContent = "offline: " + e.message;
    }
  }

  document.addEventListener("change", (ev) => {
    const key = ev.target.id && ev.target.id.startsWith("f-") ? ev.target.id.slice(2) : null;
    if (!key) return;
    filters[key] = ev.target.value;
    const q = new URLSearchParams(location.search);
    for (const [k, v] of Object.entries(filters)) { if (v) q.set(k, v); else q.delete(k); }
    history.replaceState(null, "", location.pathname + "?" + q.toString() + location.hash);
    drawJobs(lastJobs);
  });
  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-action]");
    if (b) { act(b.dataset.action, b.dataset.job); return; }
    const a = ev.target.closest("[data-open]");
    if (a) { openJob = a.dataset.open; location.hash = "job=" + openJob; tick(); }
    if (ev.target.id === "detail-close") { openJob = null; $("#job-detail").hidden = true; location.hash = ""; }
  });
  const m = location.hash.match(/job=([^&]+)/);
  if (m) openJob = decodeURIComponent(m[1]);
  tick();
  setInterval(tick, POLL_MS);
})();
