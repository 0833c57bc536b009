// Sangama operator page. Plain JavaScript, no dependencies, no build step.
// Every string that comes from the server is put into the page with textContent
// (never innerHTML), so node ids, notes and addresses cannot inject markup.
"use strict";

(() => {
  const REFRESH_MS = 2000;
  const BUCKET_MS = 10_000;
  const WINDOW_BUCKETS = 180; // 30 minutes of 10-second buckets, as the server keeps
  const GIB = 2 ** 30;
  const STAGE_COLOURS = [
    "#2456c7", "#1f8f8a", "#6b4bc4", "#2f7d32", "#b0589b", "#3b74a8", "#8a6d1f", "#4a5b9c",
  ];

  // ---------------------------------------------------------------- helpers

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  /** Build an element. `attrs`: className, text, title, dataset-style "data-*" keys, etc. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null) continue;
      if (key === "className") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key === "style") Object.assign(node.style, value);
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  const $ = (id) => document.getElementById(id);

  function setText(node, text) {
    const value = String(text);
    if (node.textContent !== value) node.textContent = value;
  }

  function show(node, visible) {
    node.classList.toggle("hidden", !visible);
  }

  function errorMessage(data, res) {
    if (data && typeof data === "object") {
      const detail = data.detail;
      if (typeof detail === "string") return detail;
      if (Array.isArray(detail)) {
        // FastAPI validation errors: [{loc: ["body", "uses"], msg: "..."}]
        return detail.map((e) => {
          const where = Array.isArray(e.loc) ? e.loc.filter((p) => p !== "body").join(".") : "";
          return where ? `${where}: ${e.msg}` : String(e.msg);
        }).join("; ");
      }
    }
    if (typeof data === "string" && data && data.length < 300) return data;
    return `${res.status} ${res.statusText || "error"}`;
  }

  let clockSkewMs = 0; // server clock minus this browser's clock, when they disagree noticeably

  async function api(method, path, body) {
    const options = { method, headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const sent = Date.now();
    let res;
    try {
      res = await fetch(path, options);
    } catch (err) {
      throw new ApiError(0, "cannot reach the coordinator");
    }
    const received = Date.now();
    const serverDate = Date.parse(res.headers.get("date") || "");
    if (!Number.isNaN(serverDate)) {
      const skew = serverDate - (sent + received) / 2;
      clockSkewMs = Math.abs(skew) > 3000 ? skew : 0; // the Date header has 1 s resolution
    }
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (err) { data = text; }
    }
    if (!res.ok) throw new ApiError(res.status, errorMessage(data, res));
    return data;
  }

  const now = () => Date.now() + clockSkewMs;

  /** Parse the server's ISO times; a time without a zone is UTC (SQLite drops the zone). */
  function parseTime(value) {
    if (!value) return null;
    let text = String(value).replace(/(\.\d{3})\d+/, "$1");
    if (!/(Z|[+-]\d\d:?\d\d)$/i.test(text)) text += "Z";
    const t = Date.parse(text);
    return Number.isNaN(t) ? null : t;
  }

  function ago(t) {
    if (t === null) return "never";
    const s = Math.max(0, Math.round((now() - t) / 1000));
    if (s < 2) return "just now";
    if (s < 90) return `${s} s ago`;
    const m = Math.round(s / 60);
    if (m < 90) return `${m} min ago`;
    const h = Math.round(m / 60);
    if (h < 48) return `${h} h ago`;
    return `${Math.round(h / 24)} d ago`;
  }

  function until(t) {
    const s = Math.round((t - now()) / 1000);
    if (s <= 0) return "expired";
    if (s < 90) return `in ${s} s`;
    const m = Math.round(s / 60);
    if (m < 90) return `in ${m} min`;
    const h = Math.round(m / 60);
    if (h < 48) return `in ${h} h`;
    return `in ${Math.round(h / 24)} d`;
  }

  const fullTime = (t) => (t === null ? "" : new Date(t).toLocaleString());
  const clock = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });

  function gib(bytes) {
    if (!bytes) return "—";
    const v = bytes / GIB;
    return `${v >= 10 ? v.toFixed(0) : v.toFixed(1)} GiB`;
  }

  /** Half-open [start, stop) as the inclusive range a person reads. */
  function layerText(start, stop) {
    // As core.types.format_layers: 20 through 29 is "20-29".
    return stop - start === 1 ? `${start}` : `${start}-${stop - 1}`;
  }

  function toast(message) {
    let box = $("toast");
    if (!box) {
      box = el("div", { id: "toast", className: "toast", "data-testid": "toast", role: "alert" });
      document.body.append(box);
    }
    box.textContent = message;
    box.classList.add("visible");
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => box.classList.remove("visible"), 6000);
  }

  /**
   * Keep one table row per item, keyed, reusing rows between refreshes so that buttons
   * are not replaced under the pointer. `make(item)` builds a row, `update(row, item)` fills it.
   */
  function syncRows(tbody, items, key, make, update, emptyText, columns) {
    const existing = new Map();
    for (const row of Array.from(tbody.children)) {
      if (row.dataset.key !== undefined) existing.set(row.dataset.key, row);
      else row.remove();
    }
    const wanted = [];
    for (const item of items) {
      const k = String(key(item));
      let row = existing.get(k);
      if (row) existing.delete(k);
      else {
        row = make(item);
        row.dataset.key = k;
      }
      update(row, item);
      wanted.push(row);
    }
    for (const row of existing.values()) row.remove();
    wanted.forEach((row, i) => {
      if (tbody.children[i] !== row) tbody.insertBefore(row, tbody.children[i] || null);
    });
    if (!items.length) {
      tbody.append(el("tr", {}, el("td", { colspan: columns, className: "empty", text: emptyText })));
    }
  }

  // ---------------------------------------------------------------- login page

  function initLogin() {
    const form = $("login-form");
    const input = $("login-password");
    const error = $("login-error");
    const button = $("login-submit");
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      show(error, false);
      if (!input.value) {
        error.textContent = "Enter the operator password.";
        show(error, true);
        input.focus();
        return;
      }
      button.disabled = true;
      try {
        await api("POST", "/api/v1/login", { password: input.value });
        window.location.replace("/");
      } catch (err) {
        error.textContent = err.message;
        show(error, true);
        input.select();
      } finally {
        button.disabled = false;
      }
    });
  }

  // ---------------------------------------------------------------- dashboard

  const state = { swarm: null, invites: [], events: [], faults: null, timelineKey: "", timer: null, busy: false, failures: 0 };

  function stageIndex(swarm) {
    const index = new Map();
    swarm.plan.forEach((stage, i) => index.set(stage.node_id, i));
    return index;
  }

  const colourOf = (i) => STAGE_COLOURS[i % STAGE_COLOURS.length];

  function renderBanner(swarm) {
    const noPlan = swarm.plan.length === 0;
    show($("plan-error"), noPlan || Boolean(swarm.plan_error));
    setText($("plan-error-text"), swarm.plan_error || "the coordinator has not placed any stage yet");
  }

  // Whether the chain answered the coordinator's own two-token probe: heartbeats and
  // coverage cannot show a link between two stages that carries nothing.
  function renderAnswer(swarm) {
    const a = swarm.answer;
    const box = $("answer");
    const known = Boolean(a) && a.can_answer !== null;
    show(box, known);
    if (!known) return;
    const since = a.since > 0 ? a.since * 1000 : null;
    const checked = a.checked_at > 0 ? a.checked_at * 1000 : null;
    box.classList.toggle("ok", a.can_answer === true);
    box.classList.toggle("bad", a.can_answer === false);
    box.dataset.canAnswer = String(a.can_answer);
    if (a.can_answer) {
      setText($("answer-head"), "The swarm can answer.");
      setText($("answer-text"), `Two tokens came back through the chain in ${Math.round(a.answer_ms)} ms (checked ${ago(checked)}).`);
    } else {
      setText($("answer-head"), `The swarm cannot answer since ${since === null ? "?" : clock(since)},`);
      setText($("answer-text"), `because ${a.reason} (checked ${ago(checked)}).`);
    }
  }

  function renderSummary(swarm, covered) {
    const healthy = swarm.nodes.filter((n) => n.health === "healthy").length;
    setText($("model-name"), swarm.model);
    setText($("stat-nodes"), swarm.nodes.length);
    setText($("stat-healthy"), `${healthy} / ${swarm.nodes.length}`);
    setText($("stat-stages"), swarm.plan.length);
    const cov = $("stat-coverage");
    setText(cov, `${covered} / ${swarm.n_layer}`);
    cov.classList.toggle("ok", swarm.n_layer > 0 && covered === swarm.n_layer);
    cov.classList.toggle("bad", covered < swarm.n_layer);
  }

  /** Coverage bar: one segment per stage, red gaps; returns how many layers are covered. */
  function renderCoverage(swarm, index) {
    const bar = $("coverage-bar");
    const scale = $("coverage-scale");
    const n = swarm.n_layer;
    const stages = [...swarm.plan].sort((a, b) => a.layers[0] - b.layers[0]);
    const parts = [];
    let cursor = 0;
    let covered = 0;
    for (const stage of stages) {
      const start = Math.max(stage.layers[0], cursor);
      const stop = Math.min(stage.layers[1], n);
      if (start > cursor) parts.push({ gap: true, start: cursor, stop: start });
      if (stop > start) {
        parts.push({ gap: false, start, stop, node: stage.node_id });
        covered += stop - start;
        cursor = stop;
      }
    }
    if (cursor < n) parts.push({ gap: true, start: cursor, stop: n });

    const pct = (x) => `${(100 * x) / Math.max(n, 1)}%`;
    bar.replaceChildren(...parts.map((p) => {
      const style = { left: pct(p.start), width: pct(p.stop - p.start) };
      const range = layerText(p.start, p.stop);
      if (p.gap) {
        return el("div", {
          className: "gap", style, "data-testid": "coverage-gap", "data-start": p.start, "data-stop": p.stop,
          title: `no stage holds layers ${range}`,
        }, el("span", { text: `gap ${range}` }));
      }
      style.background = colourOf(index.get(p.node) ?? 0);
      return el("div", {
        className: "segment", style, "data-testid": "coverage-segment", "data-node-id": p.node,
        "data-start": p.start, "data-stop": p.stop, title: `${p.node}: layers ${range}`,
      }, el("span", { className: "seg-node", text: p.node }), el("span", { className: "seg-layers", text: `layers ${range}` }));
    }));
    bar.setAttribute("aria-label", `${covered} of ${n} layers covered`);

    // Scale: 0, n and the stage boundaries, skipping labels that would collide.
    const marks = [...new Set([0, ...parts.map((p) => p.start), n])].sort((a, b) => a - b);
    const kept = [];
    for (const m of marks) {
      if (m === n || !kept.length || (m - kept[kept.length - 1]) / Math.max(n, 1) > 0.05) kept.push(m);
    }
    if (kept.length > 2 && (n - kept[kept.length - 2]) / Math.max(n, 1) <= 0.05) kept.splice(kept.length - 2, 1);
    scale.replaceChildren(...kept.map((m) => el("span", { style: { left: pct(m) }, text: String(m) })));

    const summary = $("coverage-summary");
    const missing = n - covered;
    summary.className = missing === 0 && n > 0 ? "ok" : "bad";
    setText(summary, missing === 0 && n > 0
      ? `all ${n} layers covered by ${stages.length} stage${stages.length === 1 ? "" : "s"}`
      : `${covered} of ${n} layers covered, ${missing} missing`);
    setText($("coverage-hint"), `${n} transformer layers`);
    const standby = swarm.standby || {};
    setText($("spares"), swarm.spares.length
      ? swarm.spares.map((s) => (standby[s] ? `${s} (ready for ${standby[s][0]}–${standby[s][1] - 1})` : s)).join(", ")
      : "none");
    // Stages no spare stands by for: losing their node stalls answers until a
    // replacement downloads their pieces.
    const bare = swarm.no_spare || [];
    show($("no-spare-box"), stages.length > 0 && bare.length > 0);
    setText($("no-spare"), bare.map(([a, b]) => `${a}–${b - 1}`).join(", "));
    return covered;
  }

  /** Every hosted model with its main chain; shown where the swarm serves more than one. */
  function renderModels(swarm) {
    const models = swarm.models || [];
    show($("models-panel"), models.length > 1);
    if (models.length <= 1) return;
    const names = new Map(swarm.nodes.map((n) => [n.node_id, n.name || n.node_id]));
    $("models-body").replaceChildren(...models.map((m) => {
      const chain = m.plan.length
        ? m.plan.map((s) => `${names.get(s.node_id) ?? s.node_id} ${layerText(s.layers[0], s.layers[1])}`).join(" → ")
        : `no chain: ${m.plan_error || "not placed yet"}`;
      return el("tr", { "data-testid": "model-row", "data-model": m.name },
        el("td", { className: "mono", "data-testid": "model-name-cell" }, m.name,
          m.default ? el("span", { className: "muted", text: " (default)" }) : null),
        el("td", { className: "num", text: m.n_layer }),
        el("td", { className: m.plan.length ? "" : "bad", "data-testid": "model-chain", text: chain }),
        el("td", { className: "num", "data-testid": "model-chains", text: m.chains }));
    }));
  }

  /** Stages spot checks found faulty, with the evidence (coordinator/server/spot_service.py). */
  function renderFaults() {
    const faulty = Object.entries((state.faults && state.faults.faulty) || {});
    show($("faults-panel"), faulty.length > 0);
    if (!faulty.length) return;
    const short = (digest) => (digest ? `${digest.slice(0, 12)}…` : "—");
    const holder = (node, digest) => el("td", { className: "mono", title: digest || "" },
      node || "—", el("br"), el("span", { className: "muted", text: short(digest) }));
    $("faults-body").replaceChildren(...faulty.map(([nodeId, e]) => el("tr", { "data-testid": "fault-row", "data-node-id": nodeId },
      el("td", { className: "mono", text: nodeId }),
      el("td", { className: "bad", "data-testid": "fault-reason", text: e.reason || "" }),
      el("td", { className: "mono", text: e.session || "" }),
      el("td", { className: "num", text: e.step_id ?? "" }),
      el("td", { text: e.positions ? `${e.positions[0]}–${e.positions[1] - 1}` : "" }),
      el("td", { className: "mono", title: e.claimed || "", text: short(e.claimed) }),
      holder(e.checker, e.checker_digest),
      holder(e.third, e.third_digest),
      el("td", {}, el("button", { type: "button", className: "small", "data-testid": "fault-clear", text: "Clear",
        title: "placed and renewed again", onclick: () => clearFault(nodeId) })))));
  }

  async function clearFault(nodeId) {
    if (!window.confirm(`Clear ${nodeId}?\n\nIt is placed again and its certificate renewed.`)) return;
    try {
      await api("DELETE", `/api/v1/faults/${encodeURIComponent(nodeId)}`);
    } catch (err) {
      if (err.status === 401) return relogin();
      toast(`Could not clear ${nodeId}: ${err.message}`);
    }
    refreshSoon(0);
  }

  function renderNodes(swarm, index) {
    const spares = new Set(swarm.spares);
    const order = (n) => (index.has(n.node_id) ? index.get(n.node_id) : 1000);
    const nodes = [...swarm.nodes].sort((a, b) => order(a) - order(b)
      || (a.health === "revoked") - (b.health === "revoked")
      || a.role.localeCompare(b.role) || a.node_id.localeCompare(b.node_id));

    const make = (node) => {
      const cells = {
        id: el("td", { className: "node-cell" },
          el("div", { className: "node-name", "data-testid": "node-name" }),
          el("div", { className: "mono node-id", "data-testid": "node-id" })),
        role: el("td", { "data-testid": "node-role" }),
        health: el("td", {},
          el("span", { className: "badge", "data-testid": "node-health" }),
          el("div", { className: "muted state-line", "data-testid": "node-paused-reason" }),
          el("div", { className: "muted state-line", "data-testid": "node-activity" }),
          el("div", { className: "progress", "data-testid": "node-progress" }, el("div", { className: "progress-fill" }))),
        layers: el("td", { "data-testid": "node-layers" }),
        vram: el("td", { className: "num", "data-testid": "node-vram" }),
        capacity: el("td", { className: "num", "data-testid": "node-capacity" }),
        compute: el("td", { className: "compute" },
          el("div", { "data-testid": "node-backend" }),
          el("div", { className: "muted", "data-testid": "node-device-memory" }),
          el("div", { className: "muted", "data-testid": "node-gpu-layers" }),
          el("div", { className: "muted", "data-testid": "node-sessions" })),
        address: el("td", { className: "mono", "data-testid": "node-address" }),
        path: el("td", {}, el("span", { className: "pill", "data-testid": "node-path" })),
        seen: el("td", { "data-testid": "node-last-seen" }),
        actions: el("td", { className: "actions" }),
      };
      const revoke = el("button", {
        type: "button", className: "danger small", "data-testid": "node-revoke", text: "Revoke",
        title: "revoke this node's certificate and drop it from the plan",
        onclick: () => revokeNode(node.node_id),
      });
      const rename = el("button", {
        type: "button", className: "small", "data-testid": "node-rename", text: "Rename",
        title: "name this node as you know it (at first, its invite's note)",
        onclick: () => renameNode(node.node_id),
      });
      const forget = el("button", {
        type: "button", className: "small", "data-testid": "node-forget", text: "Forget",
        title: "take this gone node off the registry and this page for good",
        onclick: () => forgetNode(node.node_id),
      });
      cells.actions.append(rename, revoke, forget);
      const row = el("tr", { "data-testid": "node-row", "data-node-id": node.node_id }, ...Object.values(cells));
      row._cells = cells;
      row._revoke = revoke;
      row._forget = forget;
      return row;
    };

    const update = (row, node) => {
      const c = row._cells;
      const [nameBox, idBox] = c.id.children;
      setText(nameBox, node.name || "");
      show(nameBox, Boolean(node.name));
      setText(idBox, node.node_id);
      setText(c.role, node.role);
      renderState(c.health, node);
      if (node.layers) {
        // Where the swarm serves several models, which one this stage is of.
        const of = (swarm.models || []).length > 1 && node.model ? `${node.model} ` : "";
        c.layers.replaceChildren(
          el("span", { className: "stage-dot", style: { background: colourOf(index.get(node.node_id) ?? 0) } }),
          `${of}${layerText(node.layers[0], node.layers[1])}`,
          el("span", { className: "muted", text: ` (${node.layers[1] - node.layers[0]})` }),
        );
      } else {
        setText(c.layers, spares.has(node.node_id) ? "spare" : "—");
      }
      setText(c.vram, gib(node.vram_cap_bytes));
      setText(c.capacity, gib(node.capacity_bytes));
      renderCompute(c.compute, node);
      setText(c.address, node.address || "—");
      const path = c.path.firstChild;
      path.className = `pill ${node.path}`;
      const rtt = node.stats && typeof node.stats.rtt_ms === "number" ? ` · ${node.stats.rtt_ms.toFixed(1)} ms` : "";
      const relinks = node.stats && typeof node.stats.relinks === "number" && node.stats.relinks > 0
        ? ` · re-established ${node.stats.relinks}×` : "";
      setText(path, (node.path || "—") + rtt + relinks);
      const seen = parseTime(node.last_seen);
      setText(c.seen, ago(seen));
      c.seen.title = fullTime(seen);
      row.classList.toggle("is-revoked", node.health === "revoked");
      show(row._revoke, node.health !== "revoked");
      show(row._forget, Boolean(node.forgettable));
    };

    syncRows($("swarm-body"), nodes, (n) => n.node_id, make, update, "No node has joined yet. Create a worker invite below.", 11);
  }

  const ACTIVITY_WORDS = {
    waiting: "waiting for a stage",
    standby: "spare: getting a stage ready",
    loading: "loading its stage",
    serving: "serving",
  };

  /** Its state (paused with the volunteer's reason is not stale or gone), and what it does: a download's progress. */
  function renderState(cell, node) {
    const [badge, reason, activity, progress] = cell.children;
    const stateName = node.state || node.health;
    badge.className = `badge ${stateName}`;
    setText(badge, stateName);
    badge.title = stateName === "paused" ? "the volunteer paused: heartbeats go on, no stage is served" : "";
    const paused = stateName === "paused" && node.paused;
    setText(reason, paused ? node.paused : "");
    show(reason, Boolean(paused));
    const live = !["gone", "revoked", "paused"].includes(stateName);
    const downloading = live && node.activity === "downloading";
    let words = live ? ACTIVITY_WORDS[node.activity] || "" : "";
    if (downloading) {
      const total = node.download_total_bytes;
      const pct = total > 0 ? Math.floor((100 * node.download_done_bytes) / total) : 0;
      words = total > 0
        ? `downloading ${pct}% (${(node.download_done_bytes / 2 ** 20).toFixed(0)} of ${(total / 2 ** 20).toFixed(0)} MiB)`
        : "downloading";
      progress.firstChild.style.width = `${pct}%`;
    }
    setText(activity, words);
    show(activity, Boolean(words));
    show(progress, downloading);
  }

  /** What runs the node's stage, worded as the tray's status window does (app/compute.py). */
  function renderCompute(cell, node) {
    const [backend, memory, layers, sessions] = cell.children;
    const serving = Boolean(node.backend);
    setText(backend, serving ? node.backend : "—");
    backend.title = serving ? node.backend : "no stage loaded";
    const used = (node.device_bytes_used / GIB).toFixed(1);
    setText(memory, node.device_cap_bytes > 0
      ? `${used} / ${(node.device_cap_bytes / GIB).toFixed(1)} GiB device memory`
      : `${used} GiB device memory`);
    setText(layers, `${node.gpu_layers}/${node.n_layers} layers on GPU`);
    show(memory, serving);
    show(layers, serving);
    // Free capacity as the stage's admission counts it (core/admission.py).
    const free = Math.max(0, node.kv_budget_bytes - node.kv_reserved_bytes);
    setText(sessions, `${node.sessions}/${node.max_sessions} sessions, `
      + `${(free / 2 ** 20).toFixed(0)} MiB KV free`);
    show(sessions, serving && node.max_sessions > 0);
  }

  function renderTimings(swarm, index) {
    const box = $("stage-timings");
    const byId = new Map(swarm.nodes.map((n) => [n.node_id, n]));
    const rows = swarm.plan.map((stage) => {
      const stats = (byId.get(stage.node_id) || {}).stats || {};
      const ms = typeof stats.compute_ms === "number" && Number.isFinite(stats.compute_ms) ? stats.compute_ms : null;
      return { stage, ms, steps: typeof stats.steps === "number" ? stats.steps : null };
    });
    if (!rows.length) {
      box.replaceChildren(el("div", { className: "empty", text: "No stages placed yet." }));
      return;
    }
    const max = Math.max(1, ...rows.map((r) => r.ms || 0));
    const items = rows.map(({ stage, ms, steps }) => {
      const who = el("div", { className: "who mono", title: stage.node_id },
        stage.node_id,
        el("small", { text: `layers ${layerText(stage.layers[0], stage.layers[1])}${steps !== null ? ` · ${steps} steps` : ""}` }));
      const fill = ms === null ? null : el("div", {
        className: "fill",
        style: { width: `${Math.max(1, (100 * ms) / max)}%`, background: colourOf(index.get(stage.node_id) ?? 0) },
      });
      const value = el("div", {
        className: ms === null ? "ms none" : "ms", "data-testid": "stage-ms",
        text: ms === null ? "no data" : `${ms < 10 ? ms.toFixed(2) : ms.toFixed(1)} ms`,
      });
      return el("div", { className: "timing", "data-testid": "stage-timing", "data-node-id": stage.node_id },
        who, el("div", { className: "track" }, fill), value);
    });
    const total = rows.reduce((sum, r) => sum + (r.ms || 0), 0);
    items.push(el("div", { className: "muted timing-total", text: `sum over stages: ${total.toFixed(1)} ms per batch` }));
    box.replaceChildren(...items);
  }

  // ---------------------------------------------------------------- timeline

  /** The swarm's story, newest first; node names as they are now (a rename applies to the past). */
  function renderTimeline() {
    const list = $("timeline");
    const nodes = state.swarm ? state.swarm.nodes : [];
    const names = new Map(nodes.map((n) => [n.node_id, n.name]));
    const last = state.events.length ? state.events[state.events.length - 1].id : 0;
    const key = `${last}:${state.events.length}:${JSON.stringify([...names])}`;
    if (key === state.timelineKey) return;
    state.timelineKey = key;
    if (!state.events.length) {
      list.replaceChildren(el("li", { className: "empty", text: "Nothing has happened yet." }));
      return;
    }
    list.replaceChildren(...[...state.events].reverse().map((e) => {
      const t = parseTime(e.at);
      const name = e.node_id ? names.get(e.node_id) || "" : "";
      const who = e.node_id
        ? el("span", { className: "event-node", "data-testid": "event-node", title: e.node_id },
          name ? `${name} ` : "", el("span", { className: "mono muted", text: e.node_id }))
        : el("span", { className: "event-node muted", "data-testid": "event-node", text: "swarm" });
      return el("li", { className: `event ${e.tone}`, "data-testid": "event", "data-kind": e.kind, "data-node-id": e.node_id },
        el("time", { className: "event-time", text: t === null ? "" : clock(t), title: fullTime(t) }),
        el("span", { className: `badge ${e.tone}`, "data-testid": "event-label", text: e.label }),
        who,
        el("span", { className: "event-detail", "data-testid": "event-detail", text: e.detail }));
    }));
  }

  // ---------------------------------------------------------------- prediction

  const rate = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));

  /** What the chain should deliver (coordinator/server/prediction.py): one request, the peak, each level. */
  function renderPrediction(swarm) {
    const p = swarm.prediction;
    setText($("prediction-note"), swarm.prediction_note || "");
    const body = $("prediction-body");
    if (!p) {
      setText($("stat-predicted"), "–");
      setText($("prediction-summary"), swarm.plan.length ? "waiting for every stage's step times" : "no plan yet");
      body.replaceChildren();
      return;
    }
    setText($("stat-predicted"), rate(p.one_request_tokens_per_s));
    const slow = p.slowest_node ? `; slowest stage ${p.slowest_node}` : "";
    setText($("prediction-summary"),
      `one request: ${rate(p.one_request_tokens_per_s)} tokens/s (a ${p.trip_ms.toFixed(1)} ms trip = `
      + `${p.compute_ms.toFixed(1)} compute + ${p.links_ms.toFixed(1)} links + ${p.hops_ms.toFixed(1)} hops${slow}); `
      + `at most ${rate(p.peak.tokens_per_s)} tokens/s in all at ${p.peak.requests} requests `
      + `(admission limit ${p.admission_limit})`);
    body.replaceChildren(...p.levels.map((lv) => {
      const bound = lv.bound.startsWith("stage ")
        ? `stage ${swarm.plan[Number(lv.bound.slice(6))]?.node_id ?? lv.bound.slice(6)}`
        : "the trip round the ring";
      return el("tr", { "data-testid": "prediction-row", "data-requests": lv.requests },
        el("td", { className: "num", text: lv.requests }),
        el("td", { className: "num", "data-testid": "prediction-total", text: rate(lv.tokens_per_s) }),
        el("td", { className: "num", text: rate(lv.per_request_tokens_per_s) }),
        el("td", { className: "num", text: lv.round_ms.toFixed(1) }),
        el("td", { className: "num", text: lv.groups > 1 ? `${lv.rows_per_step} (${lv.groups} groups)` : lv.rows_per_step }),
        el("td", { text: bound }));
    }));
  }

  // ---------------------------------------------------------------- throughput chart

  /** A round step for 4 grid lines above the largest bucket: whole tokens, 1/2/5-ish. */
  function niceStep(largest) {
    const raw = Math.max(largest, 4) / 4;
    const p = 10 ** Math.floor(Math.log10(raw));
    const unit = p >= 10 ? p / 2 : p;
    return Math.max(1, Math.ceil(raw / unit) * unit);
  }

  function throughputSeries(swarm) {
    const byBucket = new Map();
    for (const [key, tokens] of swarm.throughput) {
      const t = parseTime(key);
      if (t !== null) byBucket.set(Math.floor(t / BUCKET_MS) * BUCKET_MS, tokens);
    }
    const end = Math.floor(now() / BUCKET_MS) * BUCKET_MS;
    const series = [];
    for (let i = WINDOW_BUCKETS - 1; i >= 0; i -= 1) {
      const t = end - i * BUCKET_MS;
      series.push({ t, tokens: byBucket.get(t) || 0 });
    }
    return series;
  }

  function drawThroughput() {
    const canvas = $("throughput-chart");
    if (!canvas || !state.swarm) return;
    const series = throughputSeries(state.swarm);
    const total = series.reduce((s, b) => s + b.tokens, 0);
    const lastMinute = series.slice(-6).reduce((s, b) => s + b.tokens, 0);
    setText($("throughput-total"), `${total.toLocaleString()} tokens in 30 min`);
    setText($("stat-rate"), (lastMinute / 60).toFixed(lastMinute && lastMinute < 600 ? 2 : 1));

    const cssW = canvas.clientWidth;
    const cssH = canvas.clientHeight;
    if (!cssW || !cssH) return;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(cssW * dpr) || canvas.height !== Math.round(cssH * dpr)) {
      canvas.width = Math.round(cssW * dpr);
      canvas.height = Math.round(cssH * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);
    const css = getComputedStyle(document.body);
    const font = css.fontFamily;
    const ink = css.getPropertyValue("--ink-faint").trim() || "#7a8494";
    const grid = css.getPropertyValue("--line-soft").trim() || "#eef1f5";
    const accent = css.getPropertyValue("--accent").trim() || "#2456c7";

    const step = niceStep(Math.max(...series.map((b) => b.tokens)));
    const max = step * 4;
    ctx.font = `11px ${font}`;
    const labels = [0, 1, 2, 3, 4].map((i) => (step * i).toLocaleString());
    const left = Math.ceil(Math.max(...labels.map((l) => ctx.measureText(l).width))) + 12;
    const right = 8;
    const top = 8;
    const bottom = 22;
    const w = cssW - left - right;
    const h = cssH - top - bottom;
    if (w <= 10 || h <= 10) return;

    // horizontal grid and y labels
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i += 1) {
      const y = Math.round(top + h - (h * i) / 4) + 0.5;
      ctx.strokeStyle = i === 0 ? "#c9d0db" : grid;
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(left + w, y);
      ctx.stroke();
      ctx.fillStyle = ink;
      ctx.fillText(labels[i], left - 6, y);
    }

    // bars
    const slot = w / series.length;
    const barW = Math.max(1, slot - (slot > 3 ? 1 : 0));
    ctx.fillStyle = accent;
    series.forEach((b, i) => {
      if (!b.tokens) return;
      const bh = Math.max(1, (h * b.tokens) / max);
      ctx.fillRect(left + i * slot, top + h - bh, barW, bh);
    });

    // x labels every 5 minutes (fewer when narrow)
    const every = w < 360 ? 10 : 5;
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    ctx.fillStyle = ink;
    series.forEach((b, i) => {
      const d = new Date(b.t);
      if (d.getSeconds() !== 0 || d.getMinutes() % every !== 0) return;
      const x = left + i * slot + slot / 2;
      ctx.strokeStyle = "#c9d0db";
      ctx.beginPath();
      ctx.moveTo(Math.round(x) + 0.5, top + h);
      ctx.lineTo(Math.round(x) + 0.5, top + h + 4);
      ctx.stroke();
      const label = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      const half = ctx.measureText(label).width / 2;
      if (x - half >= 0 && x + half <= cssW) ctx.fillText(label, x, top + h + 6);
    });

    if (!total) {
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillStyle = ink;
      ctx.font = `13px ${font}`;
      ctx.fillText("no tokens generated in the last 30 minutes", left + w / 2, top + h / 2);
    }
  }

  // ---------------------------------------------------------------- invites

  function inviteStatus(inv) {
    if (inv.revoked) return "revoked";
    if (inv.uses_left <= 0) return "used up";
    const t = parseTime(inv.expires_at);
    if (t !== null && t <= now()) return "expired";
    return "active";
  }

  function renderInvites() {
    const make = (inv) => {
      const cells = {
        id: el("td", { className: "num" }),
        role: el("td", { "data-testid": "invite-role-cell" }),
        uses: el("td", { className: "num", "data-testid": "invite-uses-left" }),
        expires: el("td", { "data-testid": "invite-expires-at" }),
        note: el("td", { className: "invite-note" }),
        status: el("td", {}, el("span", { className: "badge", "data-testid": "invite-status" })),
        actions: el("td", { className: "actions" }),
      };
      const revoke = el("button", {
        type: "button", className: "danger small", "data-testid": "invite-revoke", text: "Revoke",
        title: "stop this code from being used", onclick: () => revokeInvite(inv.id),
      });
      cells.actions.append(revoke);
      const row = el("tr", { "data-testid": "invite-row", "data-invite-id": inv.id }, ...Object.values(cells));
      row._cells = cells;
      row._revoke = revoke;
      return row;
    };
    const update = (row, inv) => {
      const c = row._cells;
      const status = inviteStatus(inv);
      setText(c.id, inv.id);
      setText(c.role, inv.role);
      setText(c.uses, `${inv.uses_left} / ${inv.max_uses}`);
      const t = parseTime(inv.expires_at);
      setText(c.expires, t === null ? "—" : until(t));
      c.expires.title = fullTime(t);
      setText(c.note, inv.note || "");
      const badge = c.status.firstChild;
      badge.className = `badge ${status.replace(" ", "-")}`;
      setText(badge, status);
      row.classList.toggle("is-revoked", status !== "active");
      show(row._revoke, status === "active");
    };
    syncRows($("invite-body"), state.invites, (i) => i.id, make, update, "No invites yet.", 7);
  }

  async function createInvite(event) {
    event.preventDefault();
    const form = event.currentTarget;
    const error = $("invite-error");
    show(error, false);
    const uses = Number(form.elements.uses.value);
    const expires = form.elements.expires.value.trim();
    const problem = !Number.isInteger(uses) || uses < 1 || uses > 10000
      ? "Uses must be a whole number from 1 to 10000."
      : !/^[1-9][0-9]{0,5}[dhms]$/.test(expires) ? "Expires must be a number and a unit (d, h, m or s), e.g. 7d or 12h."
        : null;
    if (problem) {
      error.textContent = problem;
      show(error, true);
      return;
    }
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const invite = await api("POST", "/api/v1/invites", {
        role: form.elements.role.value, uses, expires, note: form.elements.note.value.trim(),
      });
      $("invite-code").value = invite.code || "";
      setText($("new-code-role"), invite.role);
      // What the CLI takes for each role (app/cli/main.py: worker --join, chat --join).
      setText($("new-code-command"), invite.role === "client"
        ? 'sangama chat --join CODE --prompt "Hello"' : "sangama worker --join CODE");
      show($("copied"), false);
      show($("new-code"), true);
      form.elements.note.value = "";
      await refreshInvites();
    } catch (err) {
      if (err.status === 401) return relogin();
      error.textContent = err.message;
      show(error, true);
    } finally {
      button.disabled = false;
    }
  }

  async function copyCode() {
    const area = $("invite-code");
    const note = $("copied");
    const code = area.value;
    try {
      if (!navigator.clipboard || !window.isSecureContext) throw new Error("no clipboard");
      await navigator.clipboard.writeText(code);
      note.textContent = "Copied to the clipboard.";
    } catch (err) {
      area.focus();
      area.select();
      area.setSelectionRange(0, code.length);
      let copied = false;
      try { copied = document.execCommand("copy"); } catch (e) { copied = false; }
      note.textContent = copied ? "Copied to the clipboard." : "Selected: press Ctrl+C (⌘C) to copy.";
    }
    show(note, true);
  }

  async function revokeInvite(id) {
    if (!window.confirm(`Revoke invite #${id}? Its code stops working at once.`)) return;
    try {
      await api("DELETE", `/api/v1/invites/${encodeURIComponent(id)}`);
    } catch (err) {
      if (err.status === 401) return relogin();
      toast(`Could not revoke invite #${id}: ${err.message}`);
    }
    await refreshInvites();
  }

  async function revokeNode(nodeId) {
    const question = `Revoke node ${nodeId}?\n\nIts certificate is revoked and it leaves the plan; `
      + "it needs a new invite to come back.";
    if (!window.confirm(question)) return;
    try {
      await api("POST", `/api/v1/nodes/${encodeURIComponent(nodeId)}/revoke`);
    } catch (err) {
      if (err.status === 401) return relogin();
      toast(`Could not revoke ${nodeId}: ${err.message}`);
    }
    refreshSoon(0);
  }

  async function renameNode(nodeId) {
    const node = state.swarm ? state.swarm.nodes.find((n) => n.node_id === nodeId) : null;
    const name = window.prompt(`A name for ${nodeId} (empty for none):`, node ? node.name : "");
    if (name === null) return;
    try {
      await api("POST", `/api/v1/nodes/${encodeURIComponent(nodeId)}/name`, { name: name.trim() });
    } catch (err) {
      if (err.status === 401) return relogin();
      toast(`Could not rename ${nodeId}: ${err.message}`);
    }
    refreshSoon(0);
  }

  async function forgetNode(nodeId) {
    const question = `Forget node ${nodeId}?\n\nIt leaves the registry and this page for good; `
      + "its certificate is revoked, and it needs a new invite to come back.";
    if (!window.confirm(question)) return;
    try {
      await api("DELETE", `/api/v1/nodes/${encodeURIComponent(nodeId)}`);
    } catch (err) {
      if (err.status === 401) return relogin();
      toast(`Could not forget ${nodeId}: ${err.message}`);
    }
    refreshSoon(0);
  }

  // ---------------------------------------------------------------- refresh loop

  function relogin() {
    window.location.replace("/"); // the server answers with the sign-in page
  }

  async function refreshInvites() {
    try {
      state.invites = await api("GET", "/api/v1/invites");
      renderInvites();
    } catch (err) {
      if (err.status === 401) relogin();
      else toast(`Could not load invites: ${err.message}`);
    }
  }

  function render() {
    const swarm = state.swarm;
    const index = stageIndex(swarm);
    renderBanner(swarm);
    renderAnswer(swarm);
    const covered = renderCoverage(swarm, index);
    renderSummary(swarm, covered);
    renderModels(swarm);
    renderFaults();
    renderNodes(swarm, index);
    renderTimeline();
    renderTimings(swarm, index);
    renderPrediction(swarm);
    drawThroughput();
    renderInvites();
  }

  async function refresh() {
    if (state.busy) return;
    state.busy = true;
    const updated = $("updated");
    try {
      const [swarm, invites, events, faults] = await Promise.all([
        api("GET", "/api/v1/swarm"), api("GET", "/api/v1/invites"), api("GET", "/api/v1/events?limit=200"),
        api("GET", "/api/v1/faults"),
      ]);
      state.faults = faults;
      state.swarm = swarm;
      state.invites = invites;
      state.events = events;
      state.failures = 0;
      render();
      updated.classList.remove("error");
      setText(updated, `updated ${clock(Date.now())}`);
    } catch (err) {
      if (err.status === 401) {
        relogin();
        return;
      }
      state.failures += 1;
      updated.classList.add("error");
      setText(updated, `update failed: ${err.message}`);
    } finally {
      state.busy = false;
      refreshSoon(REFRESH_MS);
    }
  }

  function refreshSoon(ms) {
    clearTimeout(state.timer);
    state.timer = setTimeout(refresh, ms);
  }

  function initDashboard() {
    $("invite-form").addEventListener("submit", createInvite);
    $("invite-copy").addEventListener("click", copyCode);
    $("logout").addEventListener("click", async () => {
      try { await api("POST", "/api/v1/logout"); } catch (err) { /* going to the sign-in page anyway */ }
      relogin();
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) refreshSoon(0);
    });
    const canvas = $("throughput-chart");
    if (window.ResizeObserver) new ResizeObserver(() => drawThroughput()).observe(canvas);
    else window.addEventListener("resize", drawThroughput);
    refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const page = document.body.dataset.page;
    if (page === "login") initLogin();
    else if (page === "dashboard") initDashboard();
  });
})();
