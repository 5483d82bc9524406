// upwell dashboard: polls the JSON API and redraws. No framework, no CDN: this file ships in the package.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const code = params.get("code"); // the function key on Azure, carried to every call and link
  const withKey = (url) => (code ? url + (url.includes("?") ? "&" : "?") + "code=" + encodeURIComponent(code) : url);
  const base = location.pathname.replace(/\/+$/, ""); // .../api/dashboard
  const api = (path) => withKey(base + "/" + path);
  const POLL_MS = 1500;
  let openJob = null;

  const $ = (sel) => document.querySelector(sel);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const usd = (v) => (v == null ? "—" : v === 0 ? "$0.00" : Math.abs(v) < 0.0001 ? "<$0.0001" : "$" + (Math.abs(v) < 1 ? v.toPrecision(3) : v.toFixed(2)));
  const dur = (s) => (s == null ? "—" : s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h");
  const time = (iso) => (iso ? String(iso).slice(11, 19) : "");
  const pill = (state) => `<span class="pill st-${esc(state)}" data-state="${esc(state)}">${esc(state.replace("_", " "))}</span>`;

  // Redraw only what changed: a link under the pointer is not replaced while someone clicks it.
  function setHTML(el, html) {
    if (el._upwell !== html) { el.innerHTML = html; el._upwell = html; }
  }

  function rows(tbody, items, render) {
    setHTML(tbody, items.length ? items.map(render).join("") : `<tr><td colspan="10" class="muted">none</td></tr>`);
  }

  function drawJobs(jobs) {
    rows($("#jobs tbody"), jobs, (j) => `<tr data-job="${esc(j.job_id)}">
      <td><a class="job" data-open="${esc(j.job_id)}">${esc(j.name || j.job_id)}</a><div class="muted mono">${esc(j.job_id)}</div></td>
      <td class="state">${pill(j.state)}${j.message ? `<div class="muted">${esc(j.message)}</div>` : ""}${j.notify_failed ? `<div class="st-failed">${esc(j.notify_failed)}</div>` : ""}</td>
      <td><span class="bar"><span style="width:${Math.round(100 * j.progress)}%"></span></span>
        ${j.shards_finished}/${j.shards_total}${j.shards_failed ? ` <span class="st-failed pill">${j.shards_failed} failed</span>` : ""}</td>
      <td class="n">${usd(j.spent_usd)}</td><td class="n">${usd(j.estimate_usd)}</td><td class="n">${dur(j.eta_s)}</td>
      <td class="n">${j.recoveries == null ? "—" : j.recoveries}</td><td>${esc(j.pool)}</td>
      <td>${esc(j.owner)}<div class="muted">${esc(j.project)}</div></td>
      <td>${j.report ? `<a class="report" href="${esc(withKey(base + "/" + j.report))}">report</a>` : ""}</td></tr>`);
  }

  function chart(series, max) {
    const w = 320, h = 90, n = series.length;
    if (!n) return `<svg width="${w}" height="${h}"><text x="8" y="48" fill="#6b7280">no decisions yet</text></svg>`;
    const top = Math.max(1, max, ...series.map((p) => Math.max(p.nodes, p.backlog)));
    const x = (i) => (n === 1 ? w / 2 : (i * (w - 8)) / (n - 1) + 4);
    const y = (v) => h - 4 - (v * (h - 12)) / top;
    const line = (key, color) => `<polyline fill="none" stroke="${color}" stroke-width="2" points="${series.map((p, i) => `${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ")}"/>`;
    return `<svg width="${w}" height="${h}" role="img" aria-label="nodes and backlog">${line("backlog", "#a16207")}${line("nodes", "#1d4ed8")}${line("spot", "#15803d")}</svg>`;
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
    setHTML($("#detail-summary"), `${pill(d.state)} ${esc(d.name)} · ${d.shards_finished}/${d.shards_total} shards ·
      cost so far ${usd(d.spent_usd)} of estimate ${usd(d.estimate_usd)} ${d.estimate_basis ? `<span class="muted">(${esc(d.estimate_basis)})</span>` : ""}
      · recoveries ${d.recoveries} · ETA ${dur(d.eta_s)}
      ${d.report ? ` · <a id="detail-report" href="${esc(withKey(base + "/" + d.report))}">open the report</a>` : ""}`);
    rows($("#shards tbody"), d.shards, (s) => `<tr><td class="mono">${esc(s.shard_id)}</td><td>${pill(s.status)}</td>
      <td class="mono">${esc(s.node)}</td><td class="n">${s.attempts}</td><td class="n">${s.preemptions}</td>
      <td class="n">${s.node_seconds.toFixed(1)}</td><td class="n">${usd(s.cost_usd)}</td><td>${esc(s.error)}</td></tr>`);
  }

  async function get(path) {
    const r = await fetch(api(path), {cache: "no-store"});
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  async function tick() {
    try {
      const s = await get("api/state");
      drawJobs(s.jobs);
      drawPools(s.pools);
      rows($("#decisions tbody"), s.decisions, (d) => `<tr><td>${time(d.ts)}</td><td>${esc(d.pool)}</td><td class="n">${d.target}</td>
        <td>${esc(d.capped_by)}</td><td class="muted">${esc(d.reason)}</td></tr>`);
      rows($("#quarantine tbody"), s.quarantine, (q) => `<tr><td class="mono">${esc(q.blob)}</td><td>${esc(q.field)}</td><td>${esc(q.error)}</td></tr>`);
      rows($("#nodes tbody"), s.nodes || [], (n) => `<tr class="${n.dead ? "dead" : ""}"><td>${esc(n.pool)}</td><td class="mono">${esc(n.node)}</td>
        <td>${pill(n.dead ? "dead" : n.state)}</td><td class="n">${dur(n.age_s)}</td><td class="mono">${esc(n.shards.join(" "))}</td>
        <td>${n.draining ? "yes" : ""}</td></tr>`);
      rows($("#janitor tbody"), s.janitor, (f) => `<tr><td>${time(f.RowKey)}</td><td>${esc(f.kind)}</td><td class="mono">${esc(f.name)}</td>
        <td>${esc(f.reason)}</td><td>${esc(f.action)}</td><td>${esc(f.result || (f.applied ? "" : "dry run"))}</td></tr>`);
      if (openJob) drawDetail(await get("api/jobs/" + encodeURIComponent(openJob)));
      $("#updated").textContent = "updated " + time(s.generated_at) + " UTC";
      $("#conn").classList.remove("offline");
      $("#conn").textContent = "live";
    } catch (e) {
      $("#conn").classList.add("offline");
      $("#conn").textContent = "offline: " + e.message;
    }
  }

  document.addEventListener("click", (ev) => {
    const a = ev.target.closest("[data-open]");
    if (a) { openJob = a.dataset.open; location.hash = "job=" + openJob; tick(); }
    if (ev.target.id === "detail-close") { openJob = null; $("#job-detail").hidden = true; location.hash = ""; }
  });
  const m = location.hash.match(/job=([^&]+)/);
  if (m) openJob = decodeURIComponent(m[1]);
  tick();
  setInterval(tick, POLL_MS);
})();
